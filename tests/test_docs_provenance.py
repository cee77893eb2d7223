"""Numbers in the docs come from the records (issue 29, provenance): a number changed inside a generated section
fails `python -m experiments.docs_tables --check`, and the measured figures in README's results summary stand
inside generated sections or restate one of them."""

import re
from pathlib import Path

import pytest

from experiments import docs_tables, provenance

ROOT = Path(__file__).resolve().parents[1]
# Measured figures: decimals (3.129, 0.69), ratios (1.55x, 2x) and percentages (43%); counts and settings
# (3 seeds, 5,000 steps, Table 4) are not checked.
FIGURE = re.compile(r"(?<![\w.])(?:\d+(?:\.\d+)?%|\d+(?:,\d{3})*\.\d+x?|\d+(?:,\d{3})*x\b)")


def _section(text: str, heading: str) -> str:
  start = text.index(f"\n{heading}\n")
  end = text.find("\n## ", start + len(heading) + 2)
  return text[start : None if end < 0 else end]


def generated_text(paths=None) -> str:
  """Every generated section's body in README.md and docs/*.md, joined."""
  paths = docs_tables.documents() if paths is None else paths
  return "\n".join(m.group("body") for p in paths for m in docs_tables.MARKER.finditer(p.read_text()))


def unbacked_figures(prose: str, generated: str) -> list[str]:
  """The measured figures of `prose` outside its generated sections that no generated section states."""
  outside = docs_tables.MARKER.sub("", prose)
  return [
    figure
    for figure in FIGURE.findall(outside)
    if not re.search(r"(?<![\w.])" + re.escape(figure) + r"(?![\d])", generated)
  ]


def test_readme_results_state_only_figures_of_generated_sections():
  readme = (ROOT / "README.md").read_text()
  results = _section(readme, "## Results")
  generated = generated_text()
  assert docs_tables.MARKER.search(results)  # the summary's tables are generated
  assert unbacked_figures(results, generated) == []


def test_a_figure_of_no_record_in_the_readme_summary_is_named():
  results = _section((ROOT / "README.md").read_text(), "## Results")
  claim = results + "\nPrimal.+DT beats DT by 12.34 points, 42.42x faster, in 97.31% of seeds.\n"
  assert unbacked_figures(claim, generated_text()) == ["12.34", "42.42x", "97.31%"]


def _bounds(interval: str) -> tuple[float, float]:
  """ "[-2.8, +0.5]" -> (-2.8, 0.5)."""
  low, high = interval.strip("[]").split(", ")
  return float(low.replace(",", "")), float(high.replace(",", ""))


def unbacked_intervals(prose: str, generated: str) -> list[str]:
  """The intervals of `prose` outside its generated sections that no generated section states, to the decimals
  the prose prints or with its sign turned (a difference quoted the other way round: B - A for a table's A - B).
  A table's interval changes when a run lands (a mean, or Holm's family), so a hand-copied one goes stale."""
  stated = {_bounds(interval) for interval in provenance.INTERVAL.findall(generated)}
  out = []
  for interval in provenance.INTERVAL.findall(docs_tables.MARKER.sub("", prose)):
    digits = len(interval.split(", ")[0].rpartition(".")[2])
    quoted = _bounds(interval)
    rounded = {(round(a, digits), round(b, digits)) for a, b in stated}
    rounded |= {(round(-b, digits), round(-a, digits)) for a, b in stated}
    if not any(abs(a - quoted[0]) < 1e-9 and abs(b - quoted[1]) < 1e-9 for a, b in rounded):
      out.append(interval)
  return out


# docs/archive.md describes superseded runs as they were, so it is not checked.
PROSE = ["README.md"] + sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md") if p.name != "archive.md")


@pytest.mark.parametrize("document", PROSE)
def test_every_interval_in_the_prose_is_one_a_generated_table_states(document):
  """README and docs prose quote intervals from the generated tables; each must still be one of them (rounded,
  or negated)."""
  assert unbacked_intervals((ROOT / document).read_text(), generated_text()) == []


def test_a_stale_interval_in_the_prose_is_named():
  generated = "| x | +1.9 | [-8.0, +4.3] | [-18.74, +14.91] |"
  prose = "level: -1.9 [-4.3, +8.0], Holm [-14.9, +18.7]; stale: [-14.9, +18.8] and [-8.0, +4.4]"
  assert unbacked_intervals(prose, generated) == ["[-14.9, +18.8]", "[-8.0, +4.4]"]


# (document, table, a figure of the record that the table shows)
TAMPERED = [
  ("README.md", "d4rl:table4_shared", "37.2 ± 5.9"),
  ("README.md", "vs_release_summary:vs_release_2026_12_06", "1.57-1.78x"),
  ("docs/benchmarks.md", "step_profile:step_profile", "dW = X^T dY 28-60%"),
  ("docs/results.md", "lm:enwiki", "3.129 ± 0.026"),
]


@pytest.mark.parametrize("document, table, figure", TAMPERED)
def test_a_number_changed_in_a_generated_section_fails_the_check(document, table, figure):
  """Each generated section is rewritten from its record: a figure edited by hand in it is out of date for
  `--check`, and the regenerated section states the record's figure again."""
  path = ROOT / document
  text = path.read_text()
  select = {"select": lambda name: name == table}
  match = next(m for m in docs_tables.MARKER.finditer(text) if m.group("name") == table)
  assert figure in match.group("body")
  tampered_figure = re.sub(r"\d", lambda d: str((int(d.group()) + 1) % 10), figure, count=1)
  body = match.group("body").replace(figure, tampered_figure, 1)
  tampered = text[: match.start("body")] + body + text[match.end("body") :]
  assert docs_tables.fill(text, path.parent, **select)[0] == text  # as committed: up to date
  regenerated, _ = docs_tables.fill(tampered, path.parent, **select)
  assert regenerated != tampered and regenerated == text


def test_check_exits_one_on_a_tampered_copy(tmp_path, capsys):
  """The command-line check (what CI runs) on a copy: passes as generated, fails once a number is changed."""
  table = "d4rl:table4_shared"  # no links, so a copy elsewhere renders the same
  match = next(m for m in docs_tables.MARKER.finditer((ROOT / "README.md").read_text()) if m.group("name") == table)
  copy = tmp_path / "doc.md"
  copy.write_text(match.group(0) + "\n")
  assert docs_tables.main(["--check", str(copy)]) == 0
  copy.write_text(match.group(0).replace("35.4 ± 2.1", "45.4 ± 2.1") + "\n")
  assert docs_tables.main(["--check", str(copy)]) == 1
  out = capsys.readouterr().out
  assert "out of date: " in out and table in out
