"""The paired difference by seed (experiments.engine.stats) on numbers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from experiments.engine.stats import Paired, paired_difference

T_975_4 = 2.7764451051977987  # Student t, 97.5% quantile, 4 degrees of freedom (tables: 2.776)
T_975_2 = 4.302652729749464  # 2 degrees of freedom (tables: 4.303)


def test_differences_one_to_five_by_hand():
  """Differences 1..5: mean 3, sd sqrt(2.5), interval 3 ± 2.7764 * sqrt(2.5) / sqrt(5) = [1.0368, 4.9632]."""
  a = {seed: 10.0 + seed for seed in range(1, 6)}
  b = {seed: 10.0 for seed in range(1, 6)}
  paired = paired_difference(a, b)
  half = T_975_4 * math.sqrt(2.5) / math.sqrt(5)
  assert paired.n == 5 and paired.mean == pytest.approx(3.0) and paired.std == pytest.approx(math.sqrt(2.5))
  assert (paired.low, paired.high) == (pytest.approx(3 - half), pytest.approx(3 + half))
  assert (round(paired.low, 4), round(paired.high, 4)) == (1.0368, 4.9632)
  assert paired.verdict == "higher"
  flipped = paired_difference(b, a)  # b - a: the mirror interval, a lower finding
  assert (flipped.mean, flipped.low, flipped.high) == (
    pytest.approx(-3),
    pytest.approx(-3 - half),
    pytest.approx(-3 + half),
  )
  assert flipped.verdict == "lower"


def test_pairs_by_seed_not_position_and_ignores_unpaired_seeds():
  a = {2: 5.0, 0: 1.0, 1: 4.0, 7: 100.0}  # seed 7: no baseline run
  b = {0: 0.0, 1: 2.0, 2: 2.0, 9: -50.0}  # seed 9: no compared run
  paired = paired_difference(a, b)  # differences 1, 2, 3
  differences = np.array([1.0, 2.0, 3.0])
  half = T_975_2 * np.std(differences, ddof=1) / np.sqrt(3)
  assert paired == Paired(
    3, pytest.approx(2.0), pytest.approx(1.0), pytest.approx(2 - half), pytest.approx(2 + half), "unresolved"
  )
  assert paired.low < 0 < paired.high  # 2 ± 2.48: three seeds do not resolve it


def test_below_two_pairs_is_unresolved_with_nan_interval():
  one = paired_difference({0: 3.0, 1: 9.0}, {0: 1.0, 2: 0.0})
  assert one.n == 1 and one.mean == 2.0 and one.verdict == "unresolved"
  assert all(math.isnan(x) for x in (one.std, one.low, one.high))
  none = paired_difference({0: 1.0}, {1: 1.0}, margin=5.0)
  assert none.n == 0 and math.isnan(none.mean) and none.verdict == "unresolved"


def test_level_needs_a_margin_the_interval_lies_inside():
  """Differences 0.1, -0.1, 0.2, -0.2: mean 0, sd sqrt(0.1/3), interval ± t_{0.975,3} sd / 2 = ± 0.2905."""
  a = {0: 50.1, 1: 49.9, 2: 50.2, 3: 49.8}
  b = {seed: 50.0 for seed in range(4)}
  half = 3.182446305284263 * math.sqrt(0.1 / 3) / 2
  paired = paired_difference(a, b, margin=0.5)
  assert paired.mean == pytest.approx(0.0, abs=1e-12) and paired.high == pytest.approx(half)
  assert paired.verdict == "level"
  assert paired_difference(a, b).verdict == "unresolved"  # no margin: nothing is called level
  assert paired_difference(a, b, margin=0.25).verdict == "unresolved"  # the interval reaches past ±0.25
  wide = paired_difference(a, b, confidence=0.999, margin=0.5)  # t_{0.9995,3} = 12.92: ±1.18
  assert wide.high > 0.5 and wide.verdict == "unresolved"


def test_a_finding_inside_the_margin_is_still_a_finding():
  paired = paired_difference({0: 1.2, 1: 1.21, 2: 1.19}, {0: 1.0, 1: 1.0, 2: 1.0}, margin=10.0)  # 0.2 ± 0.025
  assert paired.low > 0 and paired.verdict == "higher"


def test_a_constant_difference_has_a_point_interval():
  paired = paired_difference({0: 2.0, 1: 3.0}, {0: 1.0, 1: 2.0})  # a point interval, but 2 seeds: no finding
  assert (paired.mean, paired.std, paired.low, paired.high, paired.verdict) == (1.0, 0.0, 1.0, 1.0, "unresolved")


@pytest.mark.parametrize(
  ("kwargs", "message"),
  [
    ({"confidence": 1.0}, "confidence must lie in \\(0, 1\\), got 1.0"),
    ({"confidence": 0}, "confidence must lie in \\(0, 1\\), got 0"),
    ({"confidence": math.nan}, "confidence must lie"),
    ({"margin": -0.1}, "margin must be >= 0 \\(or None\\), got -0.1"),
  ],
)
def test_bad_arguments_are_refused_in_one_line(kwargs, message):
  with pytest.raises(ValueError, match=message) as err:
    paired_difference({0: 1.0, 1: 2.0}, {0: 0.0, 1: 0.0}, **kwargs)
  assert "\n" not in str(err.value)


def test_identical_nonzero_differences_need_the_sign_test():
  """A quantised metric (one BasicMotions test series is 2.5 points) gave +2.5 on each of 3 seeds: std 0, a point
  interval [+2.5, +2.5] that read "better". With no spread the sign test decides: 2 * 0.5**n < 0.05 from n = 6."""
  for n, verdict in ((2, "unresolved"), (3, "unresolved"), (5, "unresolved"), (6, "higher")):
    paired = paired_difference({s: 100.0 for s in range(n)}, {s: 97.5 for s in range(n)}, margin=1.0)
    assert (paired.low, paired.high, paired.verdict) == (2.5, 2.5, verdict), n
  assert paired_difference({s: 0.0 for s in range(6)}, {s: 2.5 for s in range(6)}).verdict == "lower"
  same = paired_difference({0: 97.5, 1: 100.0}, {0: 97.5, 1: 100.0}, margin=1.0)  # zero differences: level
  assert (same.low, same.high, same.verdict) == (0.0, 0.0, "level")
  loose = paired_difference({s: 1.0 for s in range(5)}, {s: 0.0 for s in range(5)}, confidence=0.9)
  assert loose.verdict == "higher"  # 2 * 0.5**5 = 0.0625 < 0.1


def test_paired_p_value_is_the_t_test_and_the_interval_edge():
  """Differences 1..5: t = 3 / (sqrt(2.5) / sqrt(5)) = 4.2426 on 4 df, two-sided p = 0.013236 (t tables)."""
  from scipy import stats as scipy_stats

  from experiments.engine.stats import paired_p_value

  a = {seed: 10.0 + seed for seed in range(1, 6)}
  b = {seed: 10.0 for seed in range(1, 6)}
  p = paired_p_value(a, b)
  assert p == pytest.approx(0.0132356, abs=2e-7)
  assert p == pytest.approx(scipy_stats.ttest_rel([a[s] for s in a], [b[s] for s in a]).pvalue, rel=1e-12)
  # The (1 - p) interval has zero on its edge.
  assert paired_difference(a, b, confidence=1 - p).low == pytest.approx(0.0, abs=1e-9)
  assert math.isnan(paired_p_value({0: 1.0}, {0: 0.0}))
  assert paired_p_value({i: 2.5 for i in range(4)}, {i: 0.0 for i in range(4)}) == 2 * 0.5**4  # sign test
  assert paired_p_value({i: 1.0 for i in range(4)}, {i: 1.0 for i in range(4)}) == 1.0


def test_holm_adjusts_step_down_on_a_worked_example():
  """p = (0.01, 0.04, 0.03, 0.005), m = 4: sorted 0.005, 0.01, 0.03, 0.04 -> 0.02, 0.03, 0.06, 0.06 (by hand)."""
  from experiments.engine.stats import holm, holm_confidences

  adjusted = holm([0.01, 0.04, 0.03, 0.005])
  np.testing.assert_allclose(adjusted, [0.03, 0.06, 0.06, 0.02], rtol=1e-12)
  assert list(adjusted <= 0.05) == [True, False, False, True]  # Bonferroni (x4) would keep only 0.005
  np.testing.assert_allclose(holm_confidences([0.01, 0.04, 0.03, 0.005]), [1 - 0.05 / 3, 0.95, 1 - 0.05 / 2, 0.9875])
  nan = holm([0.2, math.nan, 0.01])  # an untestable comparison is not counted in m
  assert math.isnan(nan[1]) and nan[2] == pytest.approx(0.02) and nan[0] == pytest.approx(0.2)
  assert holm([0.6, 0.7]).tolist() == [1.0, 1.0]  # capped at 1
  with pytest.raises(ValueError, match="p-values must lie in"):
    holm([1.5])


def test_holm_levels_of_tied_p_values_do_not_depend_on_the_familys_order():
  """Two comparisons with equal differences have equal p; Holm's step-down decides both at the first of them
  (alpha / 3 here, m = 3), so both intervals take that level, whichever is listed first (by hand: 0.02, 0.02, then
  0.5 at the last step). Before, the tie's second member took alpha / 2 or alpha / 3 by its place in the list."""
  from experiments.engine.stats import holm, holm_confidences

  levels = holm_confidences([0.02, 0.02, 0.5])
  np.testing.assert_allclose(levels, [1 - 0.05 / 3, 1 - 0.05 / 3, 0.95], rtol=1e-15)
  np.testing.assert_allclose(holm_confidences([0.5, 0.02, 0.02]), levels[::-1], rtol=1e-15)
  np.testing.assert_allclose(holm([0.02, 0.02, 0.5]), [0.06, 0.06, 0.5], rtol=1e-12)  # equal adjusted p
  assert holm_confidences([0.02, 0.02 * (1 + 1e-9)]).tolist() == [0.975, 0.95]  # not a tie: its own step


