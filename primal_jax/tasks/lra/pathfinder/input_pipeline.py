"""Pathfinder as a task: seeded splits cached on disk, pixel tokens, and the LRA Pathfinder-32 InputPipeline.

Tokens: pixel intensity v in 0..255 becomes token v + 1 (vocab_size 257),
because token 0 is reserved for padding in `tasks.lra.tokens`. LRA feeds v itself
with a 256-entry vocabulary and no padding; the shift only renames the
embedding rows.
"""

from __future__ import annotations

import dataclasses
import types
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from primal_jax.data.cache import READ_ERRORS, cache_root, key_digest, read_npz, write_npz
from primal_jax.data.checks import check_nonnegative_int, check_positive_int, config_get, require_keys
from primal_jax.tasks.lra.pathfinder.generate import GENERATOR_VERSION, generate_pathfinder
from primal_jax.tasks.lra.pathfinder.geometry import DEFAULT_DIFFICULTY, IMAGE_SIZE, Geometry, level_geometry

CLASS_NAMES = ("disconnected", "connected")
VOCAB_SIZE = 257  # pixel v -> token v + 1; 0 is padding
# LRA splits each 200,000-image difficulty level 80/10/10 (lra_benchmarks/image/input_pipeline.py,
# get_pathfinder_base_datasets: `[:80%]`, `[80%:90%]`, `[90%:]`; base_pathfinder32_config.py:
# TRAIN_EXAMPLES = 160000, VALID_EXAMPLES = 20000). The Nystromformer preprocessing that the
# Primal-Attention release builds on splits the same 80/10/10.
DEFAULT_SPLIT_SIZES: Mapping[str, int] = types.MappingProxyType(
  {"train": 160_000, "validation": 20_000, "test": 20_000}
)
# Stream of randomness for the dataset, apart from the per-epoch orders drawn from the same seed.
PATHFINDER_STREAM = 11
_SPLIT_IDS = types.MappingProxyType({"train": 0, "validation": 1, "test": 2})


@dataclasses.dataclass(frozen=True, eq=False)
class PathfinderSource(Sequence):
  """A split as token examples {"tokens": int32 [size * size] (pixel + 1, row-major), "label", "index"}."""

  images: np.ndarray  # [n, size, size] uint8
  labels: np.ndarray  # [n] int

  def __len__(self) -> int:
    return len(self.labels)

  def __getitem__(self, i):  # integer indices only, as pipeline.Subset
    if isinstance(i, slice):
      raise TypeError("PathfinderSource supports integer indices only")
    i = int(i)
    tokens = self.images[i].reshape(-1).astype(np.int32) + 1
    return {"tokens": tokens, "label": int(self.labels[i]), "index": i}


def split_cache_path(
  cache_dir: str | Path | None, split: str, num_examples: int, seed: int, geometry: Geometry
) -> Path:
  """`<cache_dir>/pathfinder/<hash>.npz`, the hash over everything that fixes the split's images.

  cache_dir None is `cache.default_cache_dir()`.
  """
  key = {
    "version": GENERATOR_VERSION,
    "split": split,
    "num_examples": num_examples,
    "seed": seed,
    "geometry": dataclasses.asdict(geometry),
  }
  return cache_root(cache_dir) / "pathfinder" / f"{key_digest(key, 20)}.npz"


