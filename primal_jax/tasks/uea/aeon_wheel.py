"""UEA `.ts` files obtained from the `aeon` wheel on PyPI, pinned by SHA-256.

Why a wheel (see `pypi_wheel`): the UEA archive itself is hosted outside the package registries,
which some machines (CI included) cannot reach, while the `aeon` wheel on PyPI
ships a few UEA problems as package data under `aeon/datasets/data/`. Fetching
the wheel with `pip download --no-deps` and extracting only the needed members
gives the real JapaneseVowels (the default UEA experiment) and BasicMotions with
nothing but the registry, without installing aeon or its dependencies.

Every extracted file is checked against a SHA-256 pinned here, so a different
wheel build can never change the data under an experiment; a mismatch writes
nothing. Files land atomically (`cache.write_atomically`) in the UEA
archive layout, `<cache_dir>/<Name>/<Name>_TRAIN.ts` and `_TEST.ts`, so
`archive.load_uea_split(cache_dir, name, split)` reads them directly.
"""

from __future__ import annotations

import subprocess  # noqa: F401  (tests patch `aeon_wheel.subprocess.run`, the one pip call goes through)
import tempfile
import warnings
from pathlib import Path

from primal_jax.data.cache import DatasetFetchError, cache_root, sha256_file, write_atomically  # noqa: F401 (re-exported)
from primal_jax.data.sources import pypi_wheel
from primal_jax.tasks.uea.archive import load_uea_split
from primal_jax.tasks.uea.ts_format import Missing, TimeSeriesDataset

AEON_VERSION = "1.6.0"
# Informational: sha256 of aeon-1.6.0-py3-none-any.whl as served by PyPI. Not
# enforced, since the member checksums below are what the data depends on.
AEON_WHEEL_SHA256 = "d05227086706f80111ac5fee8de4d5d3115bb3bcfd1c786c8629393055816409"

# name -> {file name: sha256}; members live at aeon/datasets/data/<name>/<file name> in the wheel.
AEON_DATASETS: dict[str, dict[str, str]] = {
  "JapaneseVowels": {
    "JapaneseVowels_TRAIN.ts": "68a430eabd919cc77f40b1f5f3bc0dcafacc1486bca9260785aeb7d262cc78cd",
    "JapaneseVowels_TEST.ts": "b3d41d6a0ca3bcad3afb9ca7d4365382aa51341e2e58bae2a574babdda5b9462",
  },
  "BasicMotions": {
    "BasicMotions_TRAIN.ts": "8dc43cc6306cb679c888c01e26f91772ac4441a916da43bac8b79734a538b9d6",
    "BasicMotions_TEST.ts": "79213102bc6fca1a398ad98ce1185dff0208fa3d1465e687f48288946b0ff8dc",
  },
}


def member_path(name: str, file_name: str) -> str:
  """Path of a dataset file inside the aeon wheel."""
  return f"aeon/datasets/data/{name}/{file_name}"


def _pinned(name: str) -> dict[str, str]:
  if name not in AEON_DATASETS:
    raise ValueError(f"no pinned aeon dataset {name!r}; available: {', '.join(sorted(AEON_DATASETS))}")
  return AEON_DATASETS[name]


def _download_wheel(version: str, dest_dir: Path) -> Path:
  """The aeon wheel of `version` in dest_dir (`pypi_wheel.download_wheel`)."""
  return pypi_wheel.download_wheel("aeon", version, dest_dir)


def _cached_ok(dataset_dir: Path, pinned: dict[str, str]) -> bool:
  return all((dataset_dir / f).is_file() and sha256_file(dataset_dir / f) == sha for f, sha in pinned.items())


def fetch_aeon_dataset(name: str, cache_dir: str | Path | None = None, *, version: str = AEON_VERSION) -> Path:
  """Ensures `<cache_dir>/<name>/<name>_{TRAIN,TEST}.ts` hold the pinned files; returns that directory.

  Cached files with the pinned checksums are used as they are (no pip call).
  Otherwise the aeon wheel is downloaded into a temporary directory, the
  members are extracted and all of them verified before any is written.
  A cached file with a different checksum is replaced, with a warning.

  Raises:
    ValueError: `name` is not in AEON_DATASETS.
    DatasetFetchError: pip failed (with its stderr tail), a member is missing
      from the wheel, or a member's checksum differs from the pinned one.
  """
  pinned = _pinned(name)
  cache_dir = cache_root(cache_dir)
  dataset_dir = cache_dir / name
  if _cached_ok(dataset_dir, pinned):
    return dataset_dir

  members = {member_path(name, file_name): sha for file_name, sha in pinned.items()}
  with tempfile.TemporaryDirectory(prefix="primal_jax_aeon_") as tmp:
    wheel = _download_wheel(version, Path(tmp))
    read = pypi_wheel.read_pinned_members(wheel, members)
  contents = {file_name: read[member_path(name, file_name)] for file_name in pinned}

  dataset_dir.mkdir(parents=True, exist_ok=True)
  for file_name, data in contents.items():
    target = dataset_dir / file_name
    if target.is_file() and sha256_file(target) == pinned[file_name]:
      continue
    if target.exists():
      warnings.warn(
        f"replacing {target}: its sha256 differs from the pinned aeon=={version} file", RuntimeWarning, stacklevel=2
      )
    write_atomically(target, data)
  return dataset_dir


def fetch_japanese_vowels(cache_dir: str | Path | None = None) -> Path:
  """The JapaneseVowels directory (`JapaneseVowels_TRAIN.ts`, `_TEST.ts`), fetched if needed."""
  return fetch_aeon_dataset("JapaneseVowels", cache_dir)


def load_aeon_split(
  name: str, split: str, cache_dir: str | Path | None = None, *, missing: Missing = "raise"
) -> TimeSeriesDataset:
  """fetch_aeon_dataset then load_uea_split: one split of a pinned dataset, ready to pad."""
  dataset_dir = fetch_aeon_dataset(name, cache_dir)
  return load_uea_split(dataset_dir.parent, name, split, missing=missing)
