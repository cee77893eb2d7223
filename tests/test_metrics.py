"""Tests of primal_jax.training.metrics: the JSONL/TensorBoard writer, config.json, progress lines, summary tables."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from primal_jax.training.metrics import (
  MetricWriter,
  Progress,
  format_duration,
  read_metrics,
  summary_table,
)


def test_jsonl_records_and_tensorboard(tmp_path):
  with MetricWriter(tmp_path, is_primary=True) as writer:
    writer.write(10, {"loss": jnp.float32(1.5), "acc": np.float64(0.25), "lr": 3e-4})
    writer.write(10, {"acc": 0.5}, prefix="eval")
    assert writer.tensorboard and writer.tensorboard_status == "enabled"
    with pytest.raises(ValueError, match="scalar 'loss' must hold one number, got shape \\(2,\\)"):
      writer.write(11, {"loss": np.ones(2)})
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert len(lines) == 2
  first = json.loads(lines[0])
  assert set(first) == {"step", "prefix", "wall_time", "scalars"}
  assert first["step"] == 10 and first["prefix"] == "train"
  assert first["scalars"] == {"loss": 1.5, "acc": 0.25, "lr": 3e-4}
  assert all(type(v) is float for v in first["scalars"].values())
  assert json.loads(lines[1])["prefix"] == "eval"
  assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tensorboard").iterdir())
  with pytest.raises(ValueError, match="is closed"):
    writer.write(12, {"loss": 1.0})


def test_non_primary_writes_nothing(tmp_path):
  workdir = tmp_path / "run"
  with MetricWriter(workdir, is_primary=False) as writer:
    writer.write(1, {"loss": 1.0})
    assert writer.write_config({"a": 1}) is None
    assert not writer.tensorboard and writer.tensorboard_status == "not primary"
  assert not workdir.exists()
  assert read_metrics(workdir) == []


def test_tensorboard_can_be_disabled(tmp_path):
  with MetricWriter(tmp_path, is_primary=True, tensorboard=False) as writer:
    writer.write(1, {"loss": 1.0})
    assert writer.tensorboard_status == "disabled"
  assert not (tmp_path / "tensorboard").exists()


def test_resume_appends_and_dedupe_keeps_last(tmp_path):
  with MetricWriter(tmp_path, is_primary=True, tensorboard=False) as writer:
    for step in (1, 2, 3):
      writer.write(step, {"loss": float(step)})
    writer.write(2, {"acc": 0.1}, prefix="eval")
  with open(tmp_path / "metrics.jsonl", "a") as f:  # a crash in the middle of a write
    f.write('{"step": 4, "pre')
  # Resumed from a checkpoint at step 2: steps 3 and 4 are logged again.
  with MetricWriter(tmp_path, is_primary=True, tensorboard=False) as writer:
    writer.write(3, {"loss": 30.0})
    writer.write(4, {"loss": 40.0})
  with pytest.raises(ValueError, match=r"metrics.jsonl:5 is not a JSON metrics record"):
    read_metrics(tmp_path)  # the cut-short line was terminated, so it is a bad line in the middle now
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  (tmp_path / "metrics.jsonl").write_text("\n".join(lines[:4] + lines[5:]) + '\n{"step": 5')
  everything = read_metrics(tmp_path)  # the unterminated last line is skipped
  assert [(r["step"], r["prefix"]) for r in everything] == [
    (1, "train"),
    (2, "train"),
    (3, "train"),
    (2, "eval"),
    (3, "train"),
    (4, "train"),
  ]
  deduped = read_metrics(tmp_path, dedupe=True)
  assert [(r["step"], r["prefix"], r["scalars"]) for r in deduped] == [
    (1, "train", {"loss": 1.0}),
    (2, "train", {"loss": 2.0}),
    (2, "eval", {"acc": 0.1}),
    (3, "train", {"loss": 30.0}),
    (4, "train", {"loss": 40.0}),
  ]
  assert [r["step"] for r in read_metrics(tmp_path, dedupe=True, prefix="eval")] == [2]


def test_non_finite_values_round_trip(tmp_path):
  with MetricWriter(tmp_path, is_primary=True, tensorboard=False) as writer:
    writer.write(1, {"loss": float("nan"), "grad_norm": jnp.inf})
  (record,) = read_metrics(tmp_path)
  assert math.isnan(record["scalars"]["loss"]) and record["scalars"]["grad_norm"] == math.inf


@dataclasses.dataclass
class _Model:
  layers: int = 2
  shape: tuple = (4, 8)


def test_write_config_stringifies_unknown_types(tmp_path):
  config = {"model": _Model(), "path": Path("/data"), "lr": np.float32(0.5), "dtype": jnp.bfloat16, "fn": len}
  with MetricWriter(tmp_path, is_primary=True, tensorboard=False) as writer:
    path = writer.write_config(config)
  assert path == tmp_path / "config.json"
  loaded = json.loads(path.read_text())
  assert loaded["model"] == {"layers": 2, "shape": [4, 8]}
  assert loaded["path"] == "/data" and loaded["lr"] == 0.5
  assert "bfloat16" in loaded["dtype"] and "len" in loaded["fn"]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "metrics.jsonl"]


class FakeClock:
  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


def test_progress_lines_with_a_fake_clock():
  clock, printed = FakeClock(), []
  progress = Progress(1700, start_step=0, batch_size=32, log_every_steps=100, print_fn=printed.append, time_fn=clock)
  clock.now += 20.0  # the first step: compilation
  assert progress.update(1, {"loss": 2.0}) == "step 1/1700 | loss 2 | 1.6 ex/s | ETA ?"
  for step in range(2, 121):
    clock.now += 0.1
    line = progress.update(step, {"loss": jnp.float32(1.23456), "acc": 0.5})
    assert (line is not None) == (step == 100)
  assert printed[1] == "step 100/1700 | loss 1.235 | acc 0.5 | 320.0 ex/s | ETA 2m40s"
  clock.now += 0.1
  last = progress.update(1700)  # the last step always prints
  assert last.startswith("step 1700/1700 | ") and last.endswith(" ex/s | ETA 0s")
  assert len(printed) == 3


def test_progress_by_seconds_and_resumed_start():
  clock, printed = FakeClock(), []
  progress = Progress(1000, start_step=500, batch_size=8, log_every_seconds=60, print_fn=printed.append, time_fn=clock)
  clock.now += 5.0
  progress.update(501)
  for step in range(502, 600):
    clock.now += 1.0
    progress.update(step)
  assert [line.split(" | ")[0] for line in printed] == ["step 501/1000", "step 561/1000"]
  assert printed[1] == "step 561/1000 | 8.0 ex/s | ETA 7m19s"  # 1 s/step over the 439 remaining steps
  with pytest.raises(ValueError, match="log_every_steps and/or log_every_seconds"):
    Progress(10, batch_size=1)


def test_format_duration():
  assert [format_duration(s) for s in (0, 42.4, 192, 3900, 2 * 86400 + 3 * 3600, math.inf)] == [
    "0s",
    "42s",
    "3m12s",
    "1h05m",
    "2d03h",
    "?",
  ]


def test_summary_table_alignment():
  rows = [
    {"model": "primal", "accuracy": 0.98761, "params": 1200, "note": "release"},
    {"model": "softmax-transformer", "accuracy": 0.9, "params": 35},
  ]
  table = summary_table(rows, ["model", "accuracy", "params", "note"])
  assert table.splitlines() == [
    "| model               | accuracy | params | note    |",
    "|---------------------|---------:|-------:|---------|",
    "| primal              |   0.9876 |   1200 | release |",
    "| softmax-transformer |      0.9 |     35 |         |",
  ]
  assert len({len(line) for line in table.splitlines()}) == 1
  assert Progress.summary_table(rows, ["model"]) == summary_table(rows, ["model"])


def test_ksvd_ratio_weighs_the_ksvd_term_at_the_first_middle_and_last_logged_steps():
  from primal_jax.training.metrics import ksvd_ratio

  records = [
    {"step": 1, "prefix": "train", "scalars": {"task_loss": 2.0, "ksvd_loss": -0.5, "loss": 1.75}},
    {"step": 5, "prefix": "train", "scalars": {"loss": 1.0}},  # no losses logged: skipped
    {"step": 9, "prefix": "train", "scalars": {"task_loss": 0.25, "ksvd_loss": 0.01, "loss": 0.255}},
  ]
  ratio = ksvd_ratio(records, eta=0.5)
  assert ratio["start"] == {"step": 1, "task_loss": 2.0, "ksvd_loss": -0.5, "eta": 0.5, "ratio": -0.125}
  assert ratio["end"]["step"] == 9 and ratio["end"]["ratio"] == pytest.approx(0.02, rel=1e-12)
  assert ratio["middle"] == ratio["start"]  # steps 1 and 9 are 4 from the half-way step 5: the earlier
  records.insert(2, {"step": 6, "prefix": "train", "scalars": {"task_loss": 1.0, "ksvd_loss": 0.2, "loss": 1.1}})
  assert ksvd_ratio(records, eta=0.5)["middle"] == {
    "step": 6,
    "task_loss": 1.0,
    "ksvd_loss": 0.2,
    "eta": 0.5,
    "ratio": 0.1,
  }
  assert ksvd_ratio(records[1:2], eta=0.5) is None
  zero = ksvd_ratio([{"step": 1, "scalars": {"task_loss": 0.0, "ksvd_loss": 1.0}}], eta=0.1)
  assert math.isnan(zero["start"]["ratio"])


def test_validation_curve_lists_every_evaluation_of_the_metric_in_step_order():
  from primal_jax.training.metrics import validation_curve

  records = [
    {"step": 20, "prefix": "validation", "scalars": {"accuracy": 0.5, "loss": 1.0}},
    {"step": 10, "prefix": "validation", "scalars": {"accuracy": 0.25, "loss": 2.0}},
    {"step": 30, "prefix": "validation", "scalars": {"loss": 0.5}},  # no accuracy at this evaluation: left out
  ]
  assert validation_curve(records, "accuracy") == [[10, 0.25], [20, 0.5]]
  assert validation_curve(records, "loss") == [[10, 2.0], [20, 1.0], [30, 0.5]]
  assert validation_curve(records, "normalized_score") is None
