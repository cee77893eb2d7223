"""experiments.lra_short: the record of a finished `short` LRA run (no training here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from experiments import lra_short
from primal_jax.cli.config_lookup import load_config

CONFIG = "lra"  # the packaged config, by name


def _fake_run(workdir: Path, spec: str = f"{CONFIG}:task=image,short", **overrides) -> None:
  """The files train_and_evaluate leaves in a workdir, for a 2-evaluation image run (config.json written by the
  loop's own writer)."""
  from primal_jax.training.metrics import MetricWriter

  workdir.mkdir()
  config = load_config(spec, lock=False)
  config.update(overrides)
  MetricWriter(workdir, is_primary=True, tensorboard=False).write_config(config.to_dict())
  history = [
    {"step": 400, "validation/accuracy": 0.80, "validation/loss": 0.5, "test/accuracy": 0.79, "test/loss": 0.6},
    {"step": 800, "validation/accuracy": 0.78, "validation/loss": 0.5, "test/accuracy": 0.81, "test/loss": 0.5},
  ]
  (workdir / "eval_history.json").write_text(json.dumps(history))
  summary = {
    "final": {**history[-1], "validation/ksvd_loss": 0.01},
    "best_validation": {"step": 400, "accuracy": 0.80},
    "best_test": {"step": 800, "accuracy": 0.81},
    "test_at_best_validation": {"step": 400, "accuracy": 0.79},
    "steps": 800,
    "preempted": False,
    "num_params": 227330,
  }
  (workdir / "summary.json").write_text(json.dumps(summary))
  rows = [
    {"step": 50, "prefix": "train", "wall_time": 100.0, "scalars": {"task_loss": 1.5, "loss": 1.6}},
    {"step": 800, "prefix": "test", "wall_time": 700.5, "scalars": {"accuracy": 0.81}},
  ]
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_collect_reads_a_finished_run(tmp_path):
  _fake_run(tmp_path / "run")
  record = lra_short.collect(tmp_path / "run", command="python -m experiments.main ...", wall_s=812.34, cpu_s=1500.0)
  assert (record["task"], record["model"], record["steps"], record["wall_s"]) == (
    "lra_image",
    "primalformer",
    800,
    812.3,
  )
  assert record["test_at_best_validation"] == {"step": 400, "accuracy": 0.79}
  assert record["final"] == {"step": 800, "validation/accuracy": 0.78, "test/accuracy": 0.81}
  assert [e["step"] for e in record["evaluations"]] == [400, 800]
  assert record["train_loss"] == [{"step": 50, "loss": 1.5}]
  assert record["schedule"]["total_steps"] == 800 and record["model_config"]["dim"] == 64
  # Without a measured wall time, the span of the logged rows stands in, and says so.
  record = lra_short.collect(tmp_path / "run", command="c")
  assert (record["wall_s"], record["wall_s_measures"]) == (600.5, "logged rows (first to last)")


def test_main_collect_only_and_refusals(tmp_path):
  _fake_run(tmp_path / "run")
  out = tmp_path / "image_primalformer.json"
  args = ["--task=image", f"--workdir={tmp_path / 'run'}", f"--out={out}"]
  assert lra_short.main([*args, "--collect_only"]) == 0
  record = json.loads(out.read_text())
  assert record["command"].startswith("python -m experiments.main --config=lra:task=image,")
  assert record["machine"]["cpus"] >= 1
  with pytest.raises(SystemExit):  # a used workdir is never trained in again: its wall time would be wrong
    lra_short.main(args)
  with pytest.raises(FileNotFoundError, match="did not finish"):
    lra_short.collect(tmp_path, command="c")


def test_train_command_is_the_binary_with_the_short_config():
  cmd = lra_short.train_command("pathfinder", "softmax", "/w", ["--config.total_steps=10"])
  assert cmd[0] == sys.executable
  assert cmd[1:] == [
    "-m",
    "experiments.main",
    "--config=lra:task=pathfinder,model=softmax,short",
    "--workdir=/w",
    "--config.total_steps=10",
  ]


def _main_error(args, capsys) -> str:
  with pytest.raises(SystemExit) as info:
    lra_short.main(args)
  assert info.value.code == 2
  return capsys.readouterr().err.strip().splitlines()[-1]


def test_collect_only_refuses_a_workdir_of_another_config(tmp_path, capsys):
  """Issue 26, item 3: collecting a smoke run as `task=image` used to write the record (over the committed one)
  with a command that never ran; a workdir whose config is not the command's is refused, naming the keys."""
  _fake_run(tmp_path / "smoke", f"{CONFIG}:task=image,smoke")
  out = tmp_path / "image_primalformer.json"
  line = _main_error(["--task=image", f"--workdir={tmp_path / 'smoke'}", f"--out={out}", "--collect_only"], capsys)
  assert "is a run of another config than `python -m experiments.main --config=lra:task=image," in line
  assert "total_steps: 4 in the workdir, 800 in the command" in line and not out.exists()
  # A run trained with extra arguments is collected with them, and the record names them.
  _fake_run(tmp_path / "longer", total_steps=1200)
  args = ["--task=image", f"--workdir={tmp_path / 'longer'}", f"--out={out}", "--collect_only"]
  assert "total_steps: 1200 in the workdir, 800" in _main_error(args, capsys)
  assert lra_short.main([*args, "--", "--config.total_steps=1200"]) == 0
  assert json.loads(out.read_text())["command"].endswith("--config.total_steps=1200")
  (tmp_path / "damaged").mkdir()
  (tmp_path / "damaged" / "config.json").write_text('{"data": ')
  args = ["--task=image", f"--workdir={tmp_path / 'damaged'}", f"--out={out}", "--collect_only"]
  assert f"{tmp_path / 'damaged' / 'config.json'} (the config the run was started with" in _main_error(args, capsys)


def test_a_record_is_never_replaced_silently(tmp_path, capsys):
  """Issue 26, item 3: an existing record is refused unless --overwrite (before any training), and collecting
  the same run again leaves the record as it is."""
  _fake_run(tmp_path / "run")
  out = tmp_path / "image_primalformer.json"
  args = ["--task=image", f"--workdir={tmp_path / 'run'}", f"--out={out}", "--collect_only"]
  assert lra_short.main(args) == 0
  first = out.read_bytes()
  assert lra_short.main(args) == 0 and out.read_bytes() == first  # the same record: left as it is
  assert "already holds this record" in capsys.readouterr().out
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  summary["test_at_best_validation"]["accuracy"] = 0.5  # the run's records changed: another record
  (tmp_path / "run" / "summary.json").write_text(json.dumps(summary))
  assert f"--out {out} holds another record; pass --overwrite" in _main_error(args, capsys)
  assert out.read_bytes() == first
  assert lra_short.main([*args, "--overwrite"]) == 0
  assert json.loads(out.read_text())["test_at_best_validation"]["accuracy"] == 0.5
  new_workdir = tmp_path / "new"
  line = _main_error(["--task=image", f"--workdir={new_workdir}", f"--out={out}"], capsys)  # training refused
  assert f"--out {out} exists (a recorded result); pass --overwrite" in line and not new_workdir.exists()
