"""One tuning protocol for every mechanism of a table (issue 55): a grid of one setting, chosen on validation.

A table named in `Sweep.tuned` as table -> column trains every row at each value of that label column (a small grid
of learning rates, say, the same grid and budget for every mechanism). `choose` keeps, per group of rows that
differ only in that column (and share a protocol), the value whose runs have the best mean validation score over
the seeds (`Row.validations`, the best validation evaluation of each run; highest, or lowest where the sweep's
numbers are lower-is-better), among the values whose every planned seed finished. The test numbers at the chosen
value are what the table reports and pairs; validation alone chooses, so the test split never selects.

A group with a value still unfinished is pending (no choice, no verdict): a choice from part of the grid could
change when the rest lands.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from experiments.engine.rows import Cell, Row


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


def _mean_validation(row: Row) -> float:
  values = [v for v in row.validations if math.isfinite(v)]
  return float(np.mean(values)) if values and len(values) == row.n else math.nan


def choose(rows: Sequence[Row], table: str, column: str, *, higher_is_better: bool = True) -> list[Choice]:
  """The choices of `table`'s groups, in first-listed order (see the module docstring)."""
  groups: dict[tuple, list[Row]] = {}
  for row in rows:
    labels = dict(row.cell.labels)
    if row.cell.table != table or column not in labels:
      continue
    rest = tuple(pair for pair in row.cell.labels if pair[0] != column)
    groups.setdefault((rest, row.protocol), []).append(row)
  out = []
  for (rest, protocol), members in groups.items():
    tried = tuple((dict(r.cell.labels)[column], _mean_validation(r)) for r in members)
    complete = all(r.n and r.n == r.planned for r in members) and all(math.isfinite(v) for _, v in tried)
    if not complete:
      out.append(Choice(rest, protocol, tried, None, None))
      continue
    sign = 1.0 if higher_is_better else -1.0
    best = max(range(len(members)), key=lambda i: (sign * tried[i][1], -i))  # ties: the first in grid order
    chosen = members[best]
    row = dataclasses.replace(chosen, cell=Cell(table, rest, chosen.cell.paper))
    out.append(Choice(rest, protocol, tried, tried[best][0], row))
  return out


def tuned_rows(rows: Sequence[Row], table: str, column: str, *, higher_is_better: bool = True) -> list[Row]:
  """`rows` with `table`'s grid replaced by each group's chosen row (pending groups left out): what its paired
  differences compare."""
  chosen = [c.row for c in choose(rows, table, column, higher_is_better=higher_is_better) if c.row is not None]
  return [row for row in rows if row.cell.table != table] + chosen
