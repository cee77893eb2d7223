"""The generated tables of README.md and docs/ (experiments.docs_tables): up to date, and the marker rules."""

import shutil
from pathlib import Path

import pytest

from experiments import docs_tables
from experiments.tables import sweep_files

ROOT = Path(__file__).resolve().parents[1]
PARAMS = "lra:params"  # computed from the model code (40 shape evaluations), checked on its own


def test_result_tables_are_up_to_date():
  paths = docs_tables.documents()
  assert ROOT / "README.md" in paths and ROOT / "docs" / "results.md" in paths
  stale = docs_tables.update(paths, check=True, select=lambda name: name != PARAMS)
  assert not stale, f"out of date (run `python -m experiments.docs_tables`): {stale}"


def test_the_table_files_beside_every_sweep_s_records_are_up_to_date():
  stale = sweep_files.update(check=True)
  assert not stale, f"out of date (run `python -m experiments.docs_tables`): {stale}"


def test_every_sweep_folder_s_table_files_are_checked_and_a_stale_one_is_named_then_rewritten(tmp_path, monkeypatch):
  """Every results.md under experiments/results is a folder `sweep_files` checks; on a copy of the LM folder, a
  changed results.md is named by the check (and left as it is), then rewritten to the committed text."""
  results = ROOT / "experiments" / "results"
  assert {p.parent.relative_to(results).as_posix() for p in results.rglob("results.md")} == set(sweep_files.FOLDERS)
  shutil.copytree(results / "lm", tmp_path / "lm")
  monkeypatch.setattr(sweep_files, "RESULTS", tmp_path)
  monkeypatch.setattr(sweep_files, "ROOT", tmp_path)
  monkeypatch.setattr(sweep_files, "FOLDERS", {"lm/sweep": "lm"})
  table = tmp_path / "lm" / "sweep" / "results.md"
  committed = table.read_text()
  assert sweep_files.update(check=True) == []
  table.write_text(committed.replace("| worse |", "| better |"))
  assert sweep_files.update(check=True) == ["lm/sweep/results.md"] and "| better |" in table.read_text()
  assert sweep_files.update(check=False) == ["lm/sweep/results.md"] and table.read_text() == committed


def test_parameter_count_table_is_up_to_date():
  stale = docs_tables.update(docs_tables.documents(), check=True, select=lambda name: name == PARAMS)
  assert not stale, f"out of date (run `python -m experiments.docs_tables`): {stale}"


def test_every_document_marks_tables_the_tool_knows():
  found = set()
  for path in docs_tables.documents():
    found |= {m.group("name") for m in docs_tables.MARKER.finditer(path.read_text())}
  assert set(docs_tables.TABLES) <= found  # every fixed table is shown somewhere
  for name in found:
    kind = name.partition(":")[0]
    assert name in docs_tables.TABLES or kind in docs_tables.PARAMETERIZED, name


def test_fill_rewrites_only_between_markers_with_links_relative_to_the_file():
  text = "intro\n<!-- table:lra:listops_paper begin -->\nold\n<!-- table:lra:listops_paper end -->\noutro\n"
  at_root, names = docs_tables.fill(text, ROOT)
  in_docs, _ = docs_tables.fill(text, ROOT / "docs")
  assert names == ["lra:listops_paper"]
  assert at_root.startswith("intro\n<!-- table:lra:listops_paper begin -->\n| run |") and at_root.endswith("outro\n")
  assert "old" not in at_root
  assert "](experiments/results/lra/listops_primalformer_paper_schedule.json)" in at_root
  assert "](../experiments/results/lra/listops_primalformer_paper_schedule.json)" in in_docs
  assert docs_tables.fill(at_root, ROOT)[0] == at_root  # idempotent


def test_a_quoted_marker_is_text_and_broken_markers_are_errors():
  quoted = "write `<!-- table:NAME begin -->` on its own line\n"
  assert docs_tables.fill(quoted, ROOT) == (quoted, [])
  with pytest.raises(ValueError, match="without its end marker: uea:table8"):
    docs_tables.fill("<!-- table:uea:table8 begin -->\n| x |\n", ROOT)
  with pytest.raises(ValueError, match="unknown table 'nope'"):
    docs_tables.fill("<!-- table:nope begin -->\n<!-- table:nope end -->\n", ROOT)
  with pytest.raises(ValueError, match="a character a table name cannot have .*: d4rl:t#4"):
    docs_tables.fill("<!-- table:d4rl:t#4 begin -->\n<!-- table:d4rl:t#4 end -->\n", ROOT)