def test_summary_statistics_give_the_same_p_and_interval_as_the_differences():
  """`summary_p_value` / `summary_interval` from (n, mean, std) alone equal the paired test and interval computed
  from the differences (1, 2, 3, 4, 5 against zeros: mean 3, sd sqrt(2.5)), and refuse what cannot be tested."""
  from experiments.engine.stats import paired_p_value, summary_interval, summary_p_value

  a, b = {s: float(s + 1) for s in range(5)}, dict.fromkeys(range(5), 0.0)
  sd = math.sqrt(2.5)
  assert summary_p_value(5, 3.0, sd) == pytest.approx(paired_p_value(a, b), rel=1e-12)
  t = 3.0 / (sd / math.sqrt(5))  # 4.2426 on 4 df: two-sided p 0.01324
  assert summary_p_value(5, 3.0, sd) == pytest.approx(0.013236, abs=2e-6) and t == pytest.approx(4.2426, abs=1e-4)
  low, high = summary_interval(5, 3.0, sd, 0.95)
  p = paired_difference(a, b)
  assert (low, high) == (pytest.approx(p.low), pytest.approx(p.high))
  assert high - 3.0 == pytest.approx(T_975_4 * sd / math.sqrt(5))
  assert math.isnan(summary_p_value(1, 3.0, None)) and math.isnan(summary_p_value(3, 1.0, math.nan))
  assert summary_p_value(3, 0.0, 0.0) == 1.0 and summary_p_value(3, 2.0, 0.0) == 0.25  # the sign test
  assert all(math.isnan(x) for x in summary_interval(3, 1.0, 0.5, math.nan))
