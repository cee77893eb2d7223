"""The sweep engine (experiments.engine) and the UEA sweep file: planning, hashing, caching,
resume after a killed run, and aggregation checked against numpy on hand-written results."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from experiments.engine.aggregate import stored_rows, write_results
from experiments.engine.records import RESULT_FILE
from experiments.engine.runner import run_sweep
from experiments.engine.spec import Cell, Run, Sweep, config_hash, load_sweep, plan, resolve, select
from primal_jax.cli.config_lookup import load_config
from primal_jax.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "uea"  # the packaged config, by name
UEA_SWEEP = ROOT / "experiments" / "sweeps" / "uea.py"
UEA_TABLES = {"table1_all", "table1", "table6", "table8", "basicmotions", "figure1", "eta"}  # every table of uea.py


@pytest.fixture(scope="module")
def data_dir(jv_tfds_dir):
  return jv_tfds_dir


# --- hashing and planning


def test_config_hash_is_canonical_json_sha256():
  assert config_hash({"b": [1, 2], "a": 0.5}) == hashlib.sha256(b'{"a":0.5,"b":[1,2]}').hexdigest()[:16]
  assert config_hash({"a": 0.5, "b": (1, 2)}) == config_hash({"b": [1, 2], "a": 0.5})  # tuples, key order
  one, again = load_config(f"{CONFIG}"), load_config(f"{CONFIG}:dataset=JapaneseVowels,model=primalformer")
  assert config_hash(one) == config_hash(again) == config_hash(json.loads(json.dumps(one.to_dict())))
  other = load_config(f"{CONFIG}", lock=False)
  other.ksvd.eta = 0.2
  assert config_hash(other) != config_hash(one)


def test_fields_added_at_their_neutral_value_leave_the_hash_alone():
  """`data.missing` (and the run controls) came after the UEA sweep was recorded: at the value that does what
  those runs did they are not hashed, so every run the sweep plans is still a recorded one (and the sweep
  says all are finished); another value is another run."""
  config = load_config(f"{CONFIG}", lock=False)
  assert config.data.missing == "raise"
  without = config.to_dict()
  del without["data"]["missing"]
  assert config_hash(config) == config_hash(without)
  config.data.missing = "zero"
  assert config_hash(config) != config_hash(without)
  recorded = {path.name for path in (ROOT / "experiments" / "results" / "uea_table1" / "runs").iterdir()}
  planned = select(plan(load_sweep(UEA_SWEEP).runs), ["table1", "table6", "table8", "basicmotions"])
  assert len(planned) == 108 and {p.key for p in planned} <= recorded


def test_resolve_applies_protocol_seed_and_overrides():
  cell = Cell("t", (("model", "x"),))
  release = resolve(Run(f"{CONFIG}:smoke", cell, seed=2, overrides={"ksvd.eta": 0.1}))
  assert (release.seed, release.data.seed, release.ksvd.eta, release.test_eval) == (2, 2, 0.1, "every_eval")
  assert release.data.val_fraction == 0.0 and release.best_metric == "test/accuracy"
  honest = resolve(Run(f"{CONFIG}:smoke", cell, seed=2, protocol="honest"))
  assert (honest.data.val_fraction, honest.best_metric, honest.test_eval) == (
    0.2,
    "validation/accuracy",
    "best_validation",
  )
  with pytest.raises(ConfigError, match="no field 'etta'"):
    resolve(Run(f"{CONFIG}:smoke", cell, overrides={"ksvd.etta": 0.1}))
  with pytest.raises(ValueError, match="protocol must be one of release, honest"):
    Run(f"{CONFIG}", cell, protocol="sloppy")


def test_uea_sweep_plan():
  sweep = load_sweep(f"{UEA_SWEEP}:seeds=0,figure_seeds=0")  # the recorded grid alone (the rest: test_paper_sweeps)
  planned = plan(sweep.runs)
  # (3 Table 1 + 12 Table 6 + 2 Table 8 + 3 BasicMotions) rows x 3 seeds x 2 protocols; 2 rows are duplicates.
  assert len(sweep.runs) == 20 * 3 * 2 and len(planned) == 18 * 3 * 2
  shared = [p for p in planned.values() if len(p.runs) > 1]
  assert len(shared) == 2 * 3 * 2
  pairs = {tuple(sorted((r.cell.table, dict(r.cell.labels).get("model", "")) for r in p.runs)) for p in shared}
  assert pairs == {
    (("table1", "PrimalFormer"), ("table6", "")),  # Table 6's (s=40, eta=0.5) cell
    (("table1", "Primal.+Trans."), ("table8", "Primal.+Trans.")),  # Table 8's data-dependent row
  }
  for p in shared:
    assert len({(r.seed, r.protocol) for r in p.runs}) == 1
  configs = [p.config for p in planned.values()]
  assert {c.num_epochs for c in configs} == {20} and not any(c.checkpoint_on_eval for c in configs)
  assert {(c.seed, c.data.seed) for c in configs} == {(0, 0), (1, 1), (2, 2)}
  honest = [c for c in configs if c.test_eval == "best_validation"]
  assert len(honest) == len(configs) // 2 and {c.data.val_fraction for c in honest} == {0.2}
  cells = {(r.cell.table, r.cell.labels): r.cell.paper for r in sweep.runs}
  assert cells[("table1", (("dataset", "JapaneseVowels"), ("model", "Trans.")))] == 98.7
  assert cells[("table1", (("dataset", "JapaneseVowels"), ("model", "PrimalFormer")))] == 98.4
  assert cells[("table1", (("dataset", "JapaneseVowels"), ("model", "Primal.+Trans.")))] == 98.9
  assert cells[("table6", (("s", "30"), ("eta", "0.1")))] == 97.6
  assert cells[("table8", (("model", "Primal.+Trans."), ("data-dependent", "no")))] == 99.2
  assert sum(1 for table, _ in cells if table == "table6") == 12
  table6 = [p.config for p in planned.values() if any(r.cell.table == "table6" for r in p.runs)]
  cells = {(c.model.attention.primal.low_rank, c.ksvd.eta) for c in table6}
  assert cells == {(s, e) for s in (20, 30, 40) for e in (0, 0.1, 0.2, 0.5)}
  table8 = [p.config for p in planned.values() if any(r.cell.table == "table8" for r in p.runs)]
  assert {(c.model.layers, c.model.attention.primal.data_dependent) for c in table8} == {
    (("softmax", "primal"), True),
    (("softmax", "primal"), False),
  }

  release = load_sweep(f"{UEA_SWEEP}:epochs=100,seeds=0,figure_seeds=0,ablation_seeds=1")
  assert len(release.runs) == 40 and {resolve(r).num_epochs for r in release.runs} == {100}
  smoke = plan(load_sweep(f"{UEA_SWEEP}:smoke,seeds=1,ablation_seeds=1,data_dir=/data").runs)
  assert all(p.config.total_steps == 3 and p.config.model.dim == 32 for p in smoke.values())
  assert {p.config.data.data_dir for p in smoke.values()} == {"/data"}


# --- aggregation against numpy, on hand-written result.json files


def fake_result(planned_run, accuracy: float, wall: float) -> dict:
  metric = "best_test" if planned_run.runs[0].protocol == "release" else "test_at_best_validation"
  return {"key": planned_run.key, "wall_seconds": wall, "summary": {metric: {"step": 1, "accuracy": accuracy}}}


def test_aggregation_matches_numpy(tmp_path):
  sweep = load_sweep(f"{UEA_SWEEP}:smoke,seeds=0,figure_seeds=0")  # the recorded grid's tables
  planned = plan(sweep.runs)
  rng = np.random.default_rng(0)
  truth, walls = {}, []
  for p in planned.values():
    if p.runs[0].cell.table == "basicmotions" and p.runs[0].seed == 2:
      continue  # unfinished: n = 2/3 for these rows
    accuracy, wall = float(rng.uniform(0.9, 1.0)), float(rng.uniform(10, 100))
    walls.append(wall)
    (tmp_path / "runs" / p.key).mkdir(parents=True)
    (tmp_path / "runs" / p.key / RESULT_FILE).write_text(json.dumps(fake_result(p, accuracy, wall)))
    for r in p.runs:
      truth.setdefault((r.cell, r.protocol), []).append(100 * accuracy)
  rows = write_results(sweep, tmp_path)
  assert len(rows) == 20 * 2
  for row in rows:
    values = truth[(row.cell, row.protocol)]
    assert row.n == len(values) and row.planned == 3
    assert row.mean == pytest.approx(np.mean(values)) and row.std == pytest.approx(np.std(values, ddof=1))

  table = list(csv.DictReader(io.StringIO((tmp_path / "results.csv").read_text())))
  assert len(table) == len(rows)
  for line, row in zip(table, rows, strict=True):
    assert (line["table"], line["protocol"], int(line["n"])) == (row.cell.table, row.protocol, row.n)
    assert float(line["mean"]) == pytest.approx(row.mean, abs=1e-4) and float(line["std"]) == pytest.approx(
      row.std, abs=1e-4
    )
    assert line["paper"] == ("" if row.cell.paper is None else str(row.cell.paper))

  markdown = (tmp_path / "results.md").read_text()
  jv = next(r for r in rows if r.cell.table == "table1" and r.protocol == "honest" and "Trans." in r.cell.labels[1])
  assert "| JapaneseVowels | Trans. | 98.7 | " in markdown
  assert f"{jv.mean:.1f} ± {jv.std:.1f} | 3/3 |" in markdown
  bm = next(r for r in rows if r.cell.table == "basicmotions" and r.protocol == "release")
  assert f"| BasicMotions | Trans. | - | {bm.mean:.1f} ± {bm.std:.1f} | 2/3 |" in markdown
  assert f"{len(walls)} distinct runs finished; wall time {sum(walls) / 3600:.2f} h in all" in markdown
  for heading in ("Table 1, JapaneseVowels", "Table 6", "Table 8", "BasicMotions"):
    assert f"### {heading}" in markdown
  png = tmp_path / "uea_japanese_vowels_eta_s.png"
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_std_needs_two_seeds(tmp_path):
  cell = Cell("t", (("model", "x"),), paper=50.0)
  sweep = Sweep((Run(f"{CONFIG}:smoke", cell, seed=0), Run(f"{CONFIG}:smoke", cell, seed=1)))
  first = next(iter(plan(sweep.runs).values()))
  (tmp_path / "runs" / first.key).mkdir(parents=True)
  (tmp_path / "runs" / first.key / RESULT_FILE).write_text(json.dumps(fake_result(first, 0.5, 1.0)))
  (row,) = [r for r in write_results(sweep, tmp_path) if r.protocol == "release"]
  assert row.n == 1 and row.mean == 50.0 and math.isnan(row.std)
  assert "| x | 50.0 | 50.0 | 1/2 |" in (tmp_path / "results.md").read_text()


def test_a_run_without_its_protocol_metric_is_flagged_and_the_tables_still_written(tmp_path, caplog):
  """Issue 26, item 6: a finished run whose summary lacks its protocol's entry (here `best_test`) used to make
  every aggregation fail with a TypeError (no tables again); it is now left out of its row, named in a line of
  results.md and in the log, and the other runs are aggregated."""
  cell = Cell("t", (("model", "x"),), paper=50.0)
  sweep = Sweep(tuple(Run(f"{CONFIG}:smoke", cell, seed=s) for s in range(3)))
  planned = list(plan(sweep.runs).values())
  for p, accuracy in zip(planned, (0.5, 0.75, None), strict=True):
    result = fake_result(p, accuracy, 1.0)
    if accuracy is None:
      result["summary"] = {"final": {"step": 2}, "steps": 2}  # no best_test: e.g. a run with test_eval='never'
    result["runs"] = [{"cell": dataclasses.asdict(cell), "seed": p.runs[0].seed, "protocol": "release"}]
    (tmp_path / "runs" / p.key).mkdir(parents=True)
    (tmp_path / "runs" / p.key / RESULT_FILE).write_text(json.dumps(result))
  lines = []
  (row,) = write_results(sweep, tmp_path, print_fn=lines.append)
  assert row.accuracies == (50.0, 75.0) and row.unscored == ((planned[2].key, 2),) and row.planned == 3
  markdown = (tmp_path / "results.md").read_text()
  assert "| x | 50.0 | 62.5 ± 17.7 | 2/3 |" in markdown
  flag = f"run {planned[2].key} (t model=x, seed 2, release) has no `best_test` in its summary: not counted"
  assert flag in markdown and any(flag in line for line in lines)
  (stored,) = stored_rows(tmp_path)  # the docs tables' reader: the same row, the run named in the log
  assert stored.accuracies == (50.0, 75.0) and stored.unscored == ((planned[2].key, 2),)
  assert flag in caplog.text


def test_stored_rows_read_the_cells_each_result_records(tmp_path):
  a, b = Cell("t1", (("model", "x"),), 90.0), Cell("t2", (("eta", "0.5"),))
  for key, seed, cells, accuracy in [("k0", 1, (a, b), 0.5), ("k1", 0, (a,), 0.25), ("k2", 0, (b,), 1.0)]:
    runs = [{"cell": dataclasses.asdict(c), "seed": seed, "protocol": "release"} for c in cells]
    summary = {"best_test": {"step": 1, "accuracy": accuracy}}
    (tmp_path / "runs" / key).mkdir(parents=True)
    result = {"wall_seconds": 2.0, "runs": runs, "summary": summary}
    (tmp_path / "runs" / key / RESULT_FILE).write_text(json.dumps(result))
  rows = stored_rows(tmp_path)  # one run (k0) reports to both cells; accuracies in seed order
  assert [(r.cell, r.protocol, r.accuracies) for r in rows] == [
    (a, "release", (25.0, 50.0)),
    (b, "release", (100.0, 50.0)),
  ]


def test_every_run_the_uea_sweep_plans_has_its_record():
  """The docs' UEA tables read the sweep's committed records: every planned run is there under its key, Figure 1's
  (which keep their checkpoints) in uea_figure1, the rest in uea_table1, each with its result.json."""
  results = ROOT / "experiments" / "results"
  sweep = load_sweep(UEA_SWEEP)
  assert {run.cell.table for run in sweep.runs} == UEA_TABLES
  planned = plan(sweep.runs)
  for folder, tables in [("uea_figure1", ["figure1"]), ("uea_table1", sorted(UEA_TABLES - {"figure1"}))]:
    keys = {p.key for p in select(planned, tables)}
    missing = sorted(k for k in keys if not (results / folder / "runs" / k / RESULT_FILE).is_file())
    assert not missing, f"{folder}: {len(missing)} of {len(keys)} planned runs have no record, e.g. {missing[:3]}"
  assert len(select(planned, ["table6"])) == 72 and len(select(planned, ["table8"])) == 12


# --- real runs: caching, a second invocation, a killed run


def tiny_sweep(data_dir: str, seeds=(0,), protocols=("release",), resumable=False) -> Sweep:
  """Smoke-sized runs of 2 steps; the first row is listed in two tables (one run, two rows)."""
  overrides = {"total_steps": 2, "data.data_dir": data_dir, "checkpoint_on_eval": resumable}
  a, b = Cell("t1", (("model", "PrimalFormer"),), 98.4), Cell("t2", (("eta", "0.5"),))
  c = Cell("t1", (("model", "Trans."),), 98.7)
  runs = []
  for seed in seeds:
    for protocol in protocols:
      runs += [Run(f"{CONFIG}:smoke", cell, seed, protocol, overrides) for cell in (a, b)]
      runs.append(Run(f"{CONFIG}:smoke,model=softmax", c, seed, protocol, overrides))
  return Sweep(tuple(runs))


def test_inline_sweep_caches_runs_and_reruns_only_the_unfinished(data_dir, tmp_path):
  sweep = tiny_sweep(data_dir, protocols=("release", "honest"))
  keys = list(plan(sweep.runs))
  assert len(keys) == 4  # (PrimalFormer, Trans.) x (release, honest); the t2 row shares PrimalFormer's runs
  report = run_sweep(sweep, tmp_path, print_fn=lambda _: None)
  assert report["ran"] == keys and report["skipped"] == [] and not report["failed"]
  for key in keys:
    result = json.loads((tmp_path / "runs" / key / RESULT_FILE).read_text())
    assert result["key"] == key == config_hash(result["config"]) and result["wall_seconds"] > 0
    assert result["summary"]["steps"] == 2 and result["command"].startswith("python -m experiments.main --config=")
    assert not (tmp_path / "runs" / key / "checkpoints").exists() or not any(
      (tmp_path / "runs" / key / "checkpoints").iterdir()
    )
  honest = json.loads((tmp_path / "runs" / keys[2] / RESULT_FILE).read_text())
  assert [r["protocol"] for r in honest["runs"]] == ["honest", "honest"]
  assert [r["cell"]["table"] for r in honest["runs"]] == ["t1", "t2"]
  assert 0 <= honest["summary"]["test_at_best_validation"]["accuracy"] <= 1
  tables = (tmp_path / "results.md").read_text()
  before = {key: (tmp_path / "runs" / key / RESULT_FILE).read_bytes() for key in keys}

  report = run_sweep(sweep, tmp_path, print_fn=lambda _: None)  # everything cached: nothing runs
  assert report["ran"] == [] and report["skipped"] == keys
  assert before == {key: (tmp_path / "runs" / key / RESULT_FILE).read_bytes() for key in keys}
  assert (tmp_path / "results.md").read_text() == tables

  (tmp_path / "runs" / keys[2] / RESULT_FILE).unlink()  # a run cut short: its workdir is there, no result
  lines = []
  report = run_sweep(sweep, tmp_path, print_fn=lines.append)
  assert report["ran"] == [keys[2]] and report["skipped"] == [keys[0], keys[1], keys[3]]
  assert any("restarting from scratch" in line for line in lines)


def test_after_run_follows_each_run_of_its_table_once_and_a_failure_keeps_the_record(data_dir, tmp_path):
  calls = []

  def after(run_dir: Path) -> str:
    calls.append(run_dir.name)
    assert (run_dir / RESULT_FILE).exists()  # called once the record is written
    if len(calls) == 2:
      raise RuntimeError("no checkpoint")
    return "analysed"

  sweep = dataclasses.replace(tiny_sweep(data_dir), after_run={"t1": after})
  keys = list(plan(sweep.runs))
  lines = []
  report = run_sweep(sweep, tmp_path, print_fn=lines.append)
  assert calls == keys and report["ran"] == keys  # PrimalFormer (in t1 and t2) once, then Trans.
  assert f"  {keys[0]} (t1): analysed" in lines
  assert report["failed"] == {keys[1]: "after the run (t1): RuntimeError: no checkpoint"}
  assert all((tmp_path / "runs" / key / RESULT_FILE).exists() for key in keys)  # the failure keeps the record
  report = run_sweep(sweep, tmp_path, print_fn=lambda _: None)
  assert report["skipped"] == keys and calls == keys  # never called for a run finished before


def test_killed_subprocess_run_is_the_only_one_rerun(data_dir, tmp_path):
  sweep = tiny_sweep(data_dir)
  keys = list(plan(sweep.runs))
  assert len(keys) == 2
  pids, killed = [], []

  def print_fn(line: str) -> None:
    if line.startswith(f"  {keys[1]}: pid "):
      pids.append(int(line.rsplit(" ", 1)[1]))
    if pids and not killed and line.startswith("  | step 1/"):  # the second run is training: kill it
      os.kill(pids[0], signal.SIGKILL)
      killed.append(pids[0])

  report = run_sweep(sweep, tmp_path, mode="subprocess", echo=True, print_fn=print_fn)
  assert killed and report["ran"] == [keys[0]] and list(report["failed"]) == [keys[1]]
  assert "exit status -9" in report["failed"][keys[1]]
  assert (tmp_path / "runs" / keys[1]).exists() and not (tmp_path / "runs" / keys[1] / RESULT_FILE).exists()
  first = (tmp_path / "runs" / keys[0] / RESULT_FILE).read_bytes()

  report = run_sweep(sweep, tmp_path, print_fn=lambda _: None)  # restarted (inline: same hashes, same dirs)
  assert report["ran"] == [keys[1]] and report["skipped"] == [keys[0]] and not report["failed"]
  assert (tmp_path / "runs" / keys[0] / RESULT_FILE).read_bytes() == first
  rows = write_results(sweep, tmp_path)
  assert [(r.cell.table, r.n) for r in rows] == [("t1", 1), ("t2", 1), ("t1", 1)]


def test_a_resumed_run_records_the_time_of_all_its_attempts(data_dir, tmp_path):
  """SIGTERM stops the second run (it saves and exits); resumed, its result's wall_seconds sums both attempts."""
  sweep = tiny_sweep(data_dir, resumable=True)
  keys = list(plan(sweep.runs))
  pids, stopped = [], []

  def print_fn(line: str) -> None:
    if line.startswith(f"  {keys[1]}: pid "):
      pids.append(int(line.rsplit(" ", 1)[1]))
    if pids and not stopped and line.startswith("  | step 1/"):
      os.kill(pids[0], signal.SIGTERM)
      stopped.append(pids[0])

  report = run_sweep(sweep, tmp_path, mode="subprocess", echo=True, print_fn=print_fn)
  assert stopped and report["ran"] == [keys[0]] and report["preempted"] and not report["failed"]
  run_dir = tmp_path / "runs" / keys[1]
  (first,) = json.loads((run_dir / "attempts.json").read_text())
  assert first["outcome"] == "preempted" and first["seconds"] > 0
  assert not (run_dir / RESULT_FILE).exists()

  report = run_sweep(sweep, tmp_path, print_fn=lambda _: None)
  assert report["ran"] == [keys[1]] and not report["failed"]
  result = json.loads((run_dir / RESULT_FILE).read_text())
  assert [a["outcome"] for a in result["attempts"]] == ["preempted", "finished"]
  assert result["attempts"][0] == first and result["attempts"][1]["seconds"] > 0
  assert result["wall_seconds"] == pytest.approx(first["seconds"] + result["attempts"][1]["seconds"], rel=1e-12)
  once = json.loads((tmp_path / "runs" / keys[0] / RESULT_FILE).read_text())
  (only,) = once["attempts"]
  assert only["outcome"] == "finished" and once["wall_seconds"] == only["seconds"]