def load_or_generate_split(
  split: str,
  num_examples: int,
  *,
  seed: int,
  difficulty: str = DEFAULT_DIFFICULTY,
  cache_dir: str | Path | None = None,
  contour_length: int | None = None,
  num_distractors: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """(images, labels) of one split, generated once per parameter set and then read from the cache.

  Each split draws from its own stream (seed, PATHFINDER_STREAM, split id), so
  changing one split's size leaves the others' images alone. A cache file that
  does not read back as expected is regenerated, with a warning. The geometry
  is `level_geometry(difficulty, contour_length=..., num_distractors=...)`.
  """
  if split not in _SPLIT_IDS:
    raise ValueError(f"split must be one of {', '.join(_SPLIT_IDS)}, got {split!r}")
  geo = level_geometry(difficulty, contour_length=contour_length, num_distractors=num_distractors)
  path = split_cache_path(cache_dir, split, num_examples, seed, geo)
  if path.exists():
    try:
      data = read_npz(path)
      images, labels = data["images"], data["labels"]
      if (
        images.shape == (num_examples, geo.size, geo.size)
        and images.dtype == np.uint8
        and labels.shape == (num_examples,)
      ):
        return images, labels
      warnings.warn(f"{path} holds arrays of unexpected shapes; regenerating it", stacklevel=2)
    except READ_ERRORS as e:  # an unreadable cache file is regenerated
      warnings.warn(f"could not read {path} ({e!r}); regenerating it", stacklevel=2)
  images, labels = generate_pathfinder(
    num_examples, seed=(seed, PATHFINDER_STREAM, _SPLIT_IDS[split]), **dataclasses.asdict(geo)
  )
  write_npz(path, {"images": images, "labels": labels})  # atomic: concurrent writers write the same bytes
  return images, labels


def make_pathfinder_pipeline(data_config: Any, *, process_index: int = 0, process_count: int = 1):
  """The InputPipeline of LRA Pathfinder-32: 1,024 pixel tokens per image, classes ("disconnected", "connected").

  Reads from `data_config` (attributes, or keys of a mapping): batch_size,
  eval_batch_size, seed (the epoch orders), data_seed (the images; default
  `seed`), difficulty ("easy" | "intermediate" | "hard", default "hard", LRA's
  column), contour_length (dashes per target path; 0 or absent: the level's)
  and num_distractors (-1 or absent: the level's default), num_train /
  num_validation / num_test (defaults 160,000 / 20,000 /
  20,000, LRA's 80/10/10 split of 200,000 images; 0 leaves a validation or
  test split out), data_dir (cache root; default `cache.default_cache_dir()`),
  and seq_len if present, which must be 0 or 1,024. Every host generates (or
  reads) the same splits; with a shared cache, the first writer's file is read
  by the rest (the train loop lets process 0 go first).
  """
  from primal_jax.tasks.lra.tokens import token_pipeline  # needs grain; generation and the checker do not

  def get(key: str, default: Any = None) -> Any:
    return config_get(data_config, key, default)

  require_keys(data_config, ("batch_size", "eval_batch_size", "seed"), "pathfinder")
  seed = check_nonnegative_int(get("seed"), "seed")
  data_seed = seed if get("data_seed") is None else check_nonnegative_int(get("data_seed"), "data_seed")
  difficulty = get("difficulty", DEFAULT_DIFFICULTY)
  contour_length, num_distractors = get("contour_length", 0), get("num_distractors", -1)
  overrides = {
    "contour_length": None if contour_length in (0, None) else contour_length,
    "num_distractors": None if num_distractors in (-1, None) else num_distractors,
  }
  level_geometry(difficulty, **overrides)  # a bad level or override fails here, before any drawing
  seq_len = IMAGE_SIZE * IMAGE_SIZE
  if get("seq_len", 0) not in (0, None, seq_len):
    raise ValueError(
      f"Pathfinder-32 has {seq_len} tokens per image; seq_len must be 0 or {seq_len}, got {get('seq_len')!r}"
    )
  sizes = {split: get(f"num_{split}", default) for split, default in DEFAULT_SPLIT_SIZES.items()}
  check_positive_int(sizes["train"], "num_train")
  for split in ("validation", "test"):
    check_nonnegative_int(sizes[split], f"num_{split}")
  splits = {
    split: PathfinderSource(
      *load_or_generate_split(
        split, int(n), seed=data_seed, difficulty=difficulty, cache_dir=get("data_dir"), **overrides
      )
    )
    for split, n in sizes.items()
    if n > 0
  }
  return token_pipeline(
    "pathfinder",
    splits,
    CLASS_NAMES,
    VOCAB_SIZE,
    data_config,
    seq_len=seq_len,
    process_index=process_index,
    process_count=process_count,
  )
