"""Grids of training runs: plan them, run the unfinished ones, aggregate over seeds.

A sweep file (`experiments/sweeps/uea.py`) defines `get_sweep(arg) -> Sweep`: a list of `Run`s, each a
config file with its `:arg`, overrides, a seed, a protocol and the table `Cell` it reports to. Every run's
fully resolved config is hashed (`config_hash`), so the same run listed in several tables (Table 1's
PrimalFormer is also a Table 6 cell) is trained once and reported in each.

Layout of a sweep directory:
  runs/<hash>/               the run's workdir (config.json, metrics.jsonl, summary.json, train.log, ...)
  runs/<hash>/result.json    written atomically when the run has finished; its presence means "done"
  results.md, results.csv    the aggregated tables; plots from `Sweep.plot`
  jax_cache/                 JAX's persistent compilation cache (runs of equal shapes compile once)
  sweep.lock                 held while a sweep runs here (sweep.shardIofN.lock for a shard)
  locks/<hash>.lock          held by the sweep process working on that run, from its check to its result

Two sweeps on one directory (another `--shard` spec, a second terminal) never share a run: a sweep claims a run
(locks/<hash>.lock) before it looks at its directory, and skips, with one line naming the holder, a run claimed
by another sweep or whose `run.lock` a live training process holds (`workdir_lock`); it never deletes or resets
such a run directory.

Why this survives a kill: nothing but `result.json` marks a run as done, so a killed sweep, started again,
skips every finished run and redoes only the one in progress. That run resumes from its latest checkpoint
when its config checkpoints every evaluation (`checkpoint_on_eval`), otherwise it restarts from scratch in
an emptied workdir (its best-validation state, needed for the honest protocol, was never saved).
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import fcntl
import hashlib
import io
import json
import logging
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from primal_jax.atomic_files import read_json
from primal_jax.errors import ConfigError
from primal_jax.launch import host_allocator
from primal_jax.training.config_args import load_config, load_module
from primal_jax.training.guards.workdir_lock import WorkdirLock, WorkdirLockedError, lock_holder

# Overrides per protocol. "release": the release's (test evaluated at every epoch, the best reported).
# "honest": model selected on a stratified 20% of train, test evaluated once on that state.
PROTOCOLS: Mapping[str, Mapping[str, Any]] = types.MappingProxyType(
  {
    "release": types.MappingProxyType({"test_eval": "every_eval"}),
    "honest": types.MappingProxyType(
      {"data.val_fraction": 0.2, "best_metric": "validation/accuracy", "test_eval": "best_validation"}
    ),
    # Offline RL: the config's own protocol (rollouts on validation env seeds select, test seeds report once).
    "rollouts": types.MappingProxyType({}),
    # The config's own held-out validation split selects, test is evaluated once on that state (vision `short`).
    "own_validation": types.MappingProxyType({}),
  }
)
# The summary entry holding each protocol's test accuracy.
PROTOCOL_METRIC: Mapping[str, str] = types.MappingProxyType(
  {
    "release": "best_test",
    "honest": "test_at_best_validation",
    "rollouts": "test_at_best_validation",
    "own_validation": "test_at_best_validation",
  }
)
PROTOCOL_TITLE: Mapping[str, str] = types.MappingProxyType(
  {
    "release": "release: best test over epochs",
    "honest": "honest: test at best validation",
    "rollouts": "normalised score on test env seeds at the best validation rollouts",
    "own_validation": "test at the best validation (the config's own split)",
  }
)
RESULT_FILE = "result.json"
CLAIMS = "locks"  # <sweep>/locks/<hash>.lock: a sweep's claim on one run
log = logging.getLogger(__name__)


class SweepLockedError(ConfigError):
  """Another sweep with the same shard spec is running in the workdir (one line for the CLI)."""


CHILD_MODULE = "primal_jax.training.cli"  # what `python -m experiments.main` runs


@dataclasses.dataclass(frozen=True)
class Cell:
  """One row of a results table: `labels` are its (column, value) pairs, `paper` the paper's accuracy (%)."""

  table: str
  labels: tuple[tuple[str, str], ...]
  paper: float | None = None


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run of a sweep. `overrides`: a mapping (or pairs) of dotted config keys to values, applied last."""

  config: str  # "path/to/config.py[:arg]"
  cell: Cell
  seed: int = 0
  protocol: str = "release"
  overrides: tuple[tuple[str, Any], ...] = ()

  def __post_init__(self):
    if self.protocol not in PROTOCOLS:
      raise ConfigError(f"{self.cell}: protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")
    if isinstance(self.overrides, Mapping):
      object.__setattr__(self, "overrides", tuple(self.overrides.items()))

  def all_overrides(self, config) -> dict[str, Any]:
    """Protocol, seeds (`seed` and, where the config has one, `data.seed`) and the run's own overrides."""
    seeds = {"seed": self.seed, **({"data.seed": self.seed} if "seed" in config.get("data", {}) else {})}
    return {**PROTOCOLS[self.protocol], **seeds, **dict(self.overrides)}


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A sweep file's grid. `titles`: table name -> heading; `plot(rows, out_dir)` -> written paths.

  `value_name` says what the tables' numbers are and `digits` how many decimals they show.
  """

  runs: tuple[Run, ...]
  titles: Mapping[str, str] = dataclasses.field(default_factory=dict)
  plot: Callable[[list[Row], Path], list[Path]] | None = None
  notes: str = ""
  value_name: str = "Accuracy (%) on the test split"
  digits: int = 1


@dataclasses.dataclass
class PlannedRun:
  """A distinct config of the sweep and every `Run` (table cell) that it stands for."""

  key: str
  config: Any  # locked ConfigDict
  overrides: dict[str, Any]
  runs: list[Run]

  def flags(self, workdir: str | Path) -> list[str]:
    """The flags of `python -m experiments.main` that train this run in `workdir`."""
    flags = [f"--config={self.runs[0].config}", f"--workdir={workdir}"]
    return flags + [f"--config.{k}={_flag_value(v)}" for k, v in self.overrides.items()]

  @property
  def command(self) -> str:
    """The equivalent single-run command line, for results and READMEs."""
    return "python -m experiments.main " + shlex.join(self.flags("WORKDIR"))


@dataclasses.dataclass(frozen=True)
class Row:
  """One table row under one protocol: test accuracies (%) of its finished seeds."""

  cell: Cell
  protocol: str
  accuracies: tuple[float, ...]
  planned: int
  wall_seconds: tuple[float, ...]
  keys: tuple[str, ...] = ()  # the runs' directories under runs/ (stored_rows), in seed order
  unscored: tuple[tuple[str, int], ...] = ()  # (key, seed) of finished runs without the protocol's value

  @property
  def n(self) -> int:
    return len(self.accuracies)

  @property
  def mean(self) -> float:
    return float(np.mean(self.accuracies)) if self.accuracies else math.nan

  @property
  def std(self) -> float:
    """Sample standard deviation (ddof=1) over seeds; nan below two seeds."""
    return float(np.std(self.accuracies, ddof=1)) if self.n > 1 else math.nan


def load_sweep(spec: str | Path) -> Sweep:
  """The Sweep of `path/to/sweep.py[:arg]`."""
  path, _, arg = str(spec).partition(":")
  try:
    module = load_module(path, kind="sweep")
  except SyntaxError as err:
    raise ConfigError(f"sweep file {path}, line {err.lineno}: {err.msg}") from err
  if not hasattr(module, "get_sweep"):
    raise ConfigError(f"sweep file {path} defines no get_sweep(arg)")
  return module.get_sweep(arg or None)


# Fields added to configs after runs of them were recorded, at the value that does what those runs did: at that
# value they are left out of the hash, so the recorded runs keep their keys (and are not trained again).
# `resume_step` and `accept_config_changes` steer one invocation (primal_jax.training.guards.run_config.RUN_CONTROL).
HASH_NEUTRAL: Mapping[str, Any] = types.MappingProxyType(
  {"data.missing": "raise", "resume_step": -1, "accept_config_changes": "", "init_from_min_loaded": 0.5}
)


def config_hash(config) -> str:
  """sha256 prefix of the config's canonical JSON (sorted keys, tuples as lists), so a config and its
  `config.json` round trip hash alike; equal iff every setting is equal (`HASH_NEUTRAL` fields aside)."""
  tree = copy.deepcopy(config.to_dict() if hasattr(config, "to_dict") else config)
  for key, neutral in HASH_NEUTRAL.items():
    *parents, leaf = key.split(".")
    node = tree
    for part in parents:
      node = node.get(part) if isinstance(node, Mapping) else None
    if isinstance(node, Mapping) and leaf in node and node[leaf] == neutral:
      del node[leaf]
  canonical = json.dumps(tree, sort_keys=True, separators=(",", ":"), default=str)
  return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _set(config, key: str, value) -> None:
  *parents, leaf = key.split(".")
  target = config
  for part in parents:
    if part not in target:
      raise ConfigError(f"override {key!r}: the config has no field {part!r}")
    target = target[part]
  if leaf not in target:
    raise ConfigError(f"override {key!r}: the config has no field {leaf!r}")
  target[leaf] = value


def resolve(run: Run):
  """The locked ConfigDict of `run`: its config file, then protocol, seeds and overrides."""
  config = load_config(run.config, lock=False)
  for key, value in run.all_overrides(config).items():
    _set(config, key, value)
  config.lock()
  return config


def plan(runs: Iterable[Run]) -> dict[str, PlannedRun]:
  """Distinct configs by hash, in first-listed order; a run listed in several tables appears once."""
  planned: dict[str, PlannedRun] = {}
  for run in runs:
    config = resolve(run)
    key = config_hash(config)
    if key not in planned:
      planned[key] = PlannedRun(key, config, run.all_overrides(config), [run])
      continue
    first = planned[key].runs[0]
    if first.protocol != run.protocol:
      raise ConfigError(f"{run.cell} ({run.protocol}) and {first.cell} ({first.protocol}) resolve to the same config")
    planned[key].runs.append(run)
  return planned


def _select(planned: Mapping[str, PlannedRun], only: Sequence[str] | None) -> list[PlannedRun]:
  if not only:
    return list(planned.values())
  tables = {run.cell.table for p in planned.values() for run in p.runs}
  unknown = sorted(set(only) - tables)
  if unknown:
    raise ConfigError(f"unknown table(s) {unknown}; this sweep has {sorted(tables)}")
  return [p for p in planned.values() if any(run.cell.table in only for run in p.runs)]


def _flag_value(value) -> str:
  return str(value) if not isinstance(value, bool) else str(value).lower()


def _write_json(path: Path, obj) -> None:
  """Atomic: a reader sees the old file, or none, or the whole new one."""
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(json.dumps(obj, indent=1, default=str) + "\n")
  os.replace(tmp, path)


def read_result(run_dir: Path) -> dict | None:
  """The run's result.json, None if it has none; a damaged one is a DamagedFileError naming it."""
  path = Path(run_dir) / RESULT_FILE
  return read_json(path, "a finished run's record") if path.exists() else None


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


