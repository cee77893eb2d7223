"""The paired difference of two table rows by seed, with its Student-t confidence interval and what it resolves.

Two rows of a sweep table (a model and its baseline, say Primal.+Trans. and Trans.) trained on the same seeds share
each seed's data split and initial draw, so the per-seed differences remove the seed-to-seed variation both rows
share; their mean, sample standard deviation and t interval say whether the difference is resolved by the seeds
at hand.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np
from scipy import stats

# The words of `Paired.verdict`.
HIGHER, LOWER, LEVEL, UNRESOLVED = "higher", "lower", "level", "unresolved"


@dataclasses.dataclass(frozen=True)
class Paired:
  """The paired difference a - b over `n` seeds both rows have.

  `mean`, `std`: mean and sample standard deviation (ddof=1) of the per-seed differences (std nan below 2 pairs);
  `low`, `high`: the two-sided Student-t confidence interval of the mean difference (nan below 2 pairs);
  `verdict`:
    "higher": the interval lies above zero: a is higher than b (a finding at this confidence);
    "lower": the interval lies below zero: a is lower than b (a finding);
    "level": the interval contains zero and lies strictly inside (-margin, margin): whatever the difference is, it
      is smaller than the margin (only with a margin; a conservative equivalence call, as the interval is the
      two-sided one at `confidence`, not the 1 - 2 alpha interval of a two one-sided tests procedure);
    "unresolved": anything else (the interval contains zero but reaches past the margin, no margin was given,
      fewer than 2 pairs, or a value is nan): the seeds do not tell.
  A finding takes precedence over "level": an interval that excludes zero reads "higher" or "lower" even where it
  lies inside the margin (`mean` tells the size).
  Every pair differing by the same nonzero amount (std 0, common where the metric is quantised: one test series of
  BasicMotions is 2.5 points) makes the t interval a point that excludes zero on any 2 seeds; the verdict then
  follows the sign test instead (all n differences of one sign: two-sided p = 2 * 0.5**n), a finding only where
  p < 1 - confidence (n >= 6 at 95%), "unresolved" otherwise. `low` and `high` stay the (zero-width) t interval.
  """

  n: int
  mean: float
  std: float
  low: float
  high: float
  verdict: str


def _verdict(low: float, high: float, margin: float | None) -> str:
  if low > 0:
    return HIGHER
  if high < 0:
    return LOWER
  if margin is not None and -margin < low <= 0 <= high < margin:
    return LEVEL
  return UNRESOLVED  # nan bounds fail every comparison above


def paired_difference(
  a: Mapping[int, float], b: Mapping[int, float], *, confidence: float = 0.95, margin: float | None = None
) -> Paired:
  """The difference a - b paired by seed (`a`, `b`: seed -> value; seeds only one of them has are left out).

  The interval is mean ± t_{(1 + confidence) / 2, n - 1} * std / sqrt(n). `margin` (>= 0, in the values' units):
  the largest difference that counts as "level" (see `Paired`); None: no difference is called level.
  """
  if not 0 < confidence < 1:
    raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
  if margin is not None and not margin >= 0:
    raise ValueError(f"margin must be >= 0 (or None), got {margin!r}")
  seeds = sorted(set(a) & set(b))
  differences = np.array([float(a[seed]) - float(b[seed]) for seed in seeds], dtype=np.float64)
  n = len(differences)
  if n < 2:
    mean = float(differences[0]) if n else math.nan
    return Paired(n, mean, math.nan, math.nan, math.nan, UNRESOLVED)
  mean, std = float(np.mean(differences)), float(np.std(differences, ddof=1))
  half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * std / math.sqrt(n)
  low, high = mean - half, mean + half
  verdict = _verdict(low, high, margin)
  if std == 0 and mean != 0 and 2 * 0.5**n >= 1 - confidence:  # no spread: the sign test cannot tell yet
    verdict = UNRESOLVED
  return Paired(n, mean, std, low, high, verdict)
