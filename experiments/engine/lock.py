"""A sweep's own lock (one process per shard spec and directory) and its claims on single runs (locks/<hash>.lock)."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from primal_jax.errors import ConfigError
from primal_jax.training.guards.workdir_lock import WorkdirLock, WorkdirLockedError, lock_holder

CLAIMS = "locks"  # <sweep>/locks/<hash>.lock: a sweep's claim on one run


class SweepLockedError(ConfigError):
  """Another sweep with the same shard spec is running in the workdir (one line for the CLI)."""


@contextlib.contextmanager
def sweep_lock(workdir: Path, index: int, count: int) -> Iterator[None]:
  """Held while shard `index` of `count` runs in `workdir`; a second holder is a SweepLockedError."""
  lock_name = "sweep.lock" if count == 1 else f"sweep.shard{index}of{count}.lock"
  with open(workdir / lock_name, "w") as lock:
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise SweepLockedError(
        f"--workdir={workdir}: another sweep with --shard={index}/{count} is running there (it holds "
        f"{workdir / lock_name}); wait for it to end, or run another shard"
      ) from None
    yield


@contextlib.contextmanager
def claim_run(workdir: Path, key: str) -> Iterator[str | None]:
  """Claims run `key` of the sweep in `workdir` for this process: yields None while held, or the holder (a line)
  when another sweep holds it (then nothing is claimed)."""
  claim = WorkdirLock(workdir / CLAIMS, lock_file=f"{key}.lock")
  try:
    claim.acquire()
  except WorkdirLockedError:
    yield lock_holder(workdir / CLAIMS, f"{key}.lock") or "holder unknown"
    return
  try:
    yield None
  finally:
    claim.release()