def test_check_mode_reports_and_leaves_the_file_alone(tmp_path, capsys):
  doc = tmp_path / "doc.md"
  doc.write_text("<!-- table:uea:table8 begin -->\nstale\n<!-- table:uea:table8 end -->\n")
  before = doc.read_text()
  assert docs_tables.main(["--check", str(doc)]) == 1
  assert doc.read_text() == before
  assert "out of date: " in capsys.readouterr().out
  assert docs_tables.main([str(doc)]) == 0
  assert "| model | data-dependent W_e, W_r | paper | ours, honest protocol |" in doc.read_text()
  assert docs_tables.main(["--check", str(doc)]) == 0


def test_a_damaged_result_file_is_named_in_one_line(tmp_path, monkeypatch, capsys):
  """Issue 26, item 10: `--check` on a result file cut short ended in a bare JSONDecodeError traceback; it is
  one line naming the document, the table and the file, exit status 2, and nothing is written."""
  import json

  from experiments.tables import common

  monkeypatch.setattr(common, "RESULTS", tmp_path)
  (tmp_path / "spectrum_trial").mkdir()
  damaged = tmp_path / "spectrum_trial" / "spectrum.json"
  damaged.write_text('{"runs": [{"name": "a", "lay')  # a copy cut short
  run = tmp_path / "vit" / "sweep" / "runs" / "k0"
  run.mkdir(parents=True)
  (run / "result.json").write_text(json.dumps({"wall_seconds": 1.0, "runs": []})[:20])
  for table, path in [("spectrum:trial", damaged), ("vit:short", run / "result.json")]:
    doc = tmp_path / f"{table.replace(':', '_')}.md"
    doc.write_text(f"<!-- table:{table} begin -->\nold\n<!-- table:{table} end -->\n")
    assert docs_tables.main(["--check", str(doc)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("docs_tables: error: ") and f"table {table}: {path} (" in line and "is damaged" in line
    assert docs_tables.main([str(doc)]) == 2 and "old" in doc.read_text()  # nothing written
    capsys.readouterr()


def test_every_paired_table_has_its_forest_plot_and_the_plot_draws_the_tables_intervals():
  """Issue 55.7: a forest plot per paired table, drawn from the same rows: each plotted row's mean and Holm
  interval (or raw interval, for a comparison not tested) is a row of the table it plots. A forest computed from
  other rows than its table (the UEA eta table's release rows, read from table1_all) once drew other intervals."""
  import re

  block = r"<!-- table:{kind}:{name} begin -->(.*?)<!-- table:{kind}:{name} end -->"
  for doc in (ROOT / "docs" / "results.md", ROOT / "docs" / "uncertainty.md"):
    text = doc.read_text()
    for name in re.findall(r"<!-- table:paired:(\S+) begin -->", text):
      assert f"<!-- table:forest:{name} begin -->" in text, f"{doc.name}: paired:{name} has no forest plot"
    forests = re.findall(r"<!-- table:forest:(\S+) begin -->(.*?)<!-- table:forest:\1 end -->", text, re.S)
    assert forests, doc
    for name, plot in forests:
      table = re.search(block.format(kind="paired", name=re.escape(name)), text, re.S)
      family, _, rest = name.partition(":")
      table = table or re.search(block.format(kind=re.escape(family), name=re.escape(rest)), text, re.S)
      assert table, f"{doc.name}: forest:{name} plots no table of the page"
      rows = re.findall(r"  ([+-][\d.]+) (?:raw )?(\[[+-][\d.]+, [+-][\d.]+\]) ", plot)
      assert rows, f"forest:{name} draws no interval"
      for mean, interval in rows:
        row = rf"\| {re.escape(mean)} \|.*\| {re.escape(interval)} \|"
        assert re.search(row, table.group(1)), f"forest:{name}: {mean} {interval} is no row of its table"
