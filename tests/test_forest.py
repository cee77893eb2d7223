"""The text forest plots of the docs (experiments.tables.forest), on intervals worked out by hand."""

from __future__ import annotations

import math

import pytest

from experiments.tables.text_plot import forest_lines


def test_forest_lines_place_intervals_mean_and_zero_on_one_axis():
  """Axis -1..+8 (every finite value and zero) over 11 columns: column round((x + 1) / 9 * 10), zero at 1. Row a:
  Holm [-1, +5] as '=' (columns 0-7), raw [+1, +3] as '-' (2-4), mean +2 as 'o' (3), zero crossed ('+'); row b:
  one pair, a mean (column 10) and no interval; row c: no pairs."""
  nan = math.nan
  lines = forest_lines(
    ["a", "bb", "c"],
    [(2.0, 1.0, 3.0, -1.0, 5.0), (8.0, nan, nan, nan, nan), (nan, nan, nan, nan, nan)],
    ["unresolved", "unresolved", "unresolved"],
    width=11,
    digits=0,
  )
  assert lines[0] == "    -1       +8"
  assert lines[1] == "    <0        >"
  assert lines[2] == "a   =+-o-===     +2 [-1, +5] unresolved"
  assert lines[3] == "bb   |        o  +8 (one pair: no interval) unresolved"
  assert lines[4] == "c    |           no interval unresolved"


def test_forest_lines_show_a_finding_clear_of_zero_and_never_minus_zero():
  lines = forest_lines(["x"], [(-0.04, -0.3, 0.2, -0.5, 0.4)], ["level"], width=11, digits=1)
  assert lines[2].endswith("+0.0 [-0.5, +0.4] level")  # -0.04 rounds to zero: shown as +0.0
  # Axis 0..7 over 8 columns (column = value): zero clear of Holm [+3, +7], so drawn as '|'.
  finding = forest_lines(["y"], [(5.0, 4.0, 6.0, 3.0, 7.0)], ["better"], width=8, digits=0)
  assert finding[2] == "y  |  =-o-=  +5 [+3, +7] better"
  with pytest.raises(ValueError, match="differ in length"):
    forest_lines(["x"], [], ["level"])


def test_an_untested_row_shows_its_raw_interval_labelled_raw():
  """A comparison with no corrected interval (a side did not learn) draws its raw interval and says so."""
  lines = forest_lines(
    ["a", "b"], [(1.0, 0.5, 1.5, 0.2, 1.8), (-1.0, -2.0, 0.0, math.nan, math.nan)], ["better", "did not learn"]
  )
  assert lines[2].endswith("+1.0 [+0.2, +1.8] better") and lines[3].endswith("-1.0 raw [-2.0, +0.0] did not learn")
  assert "=" not in lines[3] and "-" in lines[3].split("  ")[1]
