"""A results table's cells and rows: `Cell` (a table row's labels and the paper's number) and `Row` (a cell's
finished seeds under one protocol). Below `spec`, `paired` and `aggregate`, which all read them."""

from __future__ import annotations

import dataclasses
import math

import numpy as np


@dataclasses.dataclass(frozen=True)
class Cell:
  """One row of a results table: `labels` are its (column, value) pairs, `paper` the paper's accuracy (%)."""

  table: str
  labels: tuple[tuple[str, str], ...]
  paper: float | None = None


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
  seeds: tuple[int, ...] = ()  # the seed of each accuracy (paired differences pair rows by seed)
  # The best validation accuracy (%) of each seed's run (summary `best_validation`), nan where its record has none:
  # whether a run learned at all (`Sweep.chance`) is judged on validation, which the test value never selects.
  validations: tuple[float, ...] = ()
  # The run directory whose record gave each accuracy (`records.record_dir`: a clean rerun's, or the sweep's own), in
  # the order of `accuracies`: where the tables read each run's code, device and parameter count.
  sources: tuple[str, ...] = ()

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