def _run_subprocess(planned: PlannedRun, run_dir: Path, cache_dir: Path | None, log, echo: bool) -> dict:
  """Train in `python -m primal_jax.training.cli` (what experiments.main runs).

  The child writes straight to `train.log` (not through a pipe), so it can still save and exit cleanly
  when the sweep process dies; `echo` follows that file.
  """
  start = ["-c", _CHILD_CODE] if sys.platform.startswith("linux") else ["-m", CHILD_MODULE]
  command = [sys.executable, *start, *planned.flags(run_dir)]
  # tcmalloc preloaded here where installed (--allocator=auto's choice), so no child re-executes itself
  env = host_allocator.auto_environment({**os.environ, "PYTHONUNBUFFERED": "1"})
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

  Returns:
    {"ran": [keys], "skipped": [keys], "busy": {key: holder}, "failed": {key: error}, "preempted": bool,
    "rows": [Row]}. A failed run is reported and the sweep goes on; a SIGTERM stops it after saving the run in
    progress. A run in use by another process (another sweep's claim, or a live `run.lock`) is "busy": left
    alone, never deleted or reset.
  """
  if mode not in ("inline", "subprocess", "aggregate"):
    raise ValueError(f"mode must be inline, subprocess or aggregate, got {mode!r}")
  workdir = Path(workdir)
  (workdir / "runs").mkdir(parents=True, exist_ok=True)
  planned_runs = plan(sweep.runs)
  index, count = shard
  if not (isinstance(count, int) and isinstance(index, int) and count >= 1 and 0 <= index < count):
    raise ValueError(f"shard must be (index, count) with 0 <= index < count, got {shard!r}")
  todo = _select(planned_runs, only)[index::count]
  report = {"ran": [], "skipped": [], "busy": {}, "failed": {}, "preempted": False}
  lock_name = "sweep.lock" if count == 1 else f"sweep.shard{index}of{count}.lock"
  with open(workdir / lock_name, "w") as lock:
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise SweepLockedError(
        f"--workdir={workdir}: another sweep with --shard={index}/{count} is running there (it holds "
        f"{workdir / lock_name}); wait for it to end, or run another shard"
      ) from None
    for i, planned in enumerate(todo if mode != "aggregate" else []):
      run_dir = workdir / "runs" / planned.key
      if (run_dir / RESULT_FILE).exists():
        report["skipped"].append(planned.key)
        continue
      claim = WorkdirLock(workdir / CLAIMS, lock_file=f"{planned.key}.lock")
      try:
        claim.acquire()
      except WorkdirLockedError:
        holder = lock_holder(workdir / CLAIMS, f"{planned.key}.lock") or "holder unknown"
        _busy(report, planned.key, f"another sweep is working on it ({holder})", print_fn)
        continue
      try:
        _run_claimed(
          planned, f"run {i + 1}/{len(todo)}", workdir, run_dir, mode, compilation_cache, echo, report, print_fn
        )
      finally:
        claim.release()
      if report["preempted"]:
        break
  report["rows"] = write_results(sweep, workdir, planned_runs, print_fn=print_fn)
  return report


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
) -> None:
  """Trains one run that this process has claimed (`run_sweep`), recording the outcome in `report`."""
  if (run_dir / RESULT_FILE).exists():  # another sweep finished it after this one looked
    report["skipped"].append(planned.key)
    return
  if (holder := lock_holder(run_dir)) is not None:  # a training process (not a sweep's) holds the run itself
    _busy(report, planned.key, f"its run.lock is held by {holder}", print_fn)
    return
  labels = "; ".join(f"{r.cell.table} {dict(r.cell.labels)} seed {r.seed} {r.protocol}" for r in planned.runs)
  print_fn(f"{heading} {planned.key}: {labels}")
  _prepare_run_dir(run_dir, planned.config, print_fn)
  start = time.monotonic()
  try:
    if mode == "inline":
      summary = _run_inline(planned, run_dir, print_fn, echo)
    else:
      cache = workdir / "jax_cache" if compilation_cache else None
      summary = _run_subprocess(planned, run_dir, cache, print_fn, echo)
  except Exception as err:  # one broken run must not cost the rest of the grid
    report["failed"][planned.key] = f"{type(err).__name__}: {err}"
    print_fn(f"  {planned.key} FAILED: {type(err).__name__}: {err}")
    return
  if summary.get("preempted"):
    report["preempted"] = True
    print_fn(f"  {planned.key}: terminated; rerun the sweep to continue")
    return
  wall = time.monotonic() - start
  _write_json(
    run_dir / RESULT_FILE,
    {
      "key": planned.key,
      "wall_seconds": wall,
      "mode": mode,
      "command": planned.command,
      "runs": [{"cell": dataclasses.asdict(r.cell), "seed": r.seed, "protocol": r.protocol} for r in planned.runs],
      "summary": summary,
      "config": planned.config.to_dict(),
    },
  )
  report["ran"].append(planned.key)
  print_fn(f"  done in {wall:.0f}s: " + _result_line(planned, summary))


def summary_value(summary: dict, protocol: str) -> float | None:
  """The number a table shows for a run: test accuracy in %, the D4RL normalised score or test bits per byte
  (language models), None if the summary has no such entry."""
  entry = summary.get(PROTOCOL_METRIC[protocol]) if isinstance(summary, Mapping) else None
  if not isinstance(entry, Mapping):
    return None
  if "accuracy" in entry:
    return 100.0 * entry["accuracy"]
  for name in ("normalized_score", "bits_per_byte"):
    if name in entry:
      return float(entry[name])
  return None


def unscored_line(key: str, cell: Cell, seed: int | str, protocol: str) -> str:
  """The line that flags a finished run whose summary lacks its protocol's entry (left out of its row)."""
  labels = " ".join(f"{k}={v}" for k, v in cell.labels)
  return (
    f"run {key} ({cell.table} {labels}, seed {seed}, {protocol}) has no `{PROTOCOL_METRIC[protocol]}` in its "
    f"summary: not counted (see runs/{key}/train.log; delete runs/{key}/{RESULT_FILE} to train it again)"
  )


def _row(cell: Cell, protocol: str, found: Sequence[tuple[str, int, dict]], planned: int, stored: bool) -> Row:
  """The Row of (key, seed, result) triples: the runs whose summary has the protocol's value, the rest listed in
  `Row.unscored` (and logged when `stored`: `write_results` names them itself)."""
  scored, unscored = [], []
  for key, seed, result in found:
    value = summary_value(result.get("summary"), protocol)
    if value is None:
      if stored:
        log.warning(unscored_line(key, cell, seed, protocol))
      unscored.append((key, seed))
    else:
      scored.append((key, value, result["wall_seconds"]))
  return Row(
    cell,
    protocol,
    tuple(value for _, value, _ in scored),
    planned=planned,
    wall_seconds=tuple(wall for _, _, wall in scored),
    keys=tuple(key for key, _, _ in scored) if stored else (),
    unscored=tuple(unscored),
  )


def _result_line(planned: PlannedRun, summary: dict) -> str:
  protocol = planned.runs[0].protocol
  value = summary_value(summary, protocol)
  return "no test result" if value is None else f"{PROTOCOL_METRIC[protocol]} {value:.1f}"


# --- aggregation


def aggregate(sweep: Sweep, workdir: str | Path, planned: Mapping[str, PlannedRun] | None = None) -> list[Row]:
  """One Row per (table cell, protocol), in the order the sweep lists them, from the finished runs."""
  planned = plan(sweep.runs) if planned is None else planned
  key_of = {run: key for key, p in planned.items() for run in p.runs}
  keys: dict[tuple[Cell, str], list[str]] = {}
  for run in sweep.runs:
    group = keys.setdefault((run.cell, run.protocol), [])
    if key_of[run] not in group:
      group.append(key_of[run])
  seeds = {(run.cell, run.protocol, key_of[run]): run.seed for run in sweep.runs}
  rows = []
  for (cell, protocol), group in keys.items():
    results = [(key, read_result(Path(workdir) / "runs" / key)) for key in group]
    found = [(key, seeds[(cell, protocol, key)], r) for key, r in results if r is not None]
    rows.append(_row(cell, protocol, found, len(group), stored=False))
  return rows


def stored_rows(workdir: str | Path) -> list[Row]:
  """One Row per (table cell, protocol) from the finished runs' own records, without planning a sweep.

  Every `result.json` names the cells it reports to, so a finished sweep's tables can be rebuilt after its
  sweep file or configs changed (which changes the run hashes that `aggregate` looks runs up by). Rows are
  sorted by (table, labels, protocol); accuracies within a row by seed. `planned` is the number found.
  """
  groups: dict[tuple[Cell, str], list[tuple[int, str, dict]]] = {}  # (seed, run directory, result)
  for path in sorted(Path(workdir).glob(f"runs/*/{RESULT_FILE}")):
    result = read_json(path, "a finished run's record")
    for entry in result["runs"]:
      recorded = entry["cell"]
      cell = Cell(recorded["table"], tuple(tuple(pair) for pair in recorded["labels"]), recorded["paper"])
      groups.setdefault((cell, entry["protocol"]), []).append((entry["seed"], path.parent.name, result))
  rows = []
  for (cell, protocol), found in sorted(groups.items(), key=lambda i: (i[0][0].table, i[0][0].labels, i[0][1])):
    found = sorted(found, key=lambda item: item[0])  # by seed
    rows.append(_row(cell, protocol, [(key, seed, r) for seed, key, r in found], len(found), stored=True))
  return rows


def _fmt(row: Row | None, digits: int = 1) -> str:
  if row is None or not row.n:
    return "-"
  return f"{row.mean:.{digits}f}" if row.n < 2 else f"{row.mean:.{digits}f} ± {row.std:.{digits}f}"


def results_markdown(sweep: Sweep, rows: Sequence[Row], walls: Sequence[float]) -> str:
  """One Markdown table per sweep table: labels, the paper's number, each protocol's mean ± std and n."""
  by_cell: dict[Cell, dict[str, Row]] = {}
  for row in rows:
    by_cell.setdefault(row.cell, {})[row.protocol] = row
  protocols = [p for p in PROTOCOLS if any(row.protocol == p for row in rows)]
  out = []
  for table in dict.fromkeys(cell.table for cell in by_cell):
    cells = [cell for cell in by_cell if cell.table == table]
    columns = list(dict.fromkeys(k for cell in cells for k, _ in cell.labels))
    header = [*columns, "paper"] + [h for p in protocols for h in (PROTOCOL_TITLE[p], "n")]
    out += [f"### {sweep.titles.get(table, table)}", "", "| " + " | ".join(header) + " |"]
    out.append("|" + "|".join("---" if i < len(columns) else "---:" for i in range(len(header))) + "|")
    for cell in cells:
      labels = dict(cell.labels)
      values = [labels.get(c, "") for c in columns] + ["-" if cell.paper is None else f"{cell.paper:.1f}"]
      for p in protocols:
        row = by_cell[cell].get(p)
        values += [_fmt(row, sweep.digits), f"{row.n}/{row.planned}" if row else "-"]
      out.append("| " + " | ".join(values) + " |")
    out.append("")
  if walls:
    out.append(
      f"{len(walls)} distinct runs finished; wall time {sum(walls) / 3600:.2f} h in all, {np.mean(walls):.0f} s "
      f"per run (min {min(walls):.0f} s, max {max(walls):.0f} s), each run's from start to result (compilation, "
      "data loading and, in subprocess mode, process start included)."
    )
  out.append(
    f"{sweep.value_name}, mean ± sample std (ddof=1) over seeds; n = finished/planned seeds. "
    + " ".join(f"{PROTOCOL_TITLE[p]}: summary `{PROTOCOL_METRIC[p]}`." for p in protocols)
  )
  if sweep.notes:
    out += ["", sweep.notes]
  flagged = [(row, entry) for row in rows for entry in row.unscored]
  if flagged:
    out += ["", "Finished runs left out of the tables:", ""]
    out += [f"- {unscored_line(key, row.cell, seed, row.protocol)}" for row, (key, seed) in flagged]
  return "\n".join(out) + "\n"


def results_csv(rows: Sequence[Row]) -> str:
  columns = list(dict.fromkeys(k for row in rows for k, _ in row.cell.labels))
  buffer = io.StringIO()
  writer = csv.writer(buffer, lineterminator="\n")
  writer.writerow(["table", *columns, "protocol", "n", "planned", "mean", "std", "paper", "accuracies", "mean_wall_s"])
  for row in rows:
    labels = dict(row.cell.labels)
    writer.writerow(
      [row.cell.table, *(labels.get(c, "") for c in columns), row.protocol, row.n, row.planned]
      + [f"{row.mean:.4f}" if row.n else "", f"{row.std:.4f}" if row.n > 1 else ""]
      + ["" if row.cell.paper is None else row.cell.paper, ";".join(f"{a:.4f}" for a in row.accuracies)]
      + [f"{np.mean(row.wall_seconds):.1f}" if row.n else ""]
    )
  return buffer.getvalue()


def write_results(
  sweep: Sweep,
  workdir: str | Path,
  planned: Mapping[str, PlannedRun] | None = None,
  *,
  print_fn: Callable[[str], None] = print,
) -> list[Row]:
  """results.md, results.csv and the sweep's plots in `workdir`; returns the rows. A finished run without its
  protocol's value is left out of its row and named (`unscored_line`) to `print_fn` and in results.md."""
  workdir = Path(workdir)
  planned = plan(sweep.runs) if planned is None else planned
  rows = aggregate(sweep, workdir, planned)
  for row in rows:
    for key, seed in row.unscored:
      print_fn(unscored_line(key, row.cell, seed, row.protocol))
  results = [r for r in (read_result(workdir / "runs" / key) for key in planned) if r is not None]
  (workdir / "results.md").write_text(results_markdown(sweep, rows, [r["wall_seconds"] for r in results]))
  (workdir / "results.csv").write_text(results_csv(rows))
  if sweep.plot is not None:
    sweep.plot(rows, workdir)
  return rows
