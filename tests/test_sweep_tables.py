"""The sweep-derived docs tables (experiments.tables.sweeps): throughput from a run's own records."""

from __future__ import annotations

import json

import pytest

from experiments.engine.aggregate import Row
from experiments.engine.spec import Cell
from experiments.tables.sweeps import mean_std, run_device, training_tokens_per_second


def _write_run(run_dir, records):
  run_dir.mkdir()
  (run_dir / "config.json").write_text(json.dumps({"data": {"batch_size": 4, "seq_len": 8}}))
  (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")


def test_tokens_per_second_skips_compilation_and_evaluations(tmp_path):
  train = lambda step, t: {"step": step, "prefix": "train", "wall_time": t, "scalars": {}}  # noqa: E731
  records = [
    train(10, 100.0),
    train(20, 102.0),  # 10 steps x 32 tokens in 2 s: the first interval (compilation), left out
    train(30, 103.0),  # 320 tokens/s
    {"step": 30, "prefix": "validation", "wall_time": 109.0, "scalars": {}},
    train(40, 110.0),  # the interval spanning the evaluation is left out
    train(50, 111.0),  # 320
    train(60, 112.5),  # 213.3
  ]
  _write_run(tmp_path / "run", records)
  assert training_tokens_per_second(tmp_path / "run") == pytest.approx(320.0)
  _write_run(tmp_path / "short", records[:2])
  with pytest.raises(ValueError, match="too few"):
    training_tokens_per_second(tmp_path / "short")


def test_mean_std_marks_missing_seeds():
  row = Row(Cell("t", (("model", "m"),), None), "own_validation", (1.0, 2.0), planned=2, wall_seconds=(1.0, 1.0))
  assert mean_std(row) == "1.5 ± 0.7 (n = 2)"
  assert mean_std(row, digits=3, full=2) == "1.500 ± 0.707"


def test_run_device_reads_the_summary_then_the_provenance(tmp_path):
  (tmp_path / "a").mkdir()
  assert run_device(tmp_path / "a") == "CPU"  # runs from before devices were recorded: this project's CPU
  (tmp_path / "a" / "provenance.json").write_text(json.dumps({"devices": {"platform": "gpu", "kind": "NVIDIA H200"}}))
  assert run_device(tmp_path / "a") == "H200"
  (tmp_path / "a" / "summary.json").write_text(json.dumps({"devices": {"platform": "cpu", "kind": "cpu", "count": 8}}))
  assert run_device(tmp_path / "a") == "CPU"


def test_a_sweep_table_leaves_out_a_run_without_its_metric(tmp_path, monkeypatch, caplog):
  """Issue 26, item 6: a run record whose summary lacks the protocol's entry used to make the docs table raise a
  TypeError; the table is written from the other runs, and the run is named in the log. A row none of whose
  runs counts shows '-'."""
  import dataclasses

  from experiments.tables import common, sweeps

  runs = tmp_path / "vit" / "sweep" / "runs"
  cells = {
    "DeiT": Cell("short", (("model", "DeiT"),), 80.0),
    "Primal.+DeiT": Cell("short", (("model", "Primal.+DeiT"),)),
  }
  records = [("a", "DeiT", 0, 0.5), ("b", "DeiT", 1, None), ("c", "Primal.+DeiT", 0, None)]
  for key, model, seed, accuracy in records:
    summary = {"steps": 2} if accuracy is None else {"test_at_best_validation": {"step": 2, "accuracy": accuracy}}
    entry = {"cell": dataclasses.asdict(cells[model]), "seed": seed, "protocol": "own_validation"}
    (runs / key).mkdir(parents=True)
    (runs / key / "result.json").write_text(json.dumps({"wall_seconds": 120.0, "runs": [entry], "summary": summary}))
  monkeypatch.setattr(common, "RESULTS", tmp_path)
  table = sweeps.vit_sweep("short", tmp_path)
  # No summary.json: no parameter count, and a legacy record (no commit named).
  deit = "| DeiT | - | - | 80.0 | 50.0 (n = 1) | not recorded | - | 2.0 min | CPU | legacy, no commit: 1 of 1 |"
  assert deit in table
  assert table.endswith("| Primal.+DeiT | - | - | - | - | - | - | - | - | - |")
  assert "run b (short model=DeiT, seed 1, own_validation) has no `test_at_best_validation`" in caplog.text


def test_lra_table_follows_the_papers_column_order_and_marks_missing_seeds(tmp_path, monkeypatch):
  import dataclasses

  from experiments.docs_tables import render_table
  from experiments.tables import common

  runs = tmp_path / "lra" / "sweep" / "runs"
  cell = lambda model, paper: Cell("listops", (("dataset", "ListOps"), ("model", model)), paper)  # noqa: E731
  records = [("a", "PrimalFormer", 37.3, 0, 0.36), ("b", "PrimalFormer", 37.3, 1, 0.38), ("c", "Trans.", 37.1, 0, 0.2)]
  records.append(("d", "Primal.+Trans.", 37.3, 0, 0.3))
  release = Cell("listops_release", (("dataset", "ListOps"), ("model", "PrimalFormer")), 37.3)
  records.append(("e", "PrimalFormer", 37.3, 0, 0.35))
  long = Cell("image_long", (("dataset", "Image (Fashion-MNIST)"), ("model", "Trans."), ("steps", "3200")), 38.2)
  records.append(("f", "Trans.", 38.2, 0, 0.8))
  for key, model, paper, seed, accuracy in records:
    table_cell = {"e": release, "f": long}.get(key) or cell(model, paper)
    entry = {"cell": dataclasses.asdict(table_cell), "seed": seed, "protocol": "own_validation"}
    # Best validation at the test value: above ListOps' chance (17.55% + 2 points) but for Trans.' 0.2 - 0.05.
    summary = {"test_at_best_validation": {"step": 600, "accuracy": accuracy}}
    summary["best_validation"] = {"step": 600, "accuracy": accuracy - 0.05 * (model == "Trans.")}
    record = {
      "wall_seconds": 600.0,
      "runs": [entry],
      "summary": summary,
      "config": {"optimizer": {"learning_rate": 1e-3}},
    }
    (runs / key).mkdir(parents=True)
    (runs / key / "result.json").write_text(json.dumps(record))
  # The parameter count comes from each run's summary.json: one count, a range where the runs differ, or none.
  # Its provenance: the commit (a clean tree), a dirty tree, or none (legacy).
  origins = {"a": {"commit": "abcdef0123", "dirty": False}, "b": {"commit": "1234567890", "dirty": False}}
  origins["c"] = {"commit": "abcdef0123", "dirty": True}
  for key, count in (("a", 227_000), ("b", 227_500), ("c", 160_000)):
    (runs / key / "summary.json").write_text(json.dumps({"num_params": count, "provenance": origins[key]}))
  # The `converged` column reads each run's validation curve from its summary.json: none for these (-).
  monkeypatch.setattr(common, "RESULTS", tmp_path)
  lines = render_table("lra:listops", tmp_path).splitlines()
  assert lines[0].startswith("| task | model | params | paper (Table 2) | ours (`short`, test at best validation) |")
  # The header names the schedule: listops_release runs the config without `short`.
  header = render_table("lra:listops_release", tmp_path).splitlines()[0]
  assert "| ours (the release's schedule, test at best validation) |" in header
  # image_long names its steps (a label of its rows).
  long_header = render_table("lra:image_long", tmp_path).splitlines()[0]
  ratio = "eta x KSVD / task: start / middle / end"
  assert f"| ours (3200 steps, test at best validation) | {ratio} | learned |" in long_header
  learned = "0 of 1: did not learn at the rate tried (lr 0.001)"
  assert (
    lines[2] == f"| ListOps | Trans. | 160,000 | 37.1 | 20.0 (n = 1) | not recorded | {learned} | - | 10.0 min | CPU | "
    "dirty tree: 1 of 1 |"
  )
  primal = "| ListOps | PrimalFormer | 227,000-227,500 | 37.3 | 37.0 ± 1.4 (n = 2) | not recorded | 2 of 2 | - "
  primal += "| 10.0 min | CPU | 1234567, abcdef0 |"
  assert lines[3] == primal
  assert lines[4].startswith("| ListOps | Primal.+Trans. | - | 37.3 | 30.0 (n = 1) |")
  with pytest.raises(ValueError, match="no finished runs of table 'image'"):
    render_table("lra:image", tmp_path)


def test_d4rl_table_of_one_env_shows_that_envs_rows_alone():
  """`d4rl:<table>:<env>` (README's Hopper table) renders the committed records of that environment only; an env
  with no run is refused by name."""
  from experiments.docs_tables import render_table
  from experiments.tables.common import ROOT

  lines = render_table("d4rl:table4_all:hopper", ROOT).splitlines()[2:]
  everything = render_table("d4rl:table4_all", ROOT).splitlines()[2:]
  assert lines and all(line.startswith("| hopper | medium |") for line in lines)
  assert lines == [line for line in everything if line.startswith("| hopper |")] and len(everything) > len(lines)
  with pytest.raises(ValueError, match="no finished run of table 'table4_all' in env 'walker2d'"):
    render_table("d4rl:table4_all:walker2d", ROOT)


def test_the_vit_table_says_whether_each_rows_runs_converged(tmp_path, monkeypatch):
  """Issue 55 item 3: the `converged` column, from each run's validation curve, or its best step without one."""
  import dataclasses

  from experiments.tables import common, sweeps

  runs = tmp_path / "vit" / "sweep" / "runs"
  cells = {m: Cell("long", (("model", m),)) for m in ("DeiT", "Primal.+DeiT")}
  rising = [[1000, 0.80], [2000, 0.84], [3000, 0.86], [4000, 0.88]]
  flat = [[1000, 0.80], [2000, 0.870], [3000, 0.880], [4000, 0.881]]
  short = [[2000, 0.85], [4000, 0.88]]  # two evaluations: none before the last quarter but one, no plateau to judge
  records = [("a", "DeiT", 0, rising), ("b", "DeiT", 1, flat), ("c", "Primal.+DeiT", 0, None)]
  records.append(("d", "Short", 0, short))
  cells["Short"] = Cell("long", (("model", "Short"),))
  for key, model, seed, curve in records:
    summary = {"test_at_best_validation": {"step": 4000, "accuracy": 0.87}, "steps": 4000}
    summary["best_validation"] = {"step": 4000, "accuracy": 0.881}
    summary |= {"validation_curve": curve} if curve else {}
    entry = {"cell": dataclasses.asdict(cells[model]), "seed": seed, "protocol": "own_validation"}
    (runs / key).mkdir(parents=True)
    (runs / key / "result.json").write_text(json.dumps({"wall_seconds": 60.0, "runs": [entry], "summary": summary}))
    (runs / key / "summary.json").write_text(json.dumps(summary))
  monkeypatch.setattr(common, "RESULTS", tmp_path)
  table = sweeps.vit_sweep("long", tmp_path)
  assert "| 1 of 2 plateaued; best at 4,000 of 4,000; last quarter +0.1 to +2.0 |" in table
  assert "| no curve; best at 4,000 of 4,000 |" in table
  assert "| too few evaluations to judge; best at 4,000 of 4,000 |" in table


def test_a_record_folder_of_its_own_is_read_with_its_familys_sweep():
  """`paired:lra_figure1:figure1`: the Figure 1 runs trained in experiments/results/lra_figure1 (a workdir of their
  own) are read with experiments/sweeps/lra.py (`SWEEP_OF`), each arm's accuracy paired by seed with PrimalFormer at
  eta 0. From the committed records: eta 2 is 35.8 / 36.55 / 35.75 against 36.85 / 37.15 / 36.55, a mean of
  -0.817; Trans. stays at the majority class and is not tested."""
  from experiments.docs_tables import render_table
  from experiments.tables.common import ROOT

  lines = render_table("paired:lra_figure1:figure1", ROOT).splitlines()
  eta2 = next(line for line in lines if line.startswith("| PrimalFormer eta=2 |"))
  assert eta2.startswith("| PrimalFormer eta=2 | PrimalFormer eta=0 | 3 | -0.8 | 0.2 | [-1.4, -0.3] |")
  assert eta2.endswith("| worse |")
  assert next(line for line in lines if line.startswith("| Trans. |")).endswith("| did not learn |")


def test_the_ksvd_ratio_column_averages_each_logged_step_over_a_rows_runs(tmp_path):
  """Issue 55.2: every sweep table shows eta x KSVD / task loss at the first, middle and last logged steps, the
  mean over the row's runs; '-' where the row has no KSVD term or a run lacks that step, 'not recorded' where no
  run has it, '(n = k)' where only k runs do."""
  from experiments.tables.ksvd_ratio import ksvd_ratio

  def run(name, ratio):
    (tmp_path / name).mkdir()
    (tmp_path / name / "result.json").write_text(json.dumps({"summary": {"ksvd_ratio": ratio} if ratio else {}}))
    return str(tmp_path / name)

  def at(eta, ratio):
    return {"step": 1, "task_loss": 2.0, "ksvd_loss": ratio * 2.0 / eta if eta else 0.0, "eta": eta, "ratio": ratio}

  def row(*sources):
    n = len(sources)
    return Row(Cell("t", (("model", "m"),), None), "p", (1.0,) * n, 3, (1.0,) * n, sources=sources)

  a = run("a", {"start": at(0.5, 100.0), "middle": at(0.5, 2.0), "end": at(0.5, 0.02)})
  b = run("b", {"start": at(0.5, 300.0), "middle": at(0.5, 4.0), "end": at(0.5, 0.04)})
  old = run("old", {"start": at(0.5, 200.0), "end": at(0.5, 0.03)})  # before the middle step was recorded
  none = run("none", None)
  zero = run("zero", {"start": at(0.0, 0.0), "middle": at(0.0, 0.0), "end": at(0.0, 0.0)})
  assert ksvd_ratio(row(a, b)) == "2e+02 / 3 / 0.03"
  assert ksvd_ratio(row(a, b, old)) == "2e+02 / - / 0.03"
  assert ksvd_ratio(row(a, none)) == "1e+02 / 2 / 0.02 (n = 1)"
  assert ksvd_ratio(row(none)) == "not recorded"
  assert ksvd_ratio(row(zero)) == "-"
  assert ksvd_ratio(None) == "-"
