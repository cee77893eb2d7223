"""ListOps as a task: cached train/validation/test splits and the LRA ListOps InputPipeline.

Generating LRA's 96k/2k/2k examples takes about a minute; the splits are
therefore stored under `listops_cache_path(...)` (named by a hash of
everything that fixes them) on first use and read back in well under a second
afterwards.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primal_jax.data.cache import READ_ERRORS, cache_root, key_digest, read_npz, write_atomically, write_npz
from primal_jax.data.checks import check_nonnegative_int, config_get, require_keys
from primal_jax.tasks.lra.listops.generate import (
  GENERATOR_VERSION,
  LRA_SIZES,
  ListOpsParams,
  ListOpsSplit,
  check_sizes,
  generate_listops_splits,
)
from primal_jax.tasks.lra.listops.text import CLASS_NAMES, VOCAB_SIZE

if TYPE_CHECKING:
  from primal_jax.data.core import InputPipeline

LRA_SEQ_LEN = 2000


def _cache_key(counts: Mapping[str, int], seed: int, params: ListOpsParams) -> dict[str, Any]:
  return {"format": GENERATOR_VERSION, "seed": seed, "sizes": dict(counts), **dataclasses.asdict(params)}


def listops_cache_path(
  sizes: Mapping[str, int] = LRA_SIZES,
  *,
  seed: int,
  params: ListOpsParams | None = None,
  cache_dir: str | Path | None = None,
) -> Path:
  """`<cache_dir>/listops/<hash of sizes, seed, params>/`; cache_dir defaults to `cache.default_cache_dir()`."""
  key = _cache_key(check_sizes(sizes), check_nonnegative_int(seed, "seed"), params or ListOpsParams())
  return cache_root(cache_dir) / "listops" / key_digest(key, 16)


def _read_cache(folder: Path, key: Mapping[str, Any]) -> dict[str, ListOpsSplit] | None:
  """The cached splits, or None when absent, unreadable or written for other parameters."""
  try:
    if json.loads((folder / "params.json").read_text()) != key:
      return None
    z = read_npz(folder / "splits.npz")
    splits = {
      split: ListOpsSplit(tokens=z[f"{split}_tokens"], offsets=z[f"{split}_offsets"], labels=z[f"{split}_labels"])
      for split in ("train", "validation", "test")
    }
  except READ_ERRORS:
    return None
  if any(len(splits[split]) != key["sizes"][split] for split in splits):
    return None
  return splits


def load_listops_splits(
  sizes: Mapping[str, int] = LRA_SIZES,
  *,
  seed: int,
  params: ListOpsParams | None = None,
  cache_dir: str | Path | None = None,
) -> dict[str, ListOpsSplit]:
  """`generate_listops_splits`, stored under `listops_cache_path(...)` on first use and read back afterwards.

  The folder holds `splits.npz` (per split: uint8 tokens back to back, int64
  offsets, uint8 labels) and `params.json` (what it was generated from). Both
  are written atomically, so a reader sees a whole cache or none, and a cache
  that is unreadable or does not match is regenerated. Generating LRA's
  96k/2k/2k examples takes about a minute; reading them back well under a
  second.
  """
  counts = check_sizes(sizes)
  seed = check_nonnegative_int(seed, "seed")
  params = params or ListOpsParams()
  key = _cache_key(counts, seed, params)
  folder = listops_cache_path(counts, seed=seed, params=params, cache_dir=cache_dir)
  cached = _read_cache(folder, key)
  if cached is not None:
    return cached
  splits = generate_listops_splits(counts, seed=seed, params=params)
  arrays = {}
  for split, data in splits.items():
    arrays.update({f"{split}_tokens": data.tokens, f"{split}_offsets": data.offsets, f"{split}_labels": data.labels})
  write_npz(folder / "splits.npz", arrays)  # params.json last: a folder with both was written whole
  write_atomically(folder / "params.json", json.dumps(key, sort_keys=True).encode())
  return splits


def make_listops_pipeline(data_config: Any, *, process_index: int = 0, process_count: int = 1) -> InputPipeline:
  """The LRA ListOps InputPipeline: 10 classes, VOCAB_SIZE token ids, batches padded to `seq_len`.

  Reads from `data_config` (defaults: LRA's): num_train 96000,
  num_validation 2000, num_test 2000 (0 leaves a split out), min_length 500,
  max_length 2000, max_depth 10, max_args 10, seq_len 2000 (0: the longest
  example), data_seed (default `seed`; fixes the dataset, while `seed` also
  fixes the epoch orders), data_dir (cache root, default
  `cache.default_cache_dir()`), and batch_size, eval_batch_size, seed.
  """
  from primal_jax.tasks.lra.tokens import token_pipeline  # needs grain; generation and evaluation do not

  def get(key: str, default: Any = None) -> Any:
    return config_get(data_config, key, default)

  require_keys(data_config, ("batch_size", "eval_batch_size", "seed"), "listops")
  sizes = {
    split: check_nonnegative_int(get(f"num_{split}", LRA_SIZES[split]), f"num_{split}")
    for split in ("train", "validation", "test")
  }
  if sizes["train"] == 0:
    raise ValueError("num_train must be a positive integer, got 0")
  params = ListOpsParams(
    min_length=get("min_length", 500),
    max_length=get("max_length", 2000),
    max_depth=get("max_depth", 10),
    max_args=get("max_args", 10),
  )
  seed = check_nonnegative_int(get("seed"), "seed")
  data_seed = seed if get("data_seed") is None else check_nonnegative_int(get("data_seed"), "data_seed")
  splits = load_listops_splits(sizes, seed=data_seed, params=params, cache_dir=get("data_dir"))
  splits = {split: data for split, data in splits.items() if len(data)}
  seq_len = check_nonnegative_int(get("seq_len", LRA_SEQ_LEN), "seq_len")
  if seq_len == 0:
    seq_len = int(max(data.lengths.max() for data in splits.values()))
  return token_pipeline(
    "listops",
    splits,
    CLASS_NAMES,
    VOCAB_SIZE,
    data_config,
    seq_len=seq_len,
    process_index=process_index,
    process_count=process_count,
  )
