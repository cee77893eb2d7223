"""The paired differences of a sweep's tables against their baseline rows (`Sweep.baselines`): Markdown and CSV.

In a table named in `Sweep.baselines` as (column, value), every row whose `column` label differs from `value` is
compared with the baseline row: the row whose labels are the same but for `column` = `value`, under the same
protocol. The difference row - baseline is paired by seed (`experiments.engine.stats.paired_difference`, 95%
Student-t interval). A row with no such baseline row (none of its runs finished yet) shows 0 pairs.

The comparisons of one table are one family: each has its paired t-test p-value, Holm's step-down adjustment
over the family (`stats.holm`) and a corrected interval, the t interval at its Holm step's level (1 - 0.05 / (m - k +
1) for the comparison of rank k of m; `stats.holm_confidences`), shown beside the raw 95% interval. The verdicts
use the corrected ones and say better / worse in the direction of `Sweep.higher_is_better` (for bits per byte,
lower is better):
  better, worse: Holm's adjusted p-value is <= 0.05 (its corrected interval then excludes zero): a finding with
    the family-wise error rate of the table held at 5%;
  level: not a finding, and the corrected interval contains zero and lies inside ±`Sweep.level_margin` (only where
    the sweep sets a margin);
  unresolved: otherwise (fewer than 2 pairs among them).
The raw verdict (the 95% interval alone) stays in `Comparison.paired.verdict` and paired.csv's `raw_verdict`.

In a table with a chance level (`Sweep.chance`), a comparison is tested only where the row and its baseline both
learned (best validation accuracy above chance + `Sweep.learn_margin`) on every paired seed: otherwise its verdict
is "did not learn" (the row) or "<baseline> did not learn", it has no p-value and it is not counted in the table's
Holm family. A difference between a model that learns and one that does not at the one rate tried measures the
rate, not the mechanism. In a tuned table (`Sweep.tuned`) a side none of whose runs learned at any value of the
grid reads "... did not learn at any <column> tried" (`learned_nowhere`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Mapping, Sequence

from experiments.engine import stats, tuning
from experiments.engine.rows import Row
from experiments.engine.spec import Sweep
from primal_jax import markdown

CONFIDENCE = 0.95
PAIRED_CSV = "paired.csv"  # beside results.csv, written for a sweep with baselines
NOT_LEARNED = "did not learn"  # the verdict of a comparison whose row did not learn (`Sweep.chance`)
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
  paired: stats.Paired  # the raw 95% interval and its verdict
  verdict: str  # better / worse / level / unresolved, Holm-corrected (see the module docstring)
  p: float = math.nan  # the paired t test's two-sided p-value (nan below 2 pairs)
  p_holm: float = math.nan  # Holm-adjusted over the table's comparisons
  corrected: stats.Paired | None = None  # the interval at the comparison's Holm step level


def by_seed(row: Row) -> dict[int, float]:
  """seed -> value of a row; a seed counted twice in a row (two runs of one cell and seed) cannot be paired."""
  values: dict[int, float] = {}
  for seed, value in zip(row.seeds, row.accuracies, strict=True):
    if seed in values:
      labels = " ".join(f"{k}={v}" for k, v in row.cell.labels)
      raise ValueError(f"{row.cell.table} {labels} ({row.protocol}) has seed {seed} twice: cannot pair by seed")
    values[seed] = value
  return values


def learned(sweep: Sweep, row: Row) -> dict[int, bool] | None:
  """seed -> whether that seed's run learned (best validation accuracy above `sweep.chance[table]` +
  `sweep.learn_margin`; a run without a validation value did not); None where the table sets no chance level."""
  chance = sweep.chance.get(row.cell.table)
  if chance is None:
    return None
  validations = row.validations or (math.nan,) * row.n
  return {seed: bool(value > chance + sweep.learn_margin) for seed, value in zip(row.seeds, validations, strict=True)}


def learned_nowhere(sweep: Sweep, rows: Sequence[Row], table: str) -> set[tuple]:
  """The groups of tuned `table` (`Sweep.tuned`), as (labels without the tuned column, protocol), none of whose
  runs learned (`learned`) at any value of the grid on any seed; empty where the table sets no chance level."""
  column, groups = sweep.tuned[table], {}
  for row in rows:
    flags = learned(sweep, row) if row.cell.table == table and column in dict(row.cell.labels) else None
    if flags is not None:
      groups[_others(row, column)] = groups.get(_others(row, column), False) or any(flags.values())
  return {key for key, any_learned in groups.items() if not any_learned}


def _untestable(
  sweep: Sweep, row: Row, baseline: Row | None, seeds: set[int], reference: str, nowhere: tuple[set, str]
) -> str | None:
  """The verdict of a comparison that is not tested because a side did not learn on a paired seed, else None;
  "... at any <column> tried" for a side in `nowhere` (the groups of a tuned table that learned at no value)."""
  groups, column = nowhere
  for side, verdict in ((row, NOT_LEARNED), (baseline, f"{reference} {NOT_LEARNED}")):
    flags = learned(sweep, side) if side is not None else None
    if flags is not None and not all(flags[seed] for seed in seeds):
      return verdict + (f" at any {column} tried" if (side.cell.labels, side.protocol) in groups else "")
  return None


def _others(row: Row, column: str) -> tuple:
  return tuning.labels_without(row.cell.labels, column), row.protocol


def comparisons(sweep: Sweep, rows: Sequence[Row], table: str) -> list[Comparison]:
  """The comparisons of `table` (named in `sweep.baselines`), in the order of `rows`, Holm-corrected as a family."""
  column, value = sweep.baselines[table]
  nowhere: tuple[set, str] = (set(), "")
  if table in sweep.tuned:  # each group's value chosen on validation: only the chosen rows are paired
    nowhere = learned_nowhere(sweep, rows, table), sweep.tuned[table].replace("_", " ")
    rows = tuning.tuned_rows(sweep, rows, table)
  mine = [row for row in rows if row.cell.table == table and column in dict(row.cell.labels)]
  baselines = {_others(row, column): row for row in mine if dict(row.cell.labels)[column] == value}
  pairs = []
  for row in mine:
    if dict(row.cell.labels)[column] != value:
      baseline = baselines.get(_others(row, column))
      pairs.append((row, baseline, by_seed(row), by_seed(baseline) if baseline else {}))
  untested = [_untestable(sweep, row, base, set(a) & set(b), value, nowhere) for row, base, a, b in pairs]
  p_values = [math.nan if u else stats.paired_p_value(a, b) for u, (_, _, a, b) in zip(untested, pairs, strict=True)]
  adjusted = stats.holm(p_values)
  levels = stats.holm_confidences(p_values, CONFIDENCE)
  direction = 0 if sweep.higher_is_better else 1
  out = []
  for (row, baseline, a, b), p, p_holm, level, skip in zip(pairs, p_values, adjusted, levels, untested, strict=True):
    margin = sweep.level_margin
    paired = stats.paired_difference(a, b, confidence=CONFIDENCE, margin=margin)
    if skip:
      out.append(Comparison(row, baseline, paired, skip))
      continue
    corrected = paired if math.isnan(level) else stats.paired_difference(a, b, confidence=level, margin=margin)
    if p_holm <= 1 - CONFIDENCE:  # a finding: the sign of the mean (the corrected interval excludes zero)
      verdict = stats.HIGHER if corrected.mean > 0 else stats.LOWER
    else:
      verdict = stats.LEVEL if corrected.verdict == stats.LEVEL else stats.UNRESOLVED
    out.append(Comparison(row, baseline, paired, JUDGED[verdict][direction], p, float(p_holm), corrected))
  return out


def _interval(p: stats.Paired | None, digits: int) -> str:
  if p is None or math.isnan(p.low):
    return "-"
  return f"[{_number(p.low, digits, '+')}, {_number(p.high, digits, '+')}]"


def _number(x: float, digits: int, sign: str = "") -> str:
  """`x` to `digits` decimals, "-" for nan; a value that rounds to zero shows as 0, not -0."""
  return "-" if math.isnan(x) else markdown.fixed(x, digits, sign)


def paired_table(sweep: Sweep, rows: Sequence[Row], table: str) -> str:
  """The Markdown table of `table`'s comparisons: labels, (protocol where the table has several), the baseline,
  pairs, mean and std of the differences, the raw 95% interval, the Holm-corrected interval and p-value, and the
  (corrected) verdict. Empty when nothing is compared."""
  found = comparisons(sweep, rows, table)
  if not found:
    return ""
  column, value = sweep.baselines[table]
  columns = list(dict.fromkeys(k for c in found for k, _ in c.row.cell.labels))
  several = len({c.row.protocol for c in found}) > 1
  header = [*columns, *(["protocol"] if several else []), "vs", "pairs", "mean diff.", "std", "95% CI"]
  header += ["Holm CI", "p (Holm)", "verdict"]
  body, d = [], sweep.digits
  for c in found:
    labels, p = dict(c.row.cell.labels), c.paired
    holm_p = "-" if math.isnan(c.p_holm) else f"{c.p_holm:.3f}"
    body.append(
      [labels.get(k, "") for k in columns]
      + ([c.row.protocol] if several else [])
      + [value, p.n, _number(p.mean, d, "+"), _number(p.std, d), _interval(p, d), _interval(c.corrected, d)]
      + [holm_p, c.verdict]
    )
  aligns = ["l"] * (len(columns) + several + 1) + ["r"] * 6 + ["l"]
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
    "differences, 95% Student-t interval; the table's comparisons are one family, Holm-corrected: p (Holm) is the "
    "adjusted p-value of the paired t test, Holm CI the interval at the comparison's Holm step level. "
    f"{direction.capitalize()} is better here. better / worse: adjusted p <= 0.05 (a finding with the table's "
    f"family-wise error held at 5%; where every pair differs by the same amount, std 0, the sign test's p); "
    f"{level.replace('it contains', 'the Holm CI contains')}unresolved: otherwise, or fewer than 2 pairs."
    + (
      f" did not learn: the row (or, named, its baseline) did not learn on a paired seed (best validation accuracy "
      f"not above chance + {sweep.learn_margin:g} points): not tested, not counted in the family"
      + ("; at any ... tried: no run of it learned at any value of the table's grid." if sweep.tuned else ".")
      if sweep.chance
      else ""
    )
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
  header = ["table", *columns, "protocol", "baseline", "n", "mean", "std", "low", "high", "verdict", "seeds"]
  writer.writerow(header + ["p", "p_holm", "holm_low", "holm_high", "raw_verdict"])
  for c in found:
    labels, p = dict(c.row.cell.labels), c.paired
    column, value = sweep.baselines[c.row.cell.table]
    seeds = sorted(set(c.row.seeds) & set(c.baseline.seeds)) if c.baseline else []
    numbers = ["" if math.isnan(x) else _number(x, 4) for x in (p.mean, p.std, p.low, p.high)]
    corrected = c.corrected or p
    extra = ["" if math.isnan(x) else f"{x:.4g}" for x in (c.p, c.p_holm)]
    extra += ["" if math.isnan(x) else _number(x, 4) for x in (corrected.low, corrected.high)]
    raw = JUDGED[p.verdict][0 if sweep.higher_is_better else 1]
    writer.writerow(
      [c.row.cell.table, *(labels.get(k, "") for k in columns), c.row.protocol, f"{column}={value}", p.n]
      + [*numbers, c.verdict, ";".join(map(str, seeds)), *extra, raw]
    )
  return buffer.getvalue()
