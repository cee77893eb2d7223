"""Where fetched and generated data live on disk, and how it is written and verified.

One cache root for everything (`default_cache_dir()`: `$PRIMAL_JAX_DATA`, else
`~/.cache/primal_jax`), so a machine or a test redirects all data with one
variable. Every write goes through `write_atomically` (`primal_jax.atomic_files`:
a temporary file in the same folder, fsynced, then `os.replace`), so a reader,
another host or a second process never sees half a file, and concurrent writers
of the same bytes are harmless.

Fetched files are pinned by SHA-256 (`sha256_file`, `sha256_bytes`). Generated
data sets (ListOps, Pathfinder) are stored as compressed `.npz` under a name
hashed from everything that fixes their contents (`key_digest`), and read back
with `read_npz`; a file that does not read back is the caller's cue to
regenerate it (`READ_ERRORS`).
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from primal_jax.atomic_files import write_atomically  # noqa: F401 (the data modules import it from here)

CACHE_ENV = "PRIMAL_JAX_DATA"
# What reading a damaged or truncated .npz (or its side files) can raise; all mean "regenerate".
READ_ERRORS: tuple[type[BaseException], ...] = (
  OSError,
  ValueError,
  KeyError,
  EOFError,
  zipfile.BadZipFile,
  zlib.error,
)


class DatasetFetchError(RuntimeError):
  """Data could not be downloaded, lacked a member, or a member failed its checksum."""


def default_cache_dir() -> Path:
  """`$PRIMAL_JAX_DATA` if set, else `~/.cache/primal_jax`."""
  env = os.environ.get(CACHE_ENV)
  return Path(env).expanduser() if env else Path.home() / ".cache" / "primal_jax"


def cache_root(cache_dir: str | Path | None) -> Path:
  """`cache_dir` with `~` expanded, or `default_cache_dir()` when None."""
  return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def default_data_dir() -> Path:
  """`<default_cache_dir()>/tfds`: the TFDS data_dir of prepared datasets (UEA and the LRA catalog ones)."""
  return default_cache_dir() / "tfds"


def sha256_bytes(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
  """Hex SHA-256 of a file, read in 1 MiB blocks (fetched archives can be large)."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def key_digest(key: Mapping[str, Any], length: int) -> str:
  """The first `length` hex digits of the SHA-256 of `key` as sorted JSON: a cache name for what fixes the data."""
  return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:length]


def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
  """Compressed `.npz` of `arrays` at `path` (its folder created), written atomically."""
  path.parent.mkdir(parents=True, exist_ok=True)
  write_atomically(path, lambda f: np.savez_compressed(f, **arrays))


def read_npz(path: Path) -> dict[str, np.ndarray]:
  """Every array of the `.npz` at `path`, read into memory; raises one of READ_ERRORS if it does not read back."""
  with np.load(path) as z:
    return {name: z[name] for name in z.files}
