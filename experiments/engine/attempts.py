"""A run's attempts: `<run dir>/attempts.json` lists the attempts that ended without a result, so the result's
`wall_seconds` of a resumed run is the sum of all its attempts.

The sweep logs an attempt when its training ends (stopped, preempted, failed, finished). An attempt whose sweep was
killed along with its training (SIGKILL, a session or machine that ended) logs nothing; the next attempt finds it
by its `run.lock`: the lock names the start of the last training process, and no logged attempt has that start.
Its seconds are counted from that start to the last line of `metrics.jsonl` (a lower bound: the steps after the
last logged line, and the start-up before the lock, are not seen), with outcome "killed".
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from experiments.engine.records import write_record
from primal_jax.atomic_files import read_json
from primal_jax.training.guards.workdir_lock import LOCK_FILE
from primal_jax.training.metrics import METRICS_FILE

ATTEMPTS_FILE = "attempts.json"


def earlier_attempts(run_dir: Path) -> list[dict]:
  path = run_dir / ATTEMPTS_FILE
  return read_json(path, "a run's earlier attempts") if path.exists() else []


def lock_started(run_dir: Path) -> str | None:
  """The start time (ISO, UTC) that the run's `run.lock` names: its last training process's; None without one."""
  try:
    return json.loads((run_dir / LOCK_FILE).read_text())["started"]
  except (OSError, ValueError, KeyError, TypeError):
    return None


def attempt(run_dir: Path, seconds: float, outcome: str) -> dict:
  """An attempt that this sweep saw end: its seconds, outcome and the start its training wrote to `run.lock`."""
  return {"seconds": seconds, "outcome": outcome, "lock_started": lock_started(run_dir)}


def log_attempt(run_dir: Path, seconds: float, outcome: str) -> None:
  write_record(run_dir / ATTEMPTS_FILE, [*earlier_attempts(run_dir), attempt(run_dir, seconds, outcome)])


def _last_wall_time(path: Path) -> float | None:
  last = None
  for line in path.read_text(errors="replace").splitlines():
    try:
      last = float(json.loads(line)["wall_time"])
    except (ValueError, KeyError, TypeError):  # a line cut by the kill
      continue
  return last


def killed_attempt(run_dir: Path) -> dict | None:
  """The attempt that ended without being logged (see the module doc), or None: no lock or metrics, the lock's
  attempt is logged, or an earlier entry predates `lock_started` (then it cannot be told apart, and is not guessed)."""
  started = lock_started(run_dir)
  metrics = run_dir / METRICS_FILE
  if started is None or not metrics.exists():
    return None
  if any(entry.get("lock_started", None) in (None, started) for entry in earlier_attempts(run_dir)):
    return None
  start = datetime.datetime.fromisoformat(started).timestamp()
  last = _last_wall_time(metrics)
  if last is None or last < start:  # nothing logged since that start
    return None
  return {
    "seconds": last - start,
    "outcome": "killed",
    "lock_started": started,
    "measured": "from the start in run.lock to the last metrics.jsonl line (a lower bound)",
  }


def log_killed_attempt(run_dir: Path) -> dict | None:
  """Logs `killed_attempt(run_dir)` if there is one (call it before the next training starts) and returns it."""
  if (killed := killed_attempt(run_dir)) is not None:
    write_record(run_dir / ATTEMPTS_FILE, [*earlier_attempts(run_dir), killed])
  return killed