class _SweepKilled(BaseException):
  """Stands for the sweep process dying with its training: `run_sweep` catches Exception, not this."""


def test_an_attempt_killed_with_its_sweep_is_counted_by_the_next(data_dir, tmp_path):
  """SIGKILL takes the second run's training, and its sweep dies before logging anything: the next sweep finds the
  attempt by run.lock, counts it from the lock's start to the last metrics line, and the result sums both."""
  import datetime

  sweep = tiny_sweep(data_dir, resumable=True)
  keys = list(plan(sweep.runs))
  pids = []

  def print_fn(line: str) -> None:
    if line.startswith(f"  {keys[1]}: pid "):
      pids.append(int(line.rsplit(" ", 1)[1]))
    if pids and line.startswith("  | step 1/"):  # written to metrics.jsonl before it is shown
      os.kill(pids[0], signal.SIGKILL)
      raise _SweepKilled

  with pytest.raises(_SweepKilled):
    run_sweep(sweep, tmp_path, mode="subprocess", echo=True, print_fn=print_fn)
  run_dir = tmp_path / "runs" / keys[1]
  os.waitpid(pids[0], 0)  # the kernel drops the killed training's run.lock as it exits
  assert not (run_dir / "attempts.json").exists() and not (run_dir / RESULT_FILE).exists()
  started = json.loads((run_dir / "run.lock").read_text())["started"]
  lines = (run_dir / "metrics.jsonl").read_text().splitlines()
  expected = json.loads(lines[-1])["wall_time"] - datetime.datetime.fromisoformat(started).timestamp()
  assert 0 < expected < 600

  shown = []
  report = run_sweep(sweep, tmp_path, print_fn=shown.append)
  assert report["ran"] == [keys[1]] and report["skipped"] == [keys[0]] and not report["failed"]
  assert any(line.startswith(f"  {keys[1]}: an attempt since {started} ended unlogged (killed)") for line in shown)
  result = json.loads((run_dir / RESULT_FILE).read_text())
  killed, finished = result["attempts"]
  assert killed["outcome"] == "killed" and killed["lock_started"] == started
  assert killed["seconds"] == pytest.approx(expected, abs=1e-6)
  assert finished["outcome"] == "finished" and finished["lock_started"] >= started  # ISO UTC sorts as time
  assert result["wall_seconds"] == pytest.approx(killed["seconds"] + finished["seconds"], rel=1e-12)
  assert run_sweep(sweep, tmp_path, print_fn=lambda _: None)["skipped"] == keys  # nothing recounted
  assert json.loads((run_dir / RESULT_FILE).read_text()) == result


