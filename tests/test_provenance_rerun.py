"""Reruns of unclean records and the provenance check (issue 55 item 6): a run whose record is legacy (no commit) or
from a dirty tree is trained again into `<family>/rerun/` (`experiments.sweep --unclean_in`), the tables read the
clean rerun in its place (`experiments.engine.records.record_dir`, the one lookup), and `python -m
experiments.provenance` lists what each docs table reads and fails where a README table reads an unclean record.

The workdirs here are hand-made in the real layout (runs/<key>/result.json and summary.json, as the sweep writes
them): one clean, one legacy and one dirty record."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments import docs_tables
from experiments import provenance as check
from experiments.docs_tables import render_table
from experiments.engine.aggregate import aggregate, stored_rows
from experiments.engine.records import originals, record_dir, rerun_folder, run_origin
from experiments.engine.runner import run_sweep
from experiments.engine.spec import Cell, Run, Sweep, plan
from experiments.tables import common
from experiments.tables.sweeps import provenance
from primal_jax.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CLEAN, DIRTY, RERUN, RERUN_2, DIRTY_RERUN = ("a" * 40, "b" * 40, "c" * 40, "e" * 40, "d" * 40)
CPU = {"platform": "cpu", "kind": "cpu", "count": 1}
CELL = Cell("fashion_mnist", (("dataset", "fashion_mnist"), ("model", "DeiT")), 74.2)


def tiny_sweep(data_dir: str = "/nonexistent") -> Sweep:
  """Three seeds of one row, 2-step UEA smoke runs (the vit table's cell, so its docs table reads them)."""
  overrides = {"total_steps": 2, "data.data_dir": data_dir, "checkpoint_on_eval": False}
  return Sweep(tuple(Run("uea:smoke", CELL, seed, "honest", overrides) for seed in range(3)))


def write_run(run_dir: Path, seed: int, accuracy: float, commit: str | None = None, dirty: bool | None = None) -> None:
  """A finished run's record as the sweep writes it; `commit` None: a legacy record (no provenance, no devices)."""
  origin = {} if commit is None else {"provenance": {"commit": commit, "dirty": dirty, "devices": CPU}, "devices": CPU}
  summary = {"test_at_best_validation": {"step": 2, "accuracy": accuracy}, "num_params": 100, **origin}
  entry = {"cell": dataclasses.asdict(CELL), "seed": seed, "protocol": "honest"}
  run_dir.mkdir(parents=True)
  (run_dir / "summary.json").write_text(json.dumps(summary))
  result = {"key": run_dir.name, "wall_seconds": 60.0 * (seed + 1), "runs": [entry], "summary": summary}
  (run_dir / "result.json").write_text(json.dumps(result))


@pytest.fixture
def records(tmp_path):
  """experiments/results/vit/{sweep,rerun} in tmp_path: the sweep's runs clean (seed 0), legacy (1) and dirty (2);
  a clean rerun of the legacy run and a dirty rerun of the dirty one. Returns (sweep folder, run keys)."""
  keys = list(plan(tiny_sweep().runs))
  folder = tmp_path / "vit" / "sweep"
  write_run(folder / "runs" / keys[0], 0, 0.80, CLEAN, False)
  write_run(folder / "runs" / keys[1], 1, 0.70)
  write_run(folder / "runs" / keys[2], 2, 0.60, DIRTY, True)
  write_run(tmp_path / "vit" / "rerun" / "runs" / keys[1], 1, 0.90, RERUN, False)
  write_run(tmp_path / "vit" / "rerun" / "runs" / keys[2], 2, 0.95, DIRTY_RERUN, True)
  return folder, keys


def test_origins_of_clean_legacy_and_dirty_records(records):
  folder, keys = records
  origins = [run_origin(folder / "runs" / key) for key in keys]
  assert [o.state for o in origins] == ["clean", "legacy, no commit", "dirty tree"]
  assert [o.clean for o in origins] == [True, False, False]
  assert [o.devices for o in origins] == [CPU, None, CPU]
  assert rerun_folder(folder) == folder.parent / "rerun"
  assert rerun_folder(folder.parent / "uea_table1") == folder.parent / "uea_table1" / "rerun"  # runs in the family


def test_tables_read_a_clean_rerun_in_place_of_its_original(records):
  """The lookup: the rerun where its record is finished and clean (the legacy run's), else the sweep's own (the
  dirty run's rerun is dirty too); `originals()` reads the sweep's own. `stored_rows` and `aggregate` agree."""
  folder, keys = records
  rerun = folder.parent / "rerun" / "runs"
  own = [folder / "runs" / key for key in keys]
  assert [record_dir(folder, key) for key in keys] == [own[0], rerun / keys[1], own[2]]
  with originals():
    assert [record_dir(folder, key) for key in keys] == [folder / "runs" / key for key in keys]
  (row,) = stored_rows(folder)
  (planned,) = aggregate(tiny_sweep(), folder)
  for found in (row, planned):
    assert found.accuracies == pytest.approx((80.0, 90.0, 60.0)) and found.seeds == (0, 1, 2)
    assert found.sources == (str(folder / "runs" / keys[0]), str(rerun / keys[1]), str(folder / "runs" / keys[2]))
    assert found.wall_seconds == (60.0, 120.0, 180.0)
  assert provenance(row) == "dirty tree: 1 of 3; rerun: 1 of 3"
  with originals():
    (original,) = stored_rows(folder)
  assert original.accuracies == pytest.approx((80.0, 70.0, 60.0))
  assert provenance(original) == "legacy, no commit: 1 of 3; dirty tree: 1 of 3"


def test_the_docs_table_says_rerun_and_original_shows_the_superseded_records(records, monkeypatch):
  folder, keys = records
  monkeypatch.setattr(common, "RESULTS", folder.parent.parent)
  rerun = folder.parent / "rerun" / "runs" / keys[2]
  (rerun / "summary.json").unlink()  # the dirty rerun replaced by a clean one (a tmp folder; never done to records)
  (rerun / "result.json").unlink()
  rerun.rmdir()
  write_run(rerun, 2, 0.95, RERUN_2, False)
  (row,) = stored_rows(folder)
  assert provenance(row) == "aaaaaaa; rerun: ccccccc, eeeeeee"
  table = render_table("vit:fashion_mnist", folder)
  mean, std = np.mean([80.0, 90.0, 95.0]), np.std([80.0, 90.0, 95.0], ddof=1)
  code = "aaaaaaa; rerun: ccccccc, eeeeeee"
  assert f"| DeiT | - | 100 | 74.2 | {mean:.1f} ± {std:.1f} | not recorded | - | 2.0 min | CPU | {code} |" in table
  superseded = render_table("original:vit:fashion_mnist", folder)
  mean, std = np.mean([80.0, 70.0, 60.0]), np.std([80.0, 70.0, 60.0], ddof=1)
  assert f"| {mean:.1f} ± {std:.1f} |" in superseded
  assert superseded.endswith("| legacy, no commit: 1 of 3; dirty tree: 1 of 3 |")


def test_the_check_lists_what_a_table_reads_and_judges_it(records, monkeypatch):
  """The records a table reads are its rows' (the rerun where clean); a README table fails on an unclean one, a docs
  table fails only where its text does not say so, docs/archive.md never."""
  folder, keys = records
  monkeypatch.setattr(common, "RESULTS", folder.parent.parent)
  text, read = check.table_records("vit:fashion_mnist", folder)
  rerun = folder.parent / "rerun" / "runs"
  assert [r.path for r in read] == sorted([folder / "runs" / keys[0], rerun / keys[1], folder / "runs" / keys[2]])
  assert sorted(r.origin.state for r in read) == ["clean", "clean", "dirty tree"]
  assert check.TableCheck("README.md", "vit:fashion_mnist", text, read).failure() == (
    "a README table reads records that are not clean"
  )
  assert check.TableCheck("docs/results.md", "vit:fashion_mnist", text, read).failure() is None  # its code column
  text, read = check.table_records("original:vit:fashion_mnist", folder)
  by_key = {r.path.name: r.origin for r in read}  # records in path order; keys[i] is seed i's run
  assert [r.path for r in read] == sorted(folder / "runs" / key for key in keys)
  assert [by_key[key].state for key in keys] == ["clean", "legacy, no commit", "dirty tree"]
  assert [by_key[key].devices is None for key in keys] == [False, True, False]  # the legacy record names no device
  silent = check.TableCheck("docs/results.md", "paired:x", "| DeiT | +1.0 |", read)
  assert silent.failure() == "reads legacy, no commit and dirty tree records and does not say so"
  assert check.TableCheck("docs/archive.md", "paired:x", "| DeiT | +1.0 |", read).failure() is None
  clean = [r for r in read if r.origin.clean]
  assert check.TableCheck("README.md", "vit:fashion_mnist", text, tuple(clean)).failure() is None


def test_the_check_command_sees_json_records_a_table_opens(tmp_path, monkeypatch, capsys):
  """A table that reads a JSON record of its own (not a sweep run) is seen through the files it opens: legacy and
  unsaid in a docs page, exit 1 naming the file; once generated, the page says so in a line under the table (not in
  README.md, whose records must be clean), exit 0; the same record naming a clean commit, no line."""
  monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
  path = tmp_path / "results" / "lra" / "listops_primalformer_paper_schedule.json"
  path.parent.mkdir(parents=True)
  at = {"step": 1000, "accuracy": 0.36, "test_accuracy": 0.37}
  record = {"command": "x --config.seed=0", "test_at_best_validation": at, "final": at, "best_test": at}
  path.write_text(json.dumps({**record, "paper_test_accuracy": 37.3}))
  doc = tmp_path / "doc.md"
  doc.write_text("<!-- table:lra:listops_paper begin -->\n<!-- table:lra:listops_paper end -->\n")
  assert check.main([str(doc)]) == 1  # the section (empty: not generated yet) does not say so
  out = capsys.readouterr().out
  assert "lra:listops_paper: 1 records, not clean: legacy, no commit 1, 1 without a device  FAILS" in out
  assert "listops_primalformer_paper_schedule.json" in out
  note = "Records read: 1, not all clean (legacy, no commit: 1 of 1): `python -m experiments.provenance` lists them"
  assert docs_tables.main([str(doc)]) == 0  # generated: a docs page says so under the table, README.md does not
  assert note in doc.read_text() and note not in docs_tables.fill(doc.read_text(), ROOT)[0]
  assert check.main([str(doc)]) == 0
  origin = {"commit": CLEAN, "dirty": False, "devices": CPU}
  path.write_text(json.dumps({**record, "paper_test_accuracy": 37.3, "provenance": origin}))
  assert docs_tables.main([str(doc)]) == 0 and "Records read" not in doc.read_text()
  assert check.main([str(doc)]) == 0
  assert "0 not clean, 0 without a device; 0 failure(s)" in capsys.readouterr().out


def test_a_damaged_record_is_named_in_one_line(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
  path = tmp_path / "results" / "lra" / "listops_primalformer_paper_schedule.json"
  path.parent.mkdir(parents=True)
  path.write_text('{"command": "x')  # a copy cut short
  doc = tmp_path / "doc.md"
  doc.write_text("<!-- table:lra:listops_paper begin -->\n<!-- table:lra:listops_paper end -->\n")
  assert check.main([str(doc)]) == 2
  (line,) = capsys.readouterr().err.strip().splitlines()
  assert line.startswith("provenance: error: ") and "table lra:listops_paper: " in line and str(path) in line


def test_a_readme_figure_stated_only_by_unclean_tables_fails():
  readme = "x\n## Results\n\n| Table 5 | confirmed | +2.6 [+1.4, +3.8] |\n\n## API\n"
  unclean = (check.Record(Path("r"), run_origin(Path("/nonexistent"))),)
  tables = [check.TableCheck("docs/results.md", "paired:vit:fashion_mnist", "| +2.6 | [+1.4, +3.8] |", unclean)]
  assert check.figure_failures(readme, tables) == [
    "README.md: figure [+1.4, +3.8] is stated only by tables reading unclean records: paired:vit:fashion_mnist",
    "README.md: figure 2.6 is stated only by tables reading unclean records: paired:vit:fashion_mnist",
  ]
  tables.append(check.TableCheck("docs/archive.md", "clean", "+2.6 [+1.4, +3.8]", ()))
  assert check.figure_failures(readme, tables) == []


# --- reruns: experiments.sweep --unclean_in


def _digest(folder: Path) -> dict[str, str]:
  files = (p for p in folder.rglob("*") if p.is_file())
  return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_unclean_in_trains_exactly_the_legacy_and_dirty_runs(jv_tfds_dir, tmp_path, monkeypatch):
  """Of three finished runs (clean, legacy, dirty) the sweep trains the legacy and the dirty one again, into the
  rerun folder under the same keys, at the checkout's (clean) commit; the sweep's own records are left byte for
  byte, and the tables read the reruns."""
  from primal_jax import provenance as origin

  sweep = tiny_sweep(jv_tfds_dir)
  keys = list(plan(sweep.runs))
  folder = tmp_path / "vit" / "sweep"
  for seed, (key, commit, dirty) in enumerate(zip(keys, (CLEAN, None, DIRTY), (False, None, True), strict=True)):
    write_run(folder / "runs" / key, seed, 0.5, commit, dirty)
  before = _digest(folder)
  monkeypatch.setattr(origin, "checkout", lambda: (RERUN, False))  # the rerun's commit, a clean tree
  lines = []
  report = run_sweep(sweep, folder.parent / "rerun", unclean_in=folder, print_fn=lines.append)
  assert report["ran"] == keys[1:] and not report["failed"]
  assert lines[0] == (
    f"--unclean_in={folder}: 2 of the 3 selected runs have a legacy or dirty record there (train those); 1 clean, "
    "0 not finished there"
  )
  assert sorted(p.name for p in (folder.parent / "rerun" / "runs").iterdir()) == sorted(keys[1:])
  for key in keys[1:]:
    assert run_origin(folder.parent / "rerun" / "runs" / key).commit == RERUN
  assert _digest(folder) == before
  (row,) = stored_rows(folder)
  rerun = folder.parent / "rerun" / "runs"
  assert row.sources == (str(folder / "runs" / keys[0]), str(rerun / keys[1]), str(rerun / keys[2]))
  assert provenance(row) == "aaaaaaa; rerun: ccccccc"
  again = run_sweep(sweep, folder.parent / "rerun", unclean_in=folder, print_fn=lambda _: None)
  assert again["ran"] == [] and again["skipped"] == keys[1:]  # finished reruns are not trained twice


def test_unclean_in_refusals_write_nothing(tmp_path, monkeypatch):
  from primal_jax import provenance as origin

  sweep, folder = tiny_sweep(), tmp_path / "vit" / "sweep"
  (folder / "runs").mkdir(parents=True)
  target = folder.parent / "rerun"
  monkeypatch.setattr(origin, "checkout", lambda: (RERUN, True))
  refusals = {
    (tmp_path / "nowhere", tmp_path / "rerun"): "not a sweep directory (no runs/ folder in it)",
    (folder, tmp_path / "elsewhere"): f"its reruns go to --workdir={target} (where the tables read them)",
    (folder, target): f"the checkout is commit {RERUN[:9]} with uncommitted changes; a rerun trains at a clean commit",
  }
  for (source, workdir), message in refusals.items():
    with pytest.raises(ConfigError, match=None) as caught:
      run_sweep(sweep, workdir, unclean_in=source, print_fn=lambda _: None)
    assert str(caught.value).startswith(f"--unclean_in={source}: ") and message in str(caught.value)
    assert not workdir.exists()


def test_unclean_in_refusal_is_one_line_of_the_command(tmp_path):
  (tmp_path / "one.py").write_text(
    "from experiments.engine.spec import Cell, Run, Sweep\n"
    "def get_sweep(arg=None):\n"
    "  return Sweep((Run('uea:smoke', Cell('t', (('model', 'x'),))),))\n"
  )
  command = [sys.executable, "-m", "experiments.sweep", f"--sweep={tmp_path / 'one.py'}", "--mode=aggregate"]
  command += [f"--workdir={tmp_path / 'rerun'}", f"--unclean_in={tmp_path / 'nowhere'}"]
  result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2 and result.stderr.strip() == (
    f"experiments.sweep: error: --unclean_in={tmp_path / 'nowhere'}: not a sweep directory (no runs/ folder in it)"
  )


# --- the real records

# Every README table and claims-table figure reads clean records: the speed table's and the vs_release summary's
# benchmark records were measured again at clean commits (c1c47c8, fc5197a), Hopper's three dirty-tree runs and the
# LM's nine legacy runs were rerun (04d9f3d), and the ListOps table reads `lra:listops_release` (d3d67c8) in place of
# the two legacy JSONs of `lra:listops_paper`, which docs/results.md keeps.


@pytest.fixture(scope="module")
def readme_check():
  """(README tables that fail the check, README figures that fail it), from README.md and the documents whose
  tables state its figures (docs/results.md: the paired tables and forest plots; docs/uncertainty.md)."""
  checks = check.check_documents([ROOT / "README.md", ROOT / "docs" / "results.md", ROOT / "docs" / "uncertainty.md"])
  failing = {c.name for c in checks if c.document == "README.md" and c.failure()}
  lines = check.figure_failures((ROOT / "README.md").read_text(), checks)
  return failing, {line.split("figure ")[1].split(" is stated")[0] for line in lines}


def test_every_readme_number_comes_from_a_clean_record(readme_check):
  """Every README table and every claims-table figure reads only records that name their commit and a clean tree:
  a new unclean one fails here."""
  failing, figures = readme_check
  assert not failing and not figures
