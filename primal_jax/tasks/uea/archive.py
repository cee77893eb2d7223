"""The UEA multivariate archive's layout: which `.ts` files hold a problem's splits, loaded and cross-checked.

The archive (`Multivariate2018_ts`, the paper's Table 1) keeps every problem
as `<root>/<Name>/<Name>_TRAIN.ts` and `<Name>_TEST.ts`; `ts_format` parses
one file, this module finds and pairs them, with errors that name what is
missing and how to get it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from primal_jax.errors import MissingFileError
from primal_jax.tasks.uea.ts_format import Missing, TimeSeriesDataset, read_ts

SPLITS: dict[str, str] = {"train": "TRAIN", "test": "TEST"}

_LAYOUT_HINT = (
  "Expected the UEA Multivariate2018_ts archive layout: <root>/<Name>/<Name>_TRAIN.ts and "
  "<root>/<Name>/<Name>_TEST.ts. JapaneseVowels and BasicMotions can be fetched from PyPI with "
  "primal_jax.tasks.uea.aeon_wheel.fetch_aeon_dataset(name, cache_dir)."
)


def uea_split_paths(root: str | Path, name: str) -> dict[str, Path]:
  """{"train": ..., "test": ...} paths of a problem in the Multivariate2018_ts archive layout."""
  return {split: Path(root) / name / f"{name}_{tag}.ts" for split, tag in SPLITS.items()}


def load_uea_split(root: str | Path, name: str, split: str, *, missing: Missing = "raise") -> TimeSeriesDataset:
  """Loads `<root>/<name>/<name>_TRAIN.ts` (split="train") or `_TEST.ts` (split="test").

  The returned dataset is named `name`, not by the file's @problemName, since
  some distributed files carry a stale or decorated one.
  """
  key = split.lower()
  if key not in SPLITS:
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  paths = uea_split_paths(root, name)
  if not paths[key].is_file():
    absent = [str(p) for p in paths.values() if not p.is_file()]
    hint = ""
    if Path(root).is_dir():
      near = sorted(p.name for p in Path(root).iterdir() if p.is_dir() and p.name.lower() == name.lower())
      if near and near != [name]:
        hint = f" (directory names are case-sensitive: found {', '.join(near)})"
    raise MissingFileError(f"UEA problem {name!r}, split {split!r}: missing {', '.join(absent)}{hint}. {_LAYOUT_HINT}")
  dataset = read_ts(paths[key], missing=missing)
  return dataclasses.replace(dataset, name=name)


def load_uea(root: str | Path, name: str, *, missing: Missing = "raise") -> tuple[TimeSeriesDataset, TimeSeriesDataset]:
  """(train, test) of one problem, checked to share class names and channels.

  Label indices are only comparable across splits when both files declare the
  same @classLabel list in the same order, so a mismatch is an error here.
  """
  train = load_uea_split(root, name, "train", missing=missing)
  test = load_uea_split(root, name, "test", missing=missing)
  if train.class_names != test.class_names:
    raise ValueError(
      f"UEA problem {name!r}: train and test declare different @classLabel lists "
      f"{train.class_names} and {test.class_names}; label indices would not agree"
    )
  if train.num_channels != test.num_channels:
    raise ValueError(f"UEA problem {name!r}: train has {train.num_channels} channels, test has {test.num_channels}")
  return train, test
