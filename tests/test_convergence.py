"""Issue 55 item 3: whether a run converged, from its validation curve (experiments/engine/convergence.py)."""

import pytest

from experiments.engine.convergence import convergence, describe

RISING = [[1000, 0.80], [2000, 0.84], [3000, 0.86], [4000, 0.88]]  # last quarter: after step 3,000
FLAT = [[1000, 0.80], [2000, 0.870], [3000, 0.880], [4000, 0.881]]
PEAKED = [[1000, 0.80], [2000, 0.885], [3000, 0.88], [4000, 0.879]]


def test_a_curve_still_rising_in_its_last_quarter_has_not_plateaued():
  got = convergence(RISING)
  assert got == {"best_step": 4000, "last_step": 4000, "tail_gain": pytest.approx(0.02, abs=1e-12), "plateaued": False}


def test_a_flat_last_quarter_plateaus_even_where_the_best_step_is_the_last():
  got = convergence(FLAT)
  assert got["best_step"] == 4000 and got["tail_gain"] == pytest.approx(0.001, abs=1e-12) and got["plateaued"]
  peaked = convergence(PEAKED)
  assert peaked["best_step"] == 2000 and peaked["tail_gain"] == pytest.approx(-0.006, abs=1e-12)
  assert peaked["plateaued"]


def test_ties_take_the_latest_step_and_a_loss_curve_is_signed():
  assert convergence([[1, 0.5], [2, 0.7], [3, 0.7], [4, 0.7]])["best_step"] == 4
  loss = convergence([[1000, 2.0], [2000, 1.0], [3000, 0.9], [4000, 0.5]], higher_is_better=False)
  assert loss["best_step"] == 4000 and loss["tail_gain"] == pytest.approx(0.4) and not loss["plateaued"]


def test_a_curve_too_short_to_judge_is_refused_in_one_line():
  for bad in ([], [[1000, 0.5]], [[3000, 0.5], [4000, 0.6]]):
    with pytest.raises(ValueError, match="curve") as info:
      convergence(bad)
    assert "\n" not in str(info.value)


def test_describe_summarises_runs_in_points():
  cell = describe([convergence(RISING), convergence(FLAT), convergence(PEAKED)])
  assert cell == "2 of 3 plateaued; best at 2,000-4,000 of 4,000; last quarter -0.6 to +2.0"
  assert describe([]) == "-"
