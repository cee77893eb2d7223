"""`run_sweep`: trains a sweep's unfinished runs (inline or one child process each), then aggregates."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from experiments.engine import tuning
from experiments.engine.aggregate import aggregate, result_line, write_results
from experiments.engine.attempts import attempt, earlier_attempts, log_attempt, log_killed_attempt
from experiments.engine.lock import claim_run, sweep_lock
from experiments.engine.records import RESULT_FILE, rerun_folder, run_origin, write_record
from experiments.engine.spec import PlannedRun, Sweep, config_hash, plan, select
from primal_jax.errors import ConfigError
from primal_jax.launch import host_allocator
from primal_jax.training.config_schema import problems
from primal_jax.training.guards.workdir_lock import lock_holder

CHILD_MODULE = "primal_jax.cli.train"  # what `python -m experiments.main` runs


def _prepare_run_dir(run_dir: Path, config, log) -> None:
  """An unfinished run without per-evaluation checkpoints restarts in an empty workdir (see module doc)."""
  if run_dir.exists() and not config.get("checkpoint_on_eval", True):
    log(f"  {run_dir.name}: unfinished and not resumable (checkpoint_on_eval=False); restarting from scratch")
    shutil.rmtree(run_dir)
  run_dir.mkdir(parents=True, exist_ok=True)


# On Linux the child first asks for a SIGTERM when the sweep process dies (prctl PR_SET_PDEATHSIG = 1),
# so killing the sweep never leaves an orphan training in a run directory that a restarted sweep reuses:
# the SIGTERM makes it save and exit. Done after exec, in the child, because a `preexec_fn` would run
# Python between fork and exec of a multithreaded (JAX) process.
_CHILD_CODE = (
  "import ctypes, runpy, signal; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
  f"runpy.run_module({CHILD_MODULE!r}, run_name='__main__', alter_sys=True)"
)


def _follow(path: Path, offset: int, proc: subprocess.Popen, log) -> None:
  """Passes the complete lines appended to `path` after `offset` to `log` until `proc` exits."""
  with open(path, errors="replace") as f:
    f.seek(offset)
    pending = ""
    while True:
      exited = proc.poll() is not None
      pending += f.read()
      *lines, pending = pending.split("\n")
      for line in lines:
        log(f"  | {line}")
      if exited:
        break
      time.sleep(0.1)
    if pending:
      log(f"  | {pending}")


def _run_subprocess(
  planned: PlannedRun, run_dir: Path, cache_dir: Path | None, log, echo: bool, allocator: str = "auto"
) -> dict:
  """Train in `python -m primal_jax.cli.train` (what experiments.main runs), with host allocator `allocator`.

  The child writes straight to `train.log` (not through a pipe), so it can still save and exit cleanly
  when the sweep process dies; `echo` follows that file.
  """
  start = ["-c", _CHILD_CODE] if sys.platform.startswith("linux") else ["-m", CHILD_MODULE]
  command = [sys.executable, *start, *planned.flags(run_dir)]
  env = {**os.environ, "PYTHONUNBUFFERED": "1"}
  if allocator == "auto":  # tcmalloc preloaded here where installed (auto's choice), so no child re-executes itself
    env = host_allocator.auto_environment(env)
  else:  # the child's own --allocator (it re-executes itself with that one preloaded, or refuses)
    command.append(f"--allocator={allocator}")
  if cache_dir is not None:
    env.update(JAX_COMPILATION_CACHE_DIR=str(cache_dir), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5")
  log_path = run_dir / "train.log"
  with open(log_path, "ab") as out:
    offset = out.tell()
    proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
  log(f"  {planned.key}: pid {proc.pid}")
  if echo:
    _follow(log_path, offset, proc, log)
  code = proc.wait()
  if code == 143:
    return {"preempted": True}
  if code != 0:
    raise RuntimeError(f"exit status {code}; see {run_dir / 'train.log'}")
  saved = json.loads((run_dir / "config.json").read_text())
  if config_hash(saved) != planned.key:  # an override that did not survive the flag round trip
    raise RuntimeError(f"the child's config.json hashes to {config_hash(saved)}, not {planned.key}")
  return json.loads((run_dir / "summary.json").read_text())


def _run_inline(planned: PlannedRun, run_dir: Path, log, echo: bool) -> dict:
  from primal_jax.training.loop import train_and_evaluate

  with open(run_dir / "train.log", "a") as logfile:

    def print_fn(line: str) -> None:
      logfile.write(line + "\n")
      logfile.flush()
      if echo:
        log(f"  | {line}")

    return train_and_evaluate(planned.config, run_dir, print_fn=print_fn)


def run_sweep(
  sweep: Sweep,
  workdir: str | Path,
  *,
  mode: str = "inline",
  only: Sequence[str] | None = None,
  shard: tuple[int, int] = (0, 1),
  compilation_cache: bool = True,
  echo: bool = False,
  print_fn: Callable[[str], None] = print,
  allocator: str = "auto",
  unclean_in: str | Path | None = None,
) -> dict:
  """Runs every unfinished run of `sweep` (of the tables in `only`), then aggregates.

  Args:
    mode: "inline" (sequentially in this process) or "subprocess" (one process per run);
      "aggregate" runs nothing and only rewrites the tables.
    shard: (index, count): run only every count-th planned run, starting at index, so that count processes
      (an array job, several accelerators) share one sweep without touching the same run. Each takes its own
      lock; each rewrites the tables from the runs finished so far, so aggregate once all have ended.
    compilation_cache: subprocess mode points the children's JAX persistent compilation cache at
      `<workdir>/jax_cache` (inline mode: the caller sets `jax_compilation_cache_dir`, a process setting).
    echo: pass every line of every run's output to `print_fn` (always in `runs/<hash>/train.log`).
    allocator: subprocess mode's host allocator for each run (`--allocator` of primal_jax.cli.train; "auto":
      tcmalloc where installed). Inline mode trains under whatever this process runs with (experiments.sweep
      re-executes itself with its `--allocator`).
    unclean_in: a sweep directory: train only the runs (of `only`) whose finished record there is legacy (no
      commit) or from a dirty tree (`records.run_origin`), into `workdir`, which must be its `records.rerun_folder`
      (the tables read a clean rerun in place of the original, `records.record_dir`); the original is never
      touched. Refused (ConfigError, before anything is written) where it is not a sweep directory, `workdir` is
      not its rerun folder, or, to train, the checkout is not a clean commit.

  Returns:
    {"ran": [keys], "skipped": [keys], "busy": {key: holder}, "pilot": {key: why}, "failed": {key: error},
    "preempted": bool, "rows": [Row]}. A failed run is reported and the sweep goes on; a SIGTERM stops it after
    saving the run in progress. A run in use by another process (another sweep's claim, or a live `run.lock`) is
    "busy": left alone, never deleted or reset. A run a tuned table's pilot does not need (yet) is "pilot"
    (`Sweep.pilot`: its pilot is unfinished, or chose another value).
  """
  if mode not in ("inline", "subprocess", "aggregate"):
    raise ValueError(f"mode must be inline, subprocess or aggregate, got {mode!r}")
  workdir = Path(workdir)
  planned_runs = plan(sweep.runs)  # overrides applied: a key the config lacks, a value of another type refused
  if mode != "aggregate":
    check_planned(planned_runs)  # every run's config, before the sweep directory is touched
  chosen = select(planned_runs, only)
  if unclean_in is not None:
    check_rerun(workdir, unclean_in, train=mode != "aggregate")
    chosen = unclean_runs(chosen, unclean_in, print_fn)
  (workdir / "runs").mkdir(parents=True, exist_ok=True)
  index, count = shard
  if not (isinstance(count, int) and isinstance(index, int) and count >= 1 and 0 <= index < count):
    raise ValueError(f"shard must be (index, count) with 0 <= index < count, got {shard!r}")
  todo = chosen[index::count]
  report = {"ran": [], "skipped": [], "busy": {}, "pilot": {}, "failed": {}, "preempted": False}

  def choices(table: str) -> list[tuning.Choice]:  # a piloted table's choices from the records as they stand now
    return tuning.sweep_choices(sweep, aggregate(sweep, workdir, planned_runs), table)

  with sweep_lock(workdir, index, count):
    for i, planned in enumerate(todo if mode != "aggregate" else []):
      run_dir = workdir / "runs" / planned.key
      if (run_dir / RESULT_FILE).exists():
        report["skipped"].append(planned.key)
        continue
      if (why := tuning.pilot_skip(sweep, planned.runs, choices)) is not None:  # Sweep.pilot: not trained now
        report["pilot"][planned.key] = why
        print_fn(f"  {planned.key}: not trained: {why}")
        continue
      with claim_run(workdir, planned.key) as holder:
        if holder is not None:
          _busy(report, planned.key, f"another sweep is working on it ({holder})", print_fn)
          continue
        _run_claimed(
          planned,
          f"run {i + 1}/{len(todo)}",
          workdir,
          run_dir,
          mode,
          compilation_cache,
          echo,
          report,
          print_fn,
          allocator=allocator,
          after_run=sweep.after_run,
        )
      if report["preempted"]:
        break
  report["rows"] = write_results(sweep, workdir, planned_runs, print_fn=print_fn)
  return report


def check_rerun(workdir: Path, unclean_in: str | Path, *, train: bool = True) -> None:
  """Refuses, one line each, a `--unclean_in` that is not a sweep directory, a `workdir` that is not its rerun
  folder (where the tables look), and, when runs would `train`, a checkout that is not a clean commit (its rerun
  would be as unclean as the record it replaces)."""
  from primal_jax import provenance

  source = Path(unclean_in)
  if not (source / "runs").is_dir():
    raise ConfigError(f"--unclean_in={unclean_in}: not a sweep directory (no runs/ folder in it)")
  expected = rerun_folder(source)
  if Path(workdir).resolve() != expected.resolve():
    raise ConfigError(
      f"--unclean_in={unclean_in}: its reruns go to --workdir={expected} (where the tables read them), "
      f"got --workdir={workdir}"
    )
  commit, dirty = provenance.checkout()
  if train and (commit is None or dirty is not False):
    state = "not a git checkout" if commit is None else f"commit {commit[:9]} with uncommitted changes"
    raise ConfigError(
      f"--unclean_in={unclean_in}: the checkout is {state}; a rerun trains at a clean commit (commit, or run "
      "from a clean `git worktree`)"
    )


def unclean_runs(
  chosen: Sequence[PlannedRun], unclean_in: str | Path, print_fn: Callable[[str], None] = print
) -> list[PlannedRun]:
  """The runs of `chosen` whose finished record in the sweep directory `unclean_in` is not clean (legacy or dirty,
  `records.run_origin`); one line says how many of the chosen runs that is, and how many have no record there."""
  runs = Path(unclean_in) / "runs"
  finished = [p for p in chosen if (runs / p.key / RESULT_FILE).exists()]
  unclean = [p for p in finished if not run_origin(runs / p.key).clean]
  print_fn(
    f"--unclean_in={unclean_in}: {len(unclean)} of the {len(chosen)} selected runs have a legacy or dirty record "
    f"there (train those); {len(finished) - len(unclean)} clean, {len(chosen) - len(finished)} not finished there"
  )
  return unclean


def check_planned(planned_runs: Mapping[str, PlannedRun]) -> None:
  """Every planned run's resolved config through the training binary's one validation pass
  (`primal_jax.training.config_schema`): a ConfigError naming the first refused run (its table cell, seed and
  config) and its refusals, so a sweep with one bad override trains nothing and writes nothing."""
  for planned in planned_runs.values():
    if found := problems(planned.config):
      run = planned.runs[0]
      where = f"run {run.cell.table} {dict(run.cell.labels)} seed {run.seed} ({run.config})"
      raise ConfigError(f"{where}: {'; '.join(found)}")


def _busy(report: dict, key: str, why: str, print_fn: Callable[[str], None]) -> None:
  report["busy"][key] = why
  print_fn(f"  {key}: skipped, in use: {why}; a sweep never deletes or resets a run that a live process holds")


def _run_claimed(
  planned: PlannedRun,
  heading: str,
  workdir: Path,
  run_dir: Path,
  mode: str,
  compilation_cache: bool,
  echo: bool,
  report: dict,
  print_fn: Callable[[str], None],
  allocator: str = "auto",
  after_run: Mapping[str, Callable[[Path], str]] | None = None,
) -> None:
  """Trains one run that this process has claimed (`run_sweep`), recording the outcome in `report`, then calls the
  `after_run` function of each of its tables (`Sweep.after_run`)."""
  if (run_dir / RESULT_FILE).exists():  # another sweep finished it after this one looked
    report["skipped"].append(planned.key)
    return
  if (holder := lock_holder(run_dir)) is not None:  # a training process (not a sweep's) holds the run itself
    _busy(report, planned.key, f"its run.lock is held by {holder}", print_fn)
    return
  labels = "; ".join(f"{r.cell.table} {dict(r.cell.labels)} seed {r.seed} {r.protocol}" for r in planned.runs)
  print_fn(f"{heading} {planned.key}: {labels}")
  _prepare_run_dir(run_dir, planned.config, print_fn)
  if (killed := log_killed_attempt(run_dir)) is not None:
    print_fn(
      f"  {planned.key}: an attempt since {killed['lock_started']} ended unlogged (killed); counted as "
      f"{killed['seconds']:.0f}s, from its run.lock start to its last metrics line"
    )
  start = time.monotonic()
  try:
    if mode == "inline":
      summary = _run_inline(planned, run_dir, print_fn, echo)
    else:
      cache = workdir / "jax_cache" if compilation_cache else None
      summary = _run_subprocess(planned, run_dir, cache, print_fn, echo, allocator)
  except Exception as err:  # one broken run must not cost the rest of the grid
    log_attempt(run_dir, time.monotonic() - start, "failed")
    report["failed"][planned.key] = f"{type(err).__name__}: {err}"
    print_fn(f"  {planned.key} FAILED: {type(err).__name__}: {err}")
    return
  if summary.get("preempted"):
    log_attempt(run_dir, time.monotonic() - start, "preempted")
    report["preempted"] = True
    print_fn(f"  {planned.key}: terminated; rerun the sweep to continue")
    return
  attempts = [*earlier_attempts(run_dir), attempt(run_dir, time.monotonic() - start, "finished")]
  wall = sum(entry["seconds"] for entry in attempts)
  write_record(
    run_dir / RESULT_FILE,
    {
      "key": planned.key,
      "wall_seconds": wall,
      "attempts": attempts,
      "mode": mode,
      "command": planned.command,
      "runs": [{"cell": dataclasses.asdict(r.cell), "seed": r.seed, "protocol": r.protocol} for r in planned.runs],
      "summary": summary,
      "config": planned.config.to_dict(),
    },
  )
  report["ran"].append(planned.key)
  print_fn(f"  done in {wall:.0f}s: " + result_line(planned, summary))
  for table in dict.fromkeys(r.cell.table for r in planned.runs):
    if (after := (after_run or {}).get(table)) is None:
      continue
    try:
      print_fn(f"  {planned.key} ({table}): {after(run_dir)}")
    except Exception as err:  # the record stands; the analysis is redone by hand (its message says how)
      report["failed"][planned.key] = f"after the run ({table}): {type(err).__name__}: {err}"
      print_fn(f"  {planned.key} FAILED after the run ({table}): {type(err).__name__}: {err}")
