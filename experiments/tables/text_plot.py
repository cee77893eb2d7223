"""Scatter/line plots as text: deterministic, diffable in review, and checked by `docs_tables --check` like the
tables (no plotting library is needed where the docs are generated; see `experiments.tables.forest`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


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
