"""One writer per run workdir: an exclusive `flock` on `<workdir>/run.lock` held for the whole run.

Why: two processes training into the same workdir interleave `metrics.jsonl`, overwrite each other's
`eval_history.json` and race inside orbax (one dies mid-save, the other finishes with a mixed record).
The second one must be refused before it touches anything.

Why `flock`: the kernel holds the lock for the open file and drops it when the process ends, however
it ends (`kill -9`, a crash, a lost node on a local disk), so a lock can never be left stale: there is
no pid to check and nothing to clean up. The file stays after the run; its content (pid, host, start
time, command) names the holder in the refusal message (and a sweep reads the start time to count an attempt
killed with it, `experiments.engine.attempts`); the lock itself is the kernel's.

Scope: a local or NFS filesystem (Linux maps `flock` to NFS byte-range locks); on a filesystem without
locks (some FUSE mounts) taking it fails with an error naming the file. Multi-host runs lock on the
primary process only: the others write checkpoint shards into the same directory by design.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import socket
import sys
from pathlib import Path

from primal_jax.errors import ConfigError

LOCK_FILE = "run.lock"


class WorkdirLockedError(ConfigError):
  """Another live process holds the workdir's lock; the message names it (a `ConfigError`: the CLI prints
  it as one line, since choosing a workdir in use is the user's to fix)."""


class WorkdirLock:
  """An exclusive, non-blocking lock on a workdir, as a context manager (`with WorkdirLock(workdir):`).

  Entering creates the workdir if needed and raises `WorkdirLockedError` at once if another process
  holds the lock. Not re-entrant: a second `WorkdirLock` on the same workdir in the same process is
  refused too (each opens its own file description), which is what a nested run should get.
  `lock_file`: the file's name in the workdir (a sweep claims one of its runs under another name).
  """

  def __init__(self, workdir: str | Path, lock_file: str = LOCK_FILE):
    self.path = Path(workdir) / lock_file
    self._fd: int | None = None

  def acquire(self) -> WorkdirLock:
    if self._fd is not None:
      raise RuntimeError(f"{self.path} is already held by this WorkdirLock")
    self.path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
      os.close(fd)
      if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        message = f"cannot lock {self.path} ({err.strerror}); does this filesystem support flock?"
        raise OSError(err.errno, message) from err
      raise WorkdirLockedError(
        f"workdir {self.path.parent} is in use by another run ({_holder(self.path)}); a second writer would mix "
        "its checkpoints and metrics. Wait for that run to end or stop it, or choose another --workdir"
      ) from None
    holder = {
      "pid": os.getpid(),
      "host": socket.gethostname(),
      "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
      "command": " ".join(sys.argv)[:500],
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
    self._fd = fd
    return self

  def release(self) -> None:
    """Drops the lock (the file stays: deleting it would let a waiting opener lock a dead inode)."""
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  @property
  def held(self) -> bool:
    return self._fd is not None

  def __enter__(self) -> WorkdirLock:
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


def lock_workdir(workdir: str | Path, *, primary: bool) -> contextlib.AbstractContextManager:
  """`WorkdirLock(workdir)` on the primary process; nothing on the others (they write shards, by design)."""
  return WorkdirLock(workdir) if primary else contextlib.nullcontext()


def lock_holder(workdir: str | Path, lock_file: str = LOCK_FILE) -> str | None:
  """Who holds `<workdir>/<lock_file>` now ('pid 123 on host h since ...: command'), or None if no live process
  does. A probe: it takes the lock and drops it at once, and writes nothing (a missing file is no holder)."""
  path = Path(workdir) / lock_file
  try:
    fd = os.open(path, os.O_RDWR)  # not O_RDONLY: NFS maps flock to byte-range locks, which need write access
  except FileNotFoundError:
    return None
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as err:
    if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
      raise OSError(err.errno, f"cannot lock {path} ({err.strerror}); does this filesystem support flock?") from err
    return _holder(path)
  else:
    fcntl.flock(fd, fcntl.LOCK_UN)
    return None
  finally:
    os.close(fd)


def _holder(path: Path) -> str:
  """'pid 123 on host h since <time>: <command>' from the lock file, or why it cannot say."""
  try:
    info = json.loads(path.read_text())
    return f"pid {info['pid']} on host {info['host']} since {info['started']}: {info['command']}"
  except (OSError, ValueError, KeyError, TypeError):  # the holder may be writing it right now
    return f"holder unknown: {path} does not name it yet"
