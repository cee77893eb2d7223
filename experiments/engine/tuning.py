"""One tuning protocol for every mechanism of a table (issue 55): a grid of one setting, chosen on validation.

A table named in `Sweep.tuned` as table -> column trains every row at each value of that label column (a small grid
of learning rates, say, the same grid and budget for every mechanism). `choose` keeps, per group of rows that
differ only in that column (and share a protocol), the value whose runs have the best mean validation score over
the seeds (`Row.validations`, the best validation evaluation of each run; highest, or lowest where the sweep's
numbers are lower-is-better), among the values whose every planned seed finished. The test numbers at the chosen
value are what the table reports and pairs; validation alone chooses, so the test split never selects.

A group with a value still unfinished is pending (no choice, no verdict): a choice from part of the grid could
change when the rest lands.

A pilot (`Sweep.pilot`, table -> seeds) chooses on those seeds alone: each value's mean validation over the pilot
seeds, the group pending until every value has them; the other seeds train at the chosen value only (the runner
skips the rest, `pilot_skip`), and the chosen row reports every seed it has. One pilot for every row of the table,
so the protocol stays one for every mechanism; it spends one seed per value instead of every seed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from experiments.engine.rows import Cell, Row
from experiments.engine.spec import Run, Sweep


@dataclasses.dataclass(frozen=True)
class Choice:
  """A group of rows differing only in the tuned column: each tried value's mean validation (nan: not finished),
  the chosen value (None while pending) and the chosen row with the tuned column dropped from its labels (so it
  pairs with the other groups' choices as an untuned row would)."""

  labels: tuple[tuple[str, str], ...]  # the group's labels, the tuned column left out
  protocol: str
  tried: tuple[tuple[str, float], ...]  # (value, mean validation over its finished seeds), in grid order
  chosen: str | None
  row: Row | None


def labels_without(labels: tuple[tuple[str, str], ...], column: str) -> tuple[tuple[str, str], ...]:
  """A cell's labels with the tuned `column` left out: what a group of a tuned table shares."""
  return tuple(pair for pair in labels if pair[0] != column)


def _mean_validation(row: Row, pilot: Sequence[int] | None) -> float:
  """The mean best validation over the row's finished seeds, or over the pilot seeds alone (nan until each has
  a finite value)."""
  if pilot is None:
    values = [v for v in row.validations if math.isfinite(v)]
    return float(np.mean(values)) if values and len(values) == row.n else math.nan
  by_seed = dict(zip(row.seeds, row.validations, strict=True))
  values = [by_seed.get(seed, math.nan) for seed in pilot]
  return float(np.mean(values)) if all(math.isfinite(v) for v in values) else math.nan


def choose(
  rows: Sequence[Row], table: str, column: str, *, higher_is_better: bool = True, pilot: Sequence[int] | None = None
) -> list[Choice]:
  """The choices of `table`'s groups, in first-listed order, on every seed or on the `pilot` seeds (see the
  module docstring)."""
  groups: dict[tuple, list[Row]] = {}
  for row in rows:
    labels = dict(row.cell.labels)
    if row.cell.table != table or column not in labels:
      continue
    rest = labels_without(row.cell.labels, column)
    groups.setdefault((rest, row.protocol), []).append(row)
  out = []
  for (rest, protocol), members in groups.items():
    tried = tuple((dict(r.cell.labels)[column], _mean_validation(r, pilot)) for r in members)
    finished = pilot is not None or all(r.n and r.n == r.planned for r in members)  # a pilot: its seeds alone
    if not (finished and all(math.isfinite(v) for _, v in tried)):
      out.append(Choice(rest, protocol, tried, None, None))
      continue
    sign = 1.0 if higher_is_better else -1.0
    best = max(range(len(members)), key=lambda i: (sign * tried[i][1], -i))  # ties: the first in grid order
    chosen = members[best]
    row = dataclasses.replace(chosen, cell=Cell(table, rest, chosen.cell.paper))
    out.append(Choice(rest, protocol, tried, tried[best][0], row))
  return out


def sweep_choices(sweep: Sweep, rows: Sequence[Row], table: str) -> list[Choice]:
  """`choose` for a table the sweep tunes, with its column, direction and pilot."""
  return choose(rows, table, sweep.tuned[table], higher_is_better=sweep.higher_is_better, pilot=sweep.pilot.get(table))


def tuned_rows(sweep: Sweep, rows: Sequence[Row], table: str) -> list[Row]:
  """`rows` with `table`'s grid replaced by each group's chosen row (pending groups left out): what its paired
  differences compare."""
  chosen = [c.row for c in sweep_choices(sweep, rows, table) if c.row is not None]
  return [row for row in rows if row.cell.table != table] + chosen


def pilot_skip(sweep: Sweep, runs: Sequence[Run], choices: Callable[[str], list[Choice]]) -> str | None:
  """Why a planned run (the table cells `runs` it stands for) is not trained now: every cell is a non-pilot seed of
  a piloted table (`Sweep.pilot`) whose group's pilot is unfinished ("waiting") or chose another value ("not
  chosen"); None where some cell needs the run. `choices(table)` gives the table's current choices."""
  reasons = []
  for run in runs:
    table = run.cell.table
    if table not in sweep.pilot or run.seed in sweep.pilot[table]:
      return None
    column = sweep.tuned[table]
    labels = dict(run.cell.labels)
    rest = labels_without(run.cell.labels, column)
    choice = next(c for c in choices(table) if c.labels == rest and c.protocol == run.protocol)
    if choice.chosen == labels[column]:
      return None
    pilot = ", ".join(map(str, sweep.pilot[table]))
    reasons.append(
      f"waiting for the pilot (seeds {pilot}) of {table}"
      if choice.chosen is None
      else f"{column} {labels[column]} not chosen by the pilot of {table} ({choice.chosen})"
    )
  return "; ".join(reasons) or None  # no cells: nothing to hold it back
