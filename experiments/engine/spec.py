"""What a sweep is: its runs (config, seed, protocol, table cell), their config hashes and the plan of distinct runs."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import shlex
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from experiments.engine.records import current_config
from experiments.engine.rows import Cell, Row
from primal_jax.cli.config_lookup import load_config, load_module
from primal_jax.dotted import set_dotted
from primal_jax.errors import ConfigError

MAIN_MODULE = "experiments.main"  # the training binary a run's command names

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


class _Options(tuple):
  """An override whose value is a mapping (a config section set whole), kept in a Run as its items so the Run
  stays hashable; `Run.all_overrides` gives the mapping back."""


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
    items = self.overrides.items() if isinstance(self.overrides, Mapping) else self.overrides
    frozen = tuple((key, _Options(value.items()) if isinstance(value, Mapping) else value) for key, value in items)
    object.__setattr__(self, "overrides", frozen)

  def all_overrides(self, config) -> dict[str, Any]:
    """Protocol, seeds (`seed` and, where the config has one, `data.seed`) and the run's own overrides."""
    seeds = {"seed": self.seed, **({"data.seed": self.seed} if "seed" in config.get("data", {}) else {})}
    own = {key: dict(value) if isinstance(value, _Options) else value for key, value in self.overrides}
    return {**PROTOCOLS[self.protocol], **seeds, **own}


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A sweep file's grid. `titles`: table name -> heading; `plot(rows, out_dir)` -> written paths.

  `value_name` says what the tables' numbers are and `digits` how many decimals they show.
  `baselines`: table name -> (label column, value) of the row every other row of that table is compared with,
  seed by seed (paired differences; rows pair when their other labels and protocol agree).
  `higher_is_better`: the direction of the tables' numbers (False for bits per byte).
  `level_margin`: the largest paired difference (in the tables' units) that reads "level" when its 95% interval
  contains zero and lies inside ±level_margin (`experiments.engine.stats`); None: no difference is called level.
  `after_run`: table name -> function of a run directory, called in the sweep process right after a run of that
  table has trained and its record is written (an analysis that needs the run's checkpoint, which is not
  committed: `experiments.spectrum.store_run_spectrum`); it returns a line to print. Not called for runs already
  finished. A failure is reported as the run's failure (its record stays); redo the analysis by hand.
  `chance`: table name -> the best validation accuracy (%) of a model that learned nothing (the validation split's
  most frequent label, 50 on a balanced binary task). A run of such a table learned iff its best validation
  accuracy exceeds chance by more than `learn_margin` points; a row takes part in a paired verdict only where it
  and its baseline learned on every paired seed (`experiments.engine.paired`), else it reads "did not learn".
  `tuned`: table name -> a label column whose values are a grid every row of the table is trained at (one tuning
  protocol for every mechanism); each group's value is chosen on validation and only the chosen rows are paired
  (`experiments.engine.tuning`).
  `pilot`: tuned table name -> the seeds that choose its value (a pilot); its other seeds train at the chosen
  value only (`experiments.engine.tuning.pilot_skip`). Absent: every seed chooses, every value trains every seed.
  `shared`: tables some of whose rows are runs recorded under other tables; the docs read them by the plan
  (`experiments.engine.aggregate`), not by the tables each record names (a table with no record of its own is
  read so anyway).
  """

  runs: tuple[Run, ...]
  titles: Mapping[str, str] = dataclasses.field(default_factory=dict)
  plot: Callable[[list[Row], Path], list[Path]] | None = None
  notes: str = ""
  value_name: str = "Accuracy (%) on the test split"
  digits: int = 1
  baselines: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
  higher_is_better: bool = True
  level_margin: float | None = None
  after_run: Mapping[str, Callable[[Path], str]] = dataclasses.field(default_factory=dict)
  chance: Mapping[str, float] = dataclasses.field(default_factory=dict)
  learn_margin: float = 2.0
  tuned: Mapping[str, str] = dataclasses.field(default_factory=dict)
  pilot: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
  shared: tuple[str, ...] = ()

  def __post_init__(self):
    """Refuses a baseline row no run of its table reports to (a misspelt label), or a negative margin. A table
    without runs (a sweep argument that leaves it out) passes."""
    for table, (column, value) in self.baselines.items():
      labels = [dict(run.cell.labels) for run in self.runs if run.cell.table == table]
      if labels and not any(cell.get(column) == value for cell in labels):
        found = sorted({cell[column] for cell in labels if column in cell})
        raise ConfigError(
          f"baselines: no run of table {table!r} has {column}={value!r}"
          + (f" ({column} values: {', '.join(found)})" if found else f" (no run of {table!r} has a {column!r} label)")
        )
    for table, column in self.tuned.items():
      if self.baselines.get(table, (None,))[0] == column:
        raise ConfigError(f"table {table!r} pairs on {column!r}, the column it tunes: pair on another label")
    for table, seeds in self.pilot.items():
      if table not in self.tuned:
        raise ConfigError(f"pilot: table {table!r} is not tuned (tuned: {', '.join(self.tuned) or 'none'})")
      if not seeds or not all(isinstance(seed, int) for seed in seeds):
        raise ConfigError(f"pilot[{table!r}] must be a non-empty tuple of seeds, got {seeds!r}")
    if not self.learn_margin >= 0:
      raise ConfigError(f"learn_margin must be >= 0, got {self.learn_margin!r}")
    for table, level in self.chance.items():
      if not 0 <= level < 100:
        raise ConfigError(f"chance[{table!r}] must be a validation accuracy in [0, 100) %, got {level!r}")
    if self.level_margin is not None and not self.level_margin >= 0:
      raise ConfigError(f"level_margin must be >= 0 (or None), got {self.level_margin!r}")


@dataclasses.dataclass
class PlannedRun:
  """A distinct config of the sweep and every `Run` (table cell) that it stands for."""

  key: str
  config: Any  # locked ConfigDict
  overrides: dict[str, Any]
  runs: list[Run]

  def flags(self, workdir: str | Path) -> list[str]:
    """The flags of `python -m experiments.main` that train this run in `workdir`."""
    return main_flags(self.runs[0].config, workdir, self.overrides)

  @property
  def command(self) -> str:
    """The equivalent single-run command line, for results and READMEs."""
    return f"python -m {MAIN_MODULE} " + shlex.join(self.flags("WORKDIR"))


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


def resolve(run: Run):
  """The locked ConfigDict of `run`: its config (a recorded form mapped to the current one), then protocol, seeds
  and overrides."""
  config = load_config(current_config(run.config), lock=False)
  for key, value in run.all_overrides(config).items():
    set_dotted(config, key, value)
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


def select(planned: Mapping[str, PlannedRun], only: Sequence[str] | None) -> list[PlannedRun]:
  if not only:
    return list(planned.values())
  tables = {run.cell.table for p in planned.values() for run in p.runs}
  unknown = sorted(set(only) - tables)
  if unknown:
    raise ConfigError(f"unknown table(s) {unknown}; this sweep has {sorted(tables)}")
  return [p for p in planned.values() if any(run.cell.table in only for run in p.runs)]


def _flag_value(value) -> str:
  return str(value) if not isinstance(value, bool) else str(value).lower()


def main_flags(config: str, workdir: str | Path, overrides: Mapping[str, Any] = types.MappingProxyType({}), extra=()):
  """The flags of `python -m experiments.main` that train `config` (`name[:arg]` or a file) in `workdir` with
  `overrides` (dotted keys) as `--config.KEY=VALUE` flags, then `extra`."""
  flags = [f"--config={config}", f"--workdir={workdir}"]
  return flags + [f"--config.{k}={_flag_value(v)}" for k, v in overrides.items()] + list(extra)
