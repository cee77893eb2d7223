"""Data files that ship inside wheels on PyPI: `pip download` one wheel, read pinned members out of it.

Why: some real datasets (UEA problems in `aeon`, Wikipedia XML in `gensim`'s test data) are package data of
wheels on the package registry, which machines without general internet (CI included) can still reach.
`pip download --no-deps` runs the interpreter's own pip, so the registry configuration (index, mirrors,
certificates) is exactly the one `pip install` uses; nothing of the package is installed or imported.
Every member is checked against a SHA-256 pinned by the caller before anything is written.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path

from primal_jax.data.cache import DatasetFetchError, sha256_bytes

PIP_TIMEOUT_S = 900
_STDERR_TAIL_CHARS = 2000


def download_wheel(package: str, version: str, dest_dir: Path) -> Path:
  """Runs `python -m pip download --no-deps <package>==<version>` into dest_dir; returns the wheel path.

  Raises:
    DatasetFetchError: pip failed or timed out (with its stderr tail), or left no matching wheel.
  """
  cmd = [
    sys.executable,
    "-m",
    "pip",
    "download",
    "--no-deps",
    "--only-binary=:all:",
    "--disable-pip-version-check",
    f"{package}=={version}",
    "-d",
    str(dest_dir),
  ]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
  except subprocess.TimeoutExpired as e:
    raise DatasetFetchError(f"`{' '.join(cmd)}` did not finish within {PIP_TIMEOUT_S} s") from e
  if proc.returncode != 0:
    tail = (proc.stderr or proc.stdout or "")[-_STDERR_TAIL_CHARS:]
    raise DatasetFetchError(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}; stderr tail:\n{tail}")
  wheels = sorted(dest_dir.glob(f"{package}-{version}-*.whl"))
  if not wheels:
    found = ", ".join(p.name for p in dest_dir.iterdir()) or "nothing"
    raise DatasetFetchError(
      f"pip download succeeded but left no {package}-{version}-*.whl in {dest_dir} (found {found})"
    )
  return wheels[0]


def read_pinned_members(wheel: Path, pinned: Mapping[str, str]) -> dict[str, bytes]:
  """{member path: bytes} of every pinned member, all verified before any is returned.

  Raises:
    DatasetFetchError: the wheel is not a zip, a member is missing, or a checksum differs.
  """
  contents: dict[str, bytes] = {}
  try:
    with zipfile.ZipFile(wheel) as archive:
      members = set(archive.namelist())
      for member, sha in pinned.items():
        if member not in members:
          raise DatasetFetchError(f"{wheel.name} has no member {member}")
        data = archive.read(member)
        actual = sha256_bytes(data)
        if actual != sha:
          raise DatasetFetchError(
            f"checksum mismatch for {member} in {wheel.name}: sha256 {actual}, pinned {sha}; nothing was written"
          )
        contents[member] = data
  except zipfile.BadZipFile as e:
    raise DatasetFetchError(f"{wheel.name} is not a valid wheel (zip): {e}") from e
  return contents
