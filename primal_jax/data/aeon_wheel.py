"""UEA `.ts` files obtained from the `aeon` wheel on PyPI, pinned by SHA-256.

Why a wheel: the UEA archive itself is hosted outside the package registries,
which some machines (CI included) cannot reach, while the `aeon` wheel on PyPI
ships a few UEA problems as package data under `aeon/datasets/data/`. Fetching
the wheel with `pip download --no-deps` and extracting only the needed members
gives the real JapaneseVowels (the default UEA experiment) and BasicMotions with
nothing but the registry, without installing aeon or its dependencies.

Every extracted file is checked against a SHA-256 pinned here, so a different
wheel build can never change the data under an experiment; a mismatch writes
nothing. Files land atomically (`cache.write_atomically`) in the UEA
archive layout, `<cache_dir>/<Name>/<Name>_TRAIN.ts` and `_TEST.ts`, so
`uea_archive.load_uea_split(cache_dir, name, split)` reads them directly.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

from primal_jax.data.cache import DatasetFetchError, cache_root, sha256_bytes, sha256_file, write_atomically
from primal_jax.data.ts_format import Missing, TimeSeriesDataset
from primal_jax.data.uea_archive import load_uea_split

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

_PIP_TIMEOUT_S = 900
_STDERR_TAIL_CHARS = 2000


def member_path(name: str, file_name: str) -> str:
  """Path of a dataset file inside the aeon wheel."""
  return f"aeon/datasets/data/{name}/{file_name}"


def _pinned(name: str) -> dict[str, str]:
  if name not in AEON_DATASETS:
    raise ValueError(f"no pinned aeon dataset {name!r}; available: {', '.join(sorted(AEON_DATASETS))}")
  return AEON_DATASETS[name]


def _download_wheel(version: str, dest_dir: Path) -> Path:
  """Runs `python -m pip download --no-deps aeon==<version>` into dest_dir; returns the wheel path.

  A subprocess of the running interpreter's pip, so the registry configuration
  (index, mirrors, certificates) is exactly the one `pip install` would use.
  """
  cmd = [
    sys.executable,
    "-m",
    "pip",
    "download",
    "--no-deps",
    "--only-binary=:all:",
    "--disable-pip-version-check",
    f"aeon=={version}",
    "-d",
    str(dest_dir),
  ]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S, check=False)
  except subprocess.TimeoutExpired as e:
    raise DatasetFetchError(f"`{' '.join(cmd)}` did not finish within {_PIP_TIMEOUT_S} s") from e
  if proc.returncode != 0:
    tail = (proc.stderr or proc.stdout or "")[-_STDERR_TAIL_CHARS:]
    raise DatasetFetchError(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}; stderr tail:\n{tail}")
  wheels = sorted(dest_dir.glob(f"aeon-{version}-*.whl"))
  if not wheels:
    found = ", ".join(p.name for p in dest_dir.iterdir()) or "nothing"
    raise DatasetFetchError(f"pip download succeeded but left no aeon-{version}-*.whl in {dest_dir} (found {found})")
  return wheels[0]


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

  contents: dict[str, bytes] = {}
  with tempfile.TemporaryDirectory(prefix="primal_jax_aeon_") as tmp:
    wheel = _download_wheel(version, Path(tmp))
    try:
      with zipfile.ZipFile(wheel) as archive:
        members = set(archive.namelist())
        for file_name, sha in pinned.items():
          member = member_path(name, file_name)
          if member not in members:
            raise DatasetFetchError(f"{wheel.name} has no member {member}; expected it in aeon=={version}")
          data = archive.read(member)
          actual = sha256_bytes(data)
          if actual != sha:
            raise DatasetFetchError(
              f"checksum mismatch for {member} in {wheel.name}: sha256 {actual}, pinned {sha}; nothing was written"
            )
          contents[file_name] = data
    except zipfile.BadZipFile as e:
      raise DatasetFetchError(f"{wheel.name} is not a valid wheel (zip): {e}") from e

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
