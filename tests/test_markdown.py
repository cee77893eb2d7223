"""primal_jax.markdown: the one Markdown-table writer."""

import pytest

from primal_jax import markdown


def test_table_aligns_numbers_right_from_numeric_from():
  text = markdown.table(["model", "N", "ms"], [["softmax", 1024, "1.5"], ["primal", 2048, "0.7"]], numeric_from=2)
  assert text.splitlines() == [
    "| model | N | ms |",
    "|---|---|---:|",
    "| softmax | 1024 | 1.5 |",
    "| primal | 2048 | 0.7 |",
  ]


def test_table_with_explicit_alignments_and_no_rows():
  assert markdown.table(["a", "b"], [], aligns="rl") == "| a | b |\n|---:|---|"
  with pytest.raises(ValueError, match="2 alignments for 3 columns"):
    markdown.table(["a", "b", "c"], [], aligns="rl")
  with pytest.raises(ValueError, match="'l' or 'r'"):
    markdown.table(["a"], [], aligns="c")


def test_padded_table_reads_as_plain_text():
  text = markdown.table(["name", "value"], [["x", "1.5"], ["longer", "10"]], aligns="lr", pad=True)
  assert text.splitlines() == [
    "| name   | value |",
    "|--------|------:|",
    "| x      |   1.5 |",
    "| longer |    10 |",
  ]


def test_fixed_rounds_and_never_prints_minus_zero():
  """A value that rounds to zero is 0 at the requested digits, signed or not: +-1e-17 from a host's BLAS must
  not change a generated table."""
  fixed = markdown.fixed
  cases = [fixed(-1e-17), fixed(1e-17), fixed(-0.004), fixed(-0.006), fixed(2.0, 0), fixed(-1e-17, 1, "+")]
  assert cases == ["0.00", "0.00", "0.00", "-0.01", "2", "+0.0"]
  assert fixed(0.25, 1, "+") == "+0.2" and fixed(-1.25, 1) == "-1.2"  # round half to even, as round() does
