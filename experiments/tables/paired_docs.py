"""The docs tables of a sweep's comparisons: `paired:<family>:<table>[@every_seed][:<label>]` (paired differences
against the baseline row, `Sweep.baselines`, or the row of `<label>`; `@every_seed`: a piloted table chosen on every
seed instead) and `tuned:<family>:<table>` (a tuned table's choices,
`experiments.engine.tuning`), read from the family's run records (`experiments.tables.sweeps.sweep_folder`); the
forest plots (`experiments.tables.forest`) draw the same comparisons.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from experiments.tables.common import note_rows
from experiments.tables.sweeps import docs_sweep, mean_std, sweep_folder
from primal_jax import markdown

# The sweep argument the docs tables load a family's sweep file with (its broadest grid: d4rl's HalfCheetah rows).


def docs_rows(folder: Path, sweep, table: str) -> list:
  """The rows a docs table of `table` reads: the finished runs' own records (`stored_rows`), or, for a tuned table
  (`Sweep.tuned`) or one that shares runs (`Sweep.shared`), the sweep's plan (`aggregate`): it reuses runs recorded
  under other tables."""
  from experiments.engine.aggregate import aggregate, stored_rows

  rows = [] if table in sweep.tuned or table in sweep.shared else stored_rows(folder)
  if not any(row.cell.table == table for row in rows):  # tuned, or every run recorded under other tables
    rows = [row for row in aggregate(sweep, folder) if row.cell.table == table]
  note_rows(row for row in rows if row.cell.table == table)  # what the table reads (experiments.provenance)
  return rows


def tuned_sweep(arg: str, base: Path) -> str:
  """`tuned:<family>:<table>`: per group of a tuned table, the mean best-validation score at each value tried,
  the value chosen on it, and the test score at that value (mean ± std over seeds); 'pending' until every value's
  runs (its pilot seeds', `Sweep.pilot`) have finished (`experiments.engine.tuning`). A piloted table adds the
  value every seed's mean validation would choose (with those means), '-' until every value has all its seeds."""
  from experiments.engine.tuning import choose, sweep_choices

  folder, sweep, table = paired_target(arg)
  if table not in sweep.tuned:
    raise ValueError(f"tuned:{arg}: table {table!r} is not tuned (tuned: {', '.join(sweep.tuned) or 'none'})")
  column, pilot = sweep.tuned[table], sweep.pilot.get(table)
  rows = docs_rows(folder, sweep, table)
  choices = sweep_choices(sweep, rows, table)
  every = {}  # a piloted table also shows what every seed's validation would choose (where every value has all seeds)
  if pilot is not None:
    every = {(c.labels, c.protocol): c for c in choose(rows, table, column, higher_is_better=sweep.higher_is_better)}
  if not choices:
    raise ValueError(f"tuned:{arg}: no run of table {table!r} is planned")
  values = list(dict.fromkeys(v for c in choices for v, _ in c.tried))
  columns = [k for k, _ in choices[0].labels]
  body = []
  for c in choices:
    tried = dict(c.tried)
    cells = ["-" if math.isnan(tried.get(v, math.nan)) else f"{tried[v]:.{sweep.digits}f}" for v in values]
    chosen = "pending" if c.chosen is None else c.chosen
    body.append([*(v for _, v in c.labels), *cells, chosen, mean_std(c.row, sweep.digits) if c.row else "-"])
    if pilot is not None:
      e = every[c.labels, c.protocol]
      means = " / ".join(f"{m:.{sweep.digits}f}" for _, m in e.tried)
      body[-1].append("-" if e.chosen is None else f"{e.chosen} ({means})")
  over = "" if pilot is None else f" (seed{'s' * (len(pilot) > 1)} {', '.join(map(str, pilot))})"
  header = [*columns, *(f"validation{over} at {column} {v}" for v in values), "chosen", "test at the chosen value"]
  if pilot is not None:
    header.append("chosen on every seed (mean validation per value)")
  return markdown.table(header, body, numeric_from=len(columns))


def paired_docs_table(folder: Path, sweep, table: str) -> str:
  """The paired differences of `table` against its baseline row (`sweep.baselines`, the verdicts in the
  direction of `sweep.higher_is_better`) from the run records in `folder`/runs."""
  from experiments.engine.paired import paired_table

  if table not in sweep.baselines:
    raise ValueError(
      f"the sweep names no baseline for table {table!r} (baselines: {', '.join(sweep.baselines) or 'none'})"
    )
  text = paired_table(sweep, docs_rows(folder, sweep, table), table)
  if not text:
    raise ValueError(f"no finished row of table {table!r} in {folder / 'runs'} to compare with its baseline")
  return text


def paired_target(arg: str) -> tuple[Path, object, str]:
  """(run folder, sweep, table) named by `<family>:<table>[@every_seed][:<label>]`: experiments/sweeps/<family>.py
  (its default argument) with, given `<label>`, every row of `<table>` paired with the row of that label instead;
  `@every_seed` chooses a piloted table's values on every seed's validation (`Sweep.pilot` dropped for it), where
  every value has all its seeds: how the comparisons read had the pilot not chosen."""
  family, _, rest = arg.partition(":")
  table, _, reference = rest.partition(":")
  table, at, mode = table.partition("@")
  if not table:
    raise ValueError(f"paired:{arg}: name a family and a table, paired:<family>:<table>[@every_seed][:<label>]")
  sweep = docs_sweep(family)
  if at:
    if mode != "every_seed" or table not in sweep.pilot:
      raise ValueError(
        f"paired:{arg}: only a piloted table takes a suffix, @every_seed (piloted: {', '.join(sweep.pilot) or 'none'})"
      )
    sweep = dataclasses.replace(sweep, pilot={k: v for k, v in sweep.pilot.items() if k != table})
  if reference:
    if table not in sweep.baselines:
      raise ValueError(f"paired:{arg}: the sweep names no column to pair table {table!r} on")
    column, _ = sweep.baselines[table]
    sweep = dataclasses.replace(sweep, baselines={**sweep.baselines, table: (column, reference)})
  return sweep_folder(family), sweep, table


def paired_sweep(arg: str, base: Path) -> str:
  """`paired:<family>:<table>`: `paired_docs_table` of experiments/sweeps/<family>.py (its default argument) on the
  family's run records (`sweep_folder`). `paired:<family>:<table>:<label>` pairs every row with the row labelled
  `<label>` instead (in the column the sweep pairs on, e.g. every Table 2 row against PrimalFormer: is it best?)."""
  return paired_docs_table(*paired_target(arg))