def test_shards_partition_the_runs_and_lock_apart(data_dir, tmp_path):
  import fcntl

  sweep = tiny_sweep(data_dir)
  keys = list(plan(sweep.runs))
  assert len(keys) == 2
  with pytest.raises(ValueError, match="shard must be"):
    run_sweep(sweep, tmp_path, shard=(2, 2), print_fn=lambda _: None)
  (tmp_path / "sweep.lock").touch()
  with open(tmp_path / "sweep.lock") as held:  # an unsharded sweep in progress does not block a shard's lock
    fcntl.flock(held, fcntl.LOCK_EX)
    first = run_sweep(sweep, tmp_path, shard=(1, 2), print_fn=lambda _: None)
  assert first["ran"] == [keys[1]] and not (tmp_path / "runs" / keys[0] / RESULT_FILE).exists()
  second = run_sweep(sweep, tmp_path, shard=(0, 2), print_fn=lambda _: None)
  assert second["ran"] == [keys[0]] and second["skipped"] == []
  assert [r.n for r in write_results(sweep, tmp_path)] == [1, 1, 1]


def test_a_pilot_trains_its_seeds_at_every_value_and_the_rest_at_the_chosen_one(data_dir, tmp_path):
  """Sweep.pilot on real runs: a tuned table of 2 learning rates x 2 seeds, seed 0 the pilot. A shard that reaches
  seed 1 before the whole pilot has finished leaves it for later; once the pilot has chosen, seed 1 trains at the
  chosen rate only, and the tables pair the chosen row's both seeds."""
  from experiments.engine.tuning import sweep_choices

  overrides = {"total_steps": 2, "data.data_dir": data_dir}
  runs = tuple(
    Run(f"{CONFIG}:smoke", Cell("t", (("model", "PrimalFormer"), ("lr", lr))), seed, "honest", overrides | rate)
    for seed in (0, 1)
    for lr, rate in (("1e-3", {"optimizer.learning_rate": 1e-3}), ("1e-2", {"optimizer.learning_rate": 1e-2}))
  )
  sweep = Sweep(runs, tuned={"t": "lr"}, pilot={"t": (0,)})
  keys = list(plan(sweep.runs))  # seed 0 at 1e-3, 1e-2, then seed 1 at 1e-3, 1e-2
  lines = []
  first = run_sweep(sweep, tmp_path, shard=(1, 2), print_fn=lines.append)  # seed 0 at 1e-2, then seed 1 at 1e-2
  assert first["ran"] == [keys[1]] and first["pilot"] == {keys[3]: "waiting for the pilot (seeds 0) of t"}
  assert f"  {keys[3]}: not trained: waiting for the pilot (seeds 0) of t" in lines
  second = run_sweep(sweep, tmp_path, print_fn=lambda _: None)
  (choice,) = sweep_choices(sweep, second["rows"], "t")
  chosen, other = (keys[2], keys[3]) if choice.chosen == "1e-3" else (keys[3], keys[2])
  assert second["ran"] == [keys[0], chosen] and list(second["pilot"]) == [other]
  assert second["pilot"][other] == f"lr {'1e-2' if choice.chosen == '1e-3' else '1e-3'} not chosen by the pilot " + (
    f"of t ({choice.chosen})"
  )
  assert choice.row.seeds == (0, 1) and not (tmp_path / "runs" / other / RESULT_FILE).exists()
  assert (
    "Chosen on validation (lr: mean best-validation score over the pilot seeds 0 per value tried)"
    in (tmp_path / "results.md").read_text()
  )


