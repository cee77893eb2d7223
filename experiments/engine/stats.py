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
  low, high = summary_interval(n, mean, std, confidence)
  verdict = _verdict(low, high, margin)
  if std == 0 and mean != 0 and 2 * 0.5**n >= 1 - confidence:  # no spread: the sign test cannot tell yet
    verdict = UNRESOLVED
  return Paired(n, mean, std, low, high, verdict)


def paired_p_value(a: Mapping[int, float], b: Mapping[int, float]) -> float:
  """Two-sided p-value of the paired t test of a - b = 0 by seed (nan below 2 pairs or for no spread).

  No spread with a nonzero mean (every pair differs by the same amount) is the sign test's p = 2 * 0.5**n, the
  rule `paired_difference` follows there; no spread with a zero mean is p = 1.
  """
  seeds = sorted(set(a) & set(b))
  differences = np.array([float(a[seed]) - float(b[seed]) for seed in seeds], dtype=np.float64)
  n = len(differences)
  if n < 2 or not np.all(np.isfinite(differences)):
    return math.nan
  return summary_p_value(n, float(np.mean(differences)), float(np.std(differences, ddof=1)))


def summary_p_value(n: int, mean: float, std: float | None) -> float:
  """`paired_p_value` from the differences' count, mean and sample std alone (a record that kept only those): nan
  below 2 pairs or for a nan / missing value; the sign test's p where std is 0 with a nonzero mean."""
  if n < 2 or std is None or not (math.isfinite(mean) and math.isfinite(std)):
    return math.nan
  if std == 0:
    return 1.0 if mean == 0 else min(1.0, 2 * 0.5**n)
  t = mean / (std / math.sqrt(n))
  return float(2 * stats.t.sf(abs(t), n - 1))


def summary_interval(n: int, mean: float, std: float | None, confidence: float) -> tuple[float, float]:
  """The Student-t interval mean ± t_{(1 + confidence) / 2, n - 1} std / sqrt(n) (as `paired_difference`'s) from
  the summary statistics; (nan, nan) below 2 pairs, for a missing std or a nan confidence."""
  if n < 2 or std is None or not (math.isfinite(std) and math.isfinite(confidence)):
    return math.nan, math.nan
  half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * std / math.sqrt(n)
  return mean - half, mean + half


def holm(p_values: list[float] | np.ndarray) -> np.ndarray:
  """Holm's step-down adjusted p-values of one family of m tests (Holm 1979), in the order given.

  Sorted ascending p_(1) <= ... <= p_(m): adjusted p_(k) = max_{j <= k} min(1, (m - j + 1) p_(j)). A test is a
  finding at family-wise level alpha iff its adjusted p-value is <= alpha. A nan p-value (a comparison that cannot
  be tested) stays nan and does not count in m.
  """
  p = np.asarray(p_values, dtype=np.float64)
  if np.any((p < 0) | (p > 1)):
    raise ValueError(f"p-values must lie in [0, 1], got {p[(p < 0) | (p > 1)].tolist()}")
  out = np.full(p.shape, np.nan)
  tested = np.flatnonzero(np.isfinite(p))
  m = len(tested)
  order = tested[np.argsort(p[tested], kind="stable")]
  running = 0.0
  for j, index in enumerate(order):
    running = max(running, min(1.0, (m - j) * p[index]))
    out[index] = running
  return out


def holm_confidences(p_values: list[float] | np.ndarray, confidence: float = 0.95) -> np.ndarray:
  """The confidence of each test's corrected interval: 1 - alpha / (m - k + 1) for the test of rank k of m.

  Ranks as in `holm` (ascending p, nan left out and given nan). The interval at that level excludes zero exactly
  when the test's own Holm step rejects (p_(k) <= alpha / (m - k + 1)); a test is a finding only where its adjusted
  p-value is <= alpha as well, as Holm stops at the first step that does not reject. Tied p-values (equal to 12
  significant digits: equal differences give them) share the level of the first of them, the step that decides
  them all, so a test's interval does not depend on the order the family is listed in.
  """
  alpha = 1 - confidence
  p = np.asarray(p_values, dtype=np.float64)
  out = np.full(p.shape, np.nan)
  tested = np.flatnonzero(np.isfinite(p))
  m = len(tested)
  first, previous = 0, None
  for k, index in enumerate(tested[np.argsort(p[tested], kind="stable")]):
    if previous is None or not np.isclose(p[index], previous, rtol=1e-12, atol=0.0):
      first, previous = k, p[index]
    out[index] = 1 - alpha / (m - first)
  return out
