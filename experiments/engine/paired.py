"""The paired differences of a sweep's tables against their baseline rows (`Sweep.baselines`): Markdown and CSV.

In a table named in `Sweep.baselines` as (column, value), every row whose `column` label differs from `value` is
compared with the baseline row: the row whose labels are the same but for `column` = `value`, under the same
protocol. The difference row - baseline is paired by seed (`experiments.engine.stats.paired_difference`, 95%
Student-t interval). A row with no such baseline row (none of its runs finished yet) shows 0 pairs.

The verdicts say better / worse in the direction of `Sweep.higher_is_better` (for bits per byte, lower is better):
  better, worse: the interval excludes zero: a finding at 95%;
  level: the interval contains zero and lies inside ±`Sweep.level_margin` (only where the sweep sets a margin);
  unresolved: otherwise (the interval contains zero and is wider than the margin, or fewer than 2 pairs).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Mapping, Sequence

from experiments.engine import stats
from experiments.engine.rows import Row
from experiments.engine.spec import Sweep
from primal_jax import markdown

CONFIDENCE = 0.95
PAIRED_CSV = "paired.csv"  # beside results.csv, written for a sweep with baselines
# stats' verdicts in the tables' direction: (higher is better, lower is better).
JUDGED: Mapping[str, tuple[str, str]] = {
  stats.HIGHER: ("better", "worse"),
  stats.LOWER: ("worse", "better"),
  stats.LEVEL: ("level", "level"),
  stats.UNRESOLVED: ("unresolved", "unresolved"),
}


@dataclasses.dataclass(frozen=True)
class Comparison:
  """A row against its baseline row (None: no baseline row with its labels and protocol) and their `Paired`."""

  row: Row
  baseline: Row | None
  paired: stats.Paired
  verdict: str  # better / worse / level / unresolved (see the module docstring)


def by_seed(row: Row) -> dict[int, float]:
  """seed -> value of a row; a seed counted twice in a row (two runs of one cell and seed) cannot be paired."""
  values: dict[int, float] = {}
  for seed, value in zip(row.seeds, row.accuracies, strict=True):
    if seed in values:
      labels = " ".join(f"{k}={v}" for k, v in row.cell.labels)
      raise ValueError(f"{row.cell.table} {labels} ({row.protocol}) has seed {seed} twice: cannot pair by seed")
    values[seed] = value
  return values


def _others(row: Row, column: str) -> tuple:
  return tuple(pair for pair in row.cell.labels if pair[0] != column), row.protocol


def comparisons(sweep: Sweep, rows: Sequence[Row], table: str) -> list[Comparison]:
  """The comparisons of `table` (named in `sweep.baselines`), in the order of `rows`."""
  column, value = sweep.baselines[table]
  mine = [row for row in rows if row.cell.table == table and column in dict(row.cell.labels)]
  baselines = {_others(row, column): row for row in mine if dict(row.cell.labels)[column] == value}
  out = []
  for row in mine:
    if dict(row.cell.labels)[column] == value:
      continue
    baseline = baselines.get(_others(row, column))
    empty: dict[int, float] = {}
    paired = stats.paired_difference(
      by_seed(row), by_seed(baseline) if baseline else empty, confidence=CONFIDENCE, margin=sweep.level_margin
    )
    out.append(Comparison(row, baseline, paired, JUDGED[paired.verdict][0 if sweep.higher_is_better else 1]))
  return out


def _number(x: float, digits: int, sign: str = "") -> str:
  """`x` to `digits` decimals, "-" for nan; a value that rounds to zero shows as 0, not -0."""
  return "-" if math.isnan(x) else markdown.fixed(x, digits, sign)


def paired_table(sweep: Sweep, rows: Sequence[Row], table: str) -> str:
  """The Markdown table of `table`'s comparisons: labels, (protocol where the table has several), the baseline,
  pairs, mean and std of the differences, the 95% interval and the verdict. Empty when nothing is compared."""
  found = comparisons(sweep, rows, table)
  if not found:
    return ""
  column, value = sweep.baselines[table]
  columns = list(dict.fromkeys(k for c in found for k, _ in c.row.cell.labels))
  several = len({c.row.protocol for c in found}) > 1
  header = [*columns, *(["protocol"] if several else []), "vs", "pairs", "mean diff.", "std", "95% CI", "verdict"]
  body, d = [], sweep.digits
  for c in found:
    labels, p = dict(c.row.cell.labels), c.paired
    interval = "-" if math.isnan(p.low) else f"[{_number(p.low, d, '+')}, {_number(p.high, d, '+')}]"
    body.append(
      [labels.get(k, "") for k in columns]
      + ([c.row.protocol] if several else [])
      + [value, p.n, _number(p.mean, d, "+"), _number(p.std, d), interval, c.verdict]
    )
  aligns = ["l"] * (len(columns) + several + 1) + ["r"] * 4 + ["l"]
  return markdown.table(header, body, aligns=aligns)


def paired_note(sweep: Sweep) -> str:
  """The line under a paired table of results.md: what its numbers and verdicts mean."""
  direction = "higher" if sweep.higher_is_better else "lower"
  level = (
    f"level: it contains zero and lies inside ±{sweep.level_margin:g}; "
    if sweep.level_margin is not None
    else "(no margin set: nothing is called level); "
  )
  return (
    "Paired by seed: the row minus its baseline on each seed both finished; mean and sample std (ddof=1) of the "
    f"differences, 95% Student-t interval. {direction.capitalize()} is better here. better / worse: the interval "
    f"excludes zero (a finding; where every pair differs by the same amount, std 0, only if all 6 or more agree, "
    f"the sign test); {level}unresolved: otherwise, or fewer than 2 pairs."
  )


def paired_markdown(sweep: Sweep, rows: Sequence[Row], table: str) -> list[str]:
  """The lines results.md shows after `table`'s mean ± std table (none for a table without a baseline)."""
  if table not in sweep.baselines:
    return []
  text = paired_table(sweep, rows, table)
  if not text:
    return []
  column, value = sweep.baselines[table]
  return [f"Paired differences vs {column}={value}:", "", text, "", paired_note(sweep), ""]


def paired_csv(sweep: Sweep, rows: Sequence[Row]) -> str:
  """paired.csv: one line per comparison of every table with a baseline; numbers to 4 decimals,
  `seeds` the paired seeds, `verdict` as in the Markdown (better / worse in the sweep's direction)."""
  found = [c for table in sweep.baselines for c in comparisons(sweep, rows, table)]
  columns = list(dict.fromkeys(k for c in found for k, _ in c.row.cell.labels))
  buffer = io.StringIO()
  writer = csv.writer(buffer, lineterminator="\n")
  writer.writerow(["table", *columns, "protocol", "baseline", "n", "mean", "std", "low", "high", "verdict", "seeds"])
  for c in found:
    labels, p = dict(c.row.cell.labels), c.paired
    column, value = sweep.baselines[c.row.cell.table]
    seeds = sorted(set(c.row.seeds) & set(c.baseline.seeds)) if c.baseline else []
    numbers = ["" if math.isnan(x) else _number(x, 4) for x in (p.mean, p.std, p.low, p.high)]
    writer.writerow(
      [c.row.cell.table, *(labels.get(k, "") for k in columns), c.row.protocol, f"{column}={value}", p.n]
      + [*numbers, c.verdict, ";".join(map(str, seeds))]
    )
  return buffer.getvalue()
