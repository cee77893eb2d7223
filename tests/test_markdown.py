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
