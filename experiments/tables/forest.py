"""Forest plots of a table's paired differences, as text the docs can hold and `docs_tables --check` can compare.

`forest:<family>:<table>[@every_seed][:<label>]` draws the comparisons of `paired:<same>` on one axis:
per row, the Holm-corrected interval as `=`, the raw 95% interval over it as `-`, the mean as `o`, and zero as a
`|` line through every row, so a reader sees at a glance which intervals leave zero. Text, not an image: it is
deterministic, diffs in review and needs no plotting library where the docs are checked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from experiments.engine.paired import comparisons
from experiments.tables.paired_docs import docs_rows, paired_target
from primal_jax import markdown

WIDTH = 41  # characters of the axis


def _column(x: float, low: float, high: float, width: int) -> int:
  return int(round((x - low) / (high - low) * (width - 1)))


def forest_lines(
  labels: Sequence[str],
  intervals: Sequence[tuple[float, float, float, float, float]],
  verdicts: Sequence[str],
  *,
  digits: int = 1,
  width: int = WIDTH,
) -> list[str]:
  """The plot's lines. `intervals`: per row (mean, raw low, raw high, corrected low, corrected high), nan where the
  row has too few pairs (drawn as 'no interval'); corrected bounds nan alone: a row not tested, its raw interval
  drawn and labelled 'raw'. The axis spans every finite bound and zero."""
  if not (len(labels) == len(intervals) == len(verdicts)):
    raise ValueError(
      f"labels, intervals and verdicts differ in length: {len(labels)}, {len(intervals)}, {len(verdicts)}"
    )
  finite = [x for row in intervals for x in row if math.isfinite(x)] + [0.0]
  low, high = min(finite), max(finite)
  if high == low:
    low, high = low - 1.0, high + 1.0
  zero = _column(0.0, low, high, width)

  def signed(x: float) -> str:  # '+1.5', '-0.3', and '+0.0' for a value that rounds to zero (not '-0.0')
    return markdown.fixed(x, digits, "+")

  name = max(len(label) for label in labels) if labels else 0
  axis = [" "] * width
  axis[0], axis[-1], axis[zero] = "<", ">", "0"
  left, right = signed(low), signed(high)
  lines = [f"{'':<{name}}  {left:<{width // 2}}{right:>{width - width // 2}}", f"{'':<{name}}  {''.join(axis)}"]
  for label, (mean, raw_low, raw_high, holm_low, holm_high), verdict in zip(labels, intervals, verdicts, strict=True):
    bar = [" "] * width
    if math.isfinite(holm_low) and math.isfinite(holm_high):
      for c in range(_column(holm_low, low, high, width), _column(holm_high, low, high, width) + 1):
        bar[c] = "="
      for c in range(_column(raw_low, low, high, width), _column(raw_high, low, high, width) + 1):
        bar[c] = "-"
      text = f"{signed(mean)} [{signed(holm_low)}, {signed(holm_high)}]"
    elif math.isfinite(raw_low) and math.isfinite(raw_high):  # not tested (no Holm interval): the raw one alone
      for c in range(_column(raw_low, low, high, width), _column(raw_high, low, high, width) + 1):
        bar[c] = "-"
      text = f"{signed(mean)} raw [{signed(raw_low)}, {signed(raw_high)}]"
    else:
      text = "no interval" if not math.isfinite(mean) else f"{signed(mean)} (one pair: no interval)"
    bar[zero] = "+" if bar[zero] in "=-" else "|"  # the zero line, '+' where an interval crosses it
    if math.isfinite(mean):
      bar[_column(mean, low, high, width)] = "o"
    lines.append(f"{label:<{name}}  {''.join(bar)}  {text} {verdict}")
  return lines


def forest_table(comparisons: Sequence, digits: int, reference: str) -> str:
  """A fenced text block of `experiments.engine.paired.Comparison`s, each row named by its labels (its protocol too
  where the table has several) against `reference` (the baseline row's label)."""
  several = len({c.row.protocol for c in comparisons}) > 1
  labels, intervals, verdicts = [], [], []
  for c in comparisons:
    label = " ".join(v for _, v in c.row.cell.labels if v) + (f" ({c.row.protocol})" if several else "")
    labels.append(f"{label} vs {reference}")
    # A comparison not tested (a side did not learn, `experiments.engine.paired`) has no corrected interval.
    holm = (c.corrected.low, c.corrected.high) if c.corrected is not None else (math.nan, math.nan)
    intervals.append((c.paired.mean, c.paired.low, c.paired.high, *holm))
    verdicts.append(c.verdict)
  body = forest_lines(labels, intervals, verdicts, digits=digits)
  legend = "= Holm-corrected interval, - raw 95% interval, o mean, | zero; right: mean [Holm interval] verdict"
  return "\n".join(["```text", *body, "```", "", legend])


def forest_sweep(arg: str, base) -> str:
  """`forest:<family>:<table>[@every_seed][:<label>]`: the forest plot of the docs table `paired:<same>`."""
  folder, sweep, table = paired_target(arg)
  found = comparisons(sweep, docs_rows(folder, sweep, table), table)
  if not found:
    raise ValueError(f"forest:{arg}: no finished row of table {table!r} in {folder / 'runs'}")
  _, reference = sweep.baselines[table]
  return forest_table(found, sweep.digits, reference)