HOLD_LOCK = """
import sys, time
from primal_jax.training.guards.workdir_lock import WorkdirLock
WorkdirLock(sys.argv[1], sys.argv[2]).acquire()
print("held", flush=True)
time.sleep(600)
"""


def _hold(directory: Path, lock_file: str):
  """A live process holding `directory/lock_file` (as a training run holds its run.lock), once it says so."""
  import subprocess
  import sys

  proc = subprocess.Popen(
    [sys.executable, "-c", HOLD_LOCK, str(directory), lock_file], stdout=subprocess.PIPE, text=True, cwd=ROOT
  )
  assert proc.stdout.readline().strip() == "held"
  return proc


def test_a_sweep_never_deletes_a_run_a_live_process_holds(data_dir, tmp_path):
  """Issue 26, item 2: with another --shard spec than a sweep in progress, a sweep used to delete that sweep's
  live run directory (an unfinished run without per-evaluation checkpoints restarts from scratch), take a fresh
  run.lock there and train beside it. Now a run whose run.lock a live process holds, or which another sweep has
  claimed (locks/<hash>.lock), is skipped with one line naming the holder, its directory left byte for byte."""
  from primal_jax.training.guards.workdir_lock import lock_holder

  sweep = tiny_sweep(data_dir)
  keys = list(plan(sweep.runs))
  live = tmp_path / "runs" / keys[0]
  live.mkdir(parents=True)
  (live / "metrics.jsonl").write_text('{"step": 1}\n')  # what the first sweep's training has written so far
  training = _hold(live, "run.lock")  # the first sweep's run, training (default shard 0/1)
  claimed = _hold(tmp_path / "locks", f"{keys[1]}.lock")  # another sweep, between its check and its training
  try:
    lines = []
    report = run_sweep(sweep, tmp_path, shard=(0, 2), print_fn=lines.append)
    assert report["ran"] == [] and list(report["busy"]) == [keys[0]] and not report["failed"]
    assert f"pid {training.pid} on host" in report["busy"][keys[0]]
    (line,) = [line for line in lines if "skipped, in use" in line]
    assert line.startswith(f"  {keys[0]}: skipped, in use: its run.lock is held by pid {training.pid}")
    report = run_sweep(sweep, tmp_path, print_fn=lines.append)  # the default shard: both runs are someone's
    assert report["ran"] == [] and list(report["busy"]) == keys
    assert f"another sweep is working on it (pid {claimed.pid} on host" in report["busy"][keys[1]]
    assert sorted(p.name for p in live.iterdir()) == ["metrics.jsonl", "run.lock"]
    assert (live / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert f"pid {training.pid}" in lock_holder(live) and not (tmp_path / "runs" / keys[1]).exists()
  finally:
    for proc in (training, claimed):
      proc.kill()
      proc.wait()
  assert lock_holder(live) is None and lock_holder(tmp_path / "locks", f"{keys[1]}.lock") is None  # dead: free


def test_sweep_binary_lock_and_table_filter(data_dir, tmp_path):
  import fcntl
  import subprocess
  import sys

  (tmp_path / "sweep.lock").touch()
  with open(tmp_path / "sweep.lock") as held:
    fcntl.flock(held, fcntl.LOCK_EX)
    with pytest.raises(ConfigError, match="another sweep with --shard=0/1 is running there"):
      run_sweep(tiny_sweep(data_dir), tmp_path, print_fn=lambda _: None)
  with pytest.raises(ValueError, match=r"unknown table\(s\) \['t3'\]"):
    run_sweep(tiny_sweep(data_dir), tmp_path, only=["t3"], print_fn=lambda _: None)
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.sweep",
      f"--sweep={UEA_SWEEP}:smoke",
      f"--workdir={tmp_path}",
      "--mode=aggregate",
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert "0 run(s) trained" in result.stdout and (tmp_path / "results.md").exists()


SWEEP_FILE = """
from experiments.engine.spec import Cell, Run, Sweep


def get_sweep(arg):
  return Sweep((Run("uea:smoke", Cell("t", (("model", "x"),)), {extra}),))
"""


def test_sweep_binary_answers_a_mistake_in_one_line(tmp_path):
  """Issue 26, item 10: a sweep file that does not parse, an override of a key the config lacks, an unknown
  protocol, a workdir where the same shard is running and a damaged run record used to end in a traceback; each
  is now one line on stderr naming what is wrong, exit status 2."""
  import fcntl
  import subprocess
  import sys

  files = {
    "syntax": "def get_sweep(arg)\n  return None\n",
    "key": SWEEP_FILE.format(extra='overrides={"ksvd.etta": 0.1}'),
    "protocol": SWEEP_FILE.format(extra='protocol="sloppy"'),
    "in_use": SWEEP_FILE.format(extra="seed=0"),
    "damaged": SWEEP_FILE.format(extra="seed=0"),
  }
  expected = {
    "syntax": f"sweep file {tmp_path / 'syntax.py'}, line 1: expected ':'",
    "key": "override 'ksvd.etta': the config has no field 'etta'",
    "protocol": "protocol must be one of release, honest, rollouts, own_validation, got 'sloppy'",
    "in_use": f"--workdir={tmp_path / 'in_use'}: another sweep with --shard=0/1 is running there",
    "damaged": "result.json (a finished run's record, 10 bytes) is damaged",
  }
  (tmp_path / "in_use").mkdir()
  (tmp_path / "damaged.py").write_text(files["damaged"])
  (key,) = plan(load_sweep(tmp_path / "damaged.py").runs)
  (tmp_path / "damaged" / "runs" / key).mkdir(parents=True)
  (tmp_path / "damaged" / "runs" / key / RESULT_FILE).write_text('{"key": "a')  # a copy cut short
  with open(tmp_path / "in_use" / "sweep.lock", "w") as held:
    fcntl.flock(held, fcntl.LOCK_EX)
    procs = {}
    for name, text in files.items():
      (tmp_path / f"{name}.py").write_text(text)
      command = [sys.executable, "-m", "experiments.sweep", f"--sweep={tmp_path / name}.py"]
      command += [f"--workdir={tmp_path / name}", "--mode=aggregate"]
      procs[name] = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = {name: (proc.wait(timeout=300), proc.stderr.read()) for name, proc in procs.items()}
  for name, (code, stderr) in results.items():
    assert code == 2 and "Traceback" not in stderr, (name, stderr[-2000:])
    (line,) = stderr.strip().splitlines()
    assert line.startswith("experiments.sweep: error: ") and expected[name] in line, (name, line)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["inline", "subprocess"])
