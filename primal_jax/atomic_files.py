"""Files that are replaced whole or not at all, and JSON that names its path when it does not read back.

Why: a run's records (`config.json`, `eval_history.json`, `summary.json`, checkpoint checksums) and the
data cache are rewritten while other processes may read them, and a crash or a full disk mid-write must
not leave half a file that a later resume trips over. `write_atomically` writes a temporary file in the
target's folder, fsyncs it, then `os.replace`s it over the target (atomic on POSIX filesystems), so a
reader sees the old file or the whole new one. A file damaged anyway (a copy cut short, a disk error) is
a `DamagedFileError` naming its path from `read_json`, instead of a bare `JSONDecodeError`.

No imports from the rest of the library: data, training and tools all use it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


class DamagedFileError(ValueError):
  """A file that exists but does not read back as what it should hold; the message names its path."""


def write_atomically(path: str | Path, data: bytes | Callable[[BinaryIO], None]) -> None:
  """Writes `data` (bytes, or a function writing to a binary file) via a temporary file and os.replace.

  The temporary file lives in the target's folder, so the rename is atomic and readers see the old
  file, or the whole new one, never a partial one; it is fsynced first, so after a power loss the
  target holds the new bytes or the old ones, not an empty file.
  """
  path = Path(path)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      if isinstance(data, bytes):
        f.write(data)
      else:
        data(f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise


def write_json_atomically(path: str | Path, obj: Any, **dumps_kwargs) -> None:
  """`obj` as JSON (one trailing newline) at `path`, written with `write_atomically`."""
  write_atomically(Path(path), (json.dumps(obj, **dumps_kwargs) + "\n").encode("utf-8"))


def read_json(path: str | Path, what: str = "file", *, remedy: str = "") -> Any:
  """The JSON value in `path`; a file that is not valid UTF-8 JSON is a `DamagedFileError` naming it.

  Args:
    path: the file (it must exist: a missing file is the caller's case, FileNotFoundError here).
    what: what the file is, for the message ("the run's config").
    remedy: what the user can do about it, appended to the message.
  """
  path = Path(path)
  raw = path.read_bytes()
  try:
    return json.loads(raw.decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as err:
    detail = "empty" if not raw.strip() else f"{type(err).__name__}: {err}"
    hint = f" {remedy}" if remedy else ""
    raise DamagedFileError(
      f"{path} ({what}, {len(raw)} bytes) is damaged and cannot be read ({detail}). It is written atomically, "
      f"so it was changed or cut short outside primal_jax (a partial copy, a full disk, a disk error).{hint}"
    ) from None
