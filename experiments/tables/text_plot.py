"""Scatter/line plots as text: deterministic, diffable in review, and checked by `docs_tables --check` like the
tables (no plotting library is needed where the docs are generated), and the forest plots of paired comparisons
(`forest_table`; `experiments.tables.forest` draws a docs table's)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from primal_jax import markdown


def _cell(value: float, low: float, high: float, size: int) -> int:
  return min(size - 1, max(0, int(round((value - low) / (high - low) * (size - 1)))))


def text_plot(
  series: Mapping[str, Sequence[tuple[float, float]]],
  *,
  x_range: tuple[float, float],
  y_range: tuple[float, float],
  width: int = 56,
  height: int = 14,
  diagonal: bool = False,
  x_label: str = "",
  y_label: str = "",
  digits: int = 2,
) -> list[str]:
  """Lines of a plot: each series' points drawn with its one-character key (a later series over an earlier one,
  '*' where two differ on one cell), the y = x diagonal as '.' when asked, axes labelled at their ends. Points
  outside the ranges are clipped to the border; nan points are left out."""
  (x0, x1), (y0, y1) = x_range, y_range
  if not (x1 > x0 and y1 > y0):
    raise ValueError(f"ranges must be increasing, got x {x_range}, y {y_range}")
  if any(len(key) != 1 for key in series):
    raise ValueError(f"series keys must be one character each, got {list(series)}")
  grid = [[" "] * width for _ in range(height)]
  if diagonal:
    for c in range(width):
      x = x0 + (x1 - x0) * c / (width - 1)
      if y0 <= x <= y1:
        grid[height - 1 - _cell(x, y0, y1, height)][c] = "."
  for key, points in series.items():
    for x, y in points:
      if not (math.isfinite(x) and math.isfinite(y)):
        continue
      row, col = height - 1 - _cell(y, y0, y1, height), _cell(x, x0, x1, width)
      grid[row][col] = key if grid[row][col] in " ." or grid[row][col] == key else "*"
  top, bottom = f"{y1:.{digits}f}", f"{y0:.{digits}f}"
  pad = max(len(top), len(bottom), len(y_label))
  lines = [f"{y_label:>{pad}}"] if y_label else []
  for i, row in enumerate(grid):
    tick = top if i == 0 else bottom if i == height - 1 else ""
    lines.append(f"{tick:>{pad}} |{''.join(row)}")
  lines.append(f"{'':>{pad}} +{'-' * width}")
  left, right = f"{x0:g}", f"{x1:g}"
  lines.append(f"{'':>{pad}}  {left}{x_label:^{width - len(left) - len(right)}}{right}")
  return lines


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