def test_sweep_binary_trains_with_the_allocator_it_names(data_dir, tmp_path, mode):
  """`--allocator` (default auto: tcmalloc where installed) is what the training process runs with: inline, the
  sweep re-executes itself with it preloaded; subprocess, each run's child gets it. Each run's summary says which.
  The inline sweep used to train under glibc malloc wherever it was started, tcmalloc installed or not."""
  import subprocess
  import sys

  from primal_jax.launch import host_allocator

  if host_allocator.find_library("tcmalloc") is None:
    pytest.skip("tcmalloc is not installed (Debian/Ubuntu: apt-get install libtcmalloc-minimal4)")
  run = SWEEP_FILE.format(extra=f'overrides={{"total_steps": 2, "data.data_dir": "{data_dir}"}}')
  (tmp_path / "one.py").write_text(run)
  env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", host_allocator.REEXEC_MARKER)}
  for allocator, expected in (("system", "system"), ("auto", "tcmalloc")):
    workdir = tmp_path / allocator
    command = [sys.executable, "-m", "experiments.sweep", f"--sweep={tmp_path / 'one.py'}", f"--workdir={workdir}"]
    command += [f"--mode={mode}", f"--allocator={allocator}"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    (summary,) = [json.loads(p.read_text()) for p in (workdir / "runs").glob("*/summary.json")]
    assert summary["host_allocator"] == expected, (allocator, mode)
