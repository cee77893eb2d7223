"""End-to-end runs of the train loop on real data (UEA JapaneseVowels from the aeon wheel, smoke-sized model).

Every run here is a real `train_and_evaluate` over 8 fake CPU devices (tests/conftest.py):
real orbax checkpoints, real SIGTERM, real resume.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import types
from pathlib import Path

import jax
import ml_collections
import numpy as np
import pytest

from primal_jax import provenance
from primal_jax.cli.config_lookup import load_config
from primal_jax.dotted import set_dotted
from primal_jax.models.config import model_layers, stack_name
from primal_jax.training.checkpointing.checkpointer import Checkpointer, CheckpointError
from primal_jax.training.loop import TrainingError, evaluate, load_state, train_and_evaluate
from primal_jax.training.metrics import read_metrics

CONFIG = Path(__file__).resolve().parents[1] / "primal_jax" / "tasks" / "uea" / "config.py"  # by path, a user file


@pytest.fixture(scope="module")
def data_dir(jv_tfds_dir):
  return jv_tfds_dir


def smoke_config(data_dir, arg="", **overrides):
  config = load_config(f"{CONFIG}:smoke{',' + arg if arg else ''}", lock=False)
  config.data.data_dir = data_dir
  config.total_steps = 8
  config.log_every_steps = 1
  config.checkpoint_every_steps = 4
  for key, value in overrides.items():
    set_dotted(config, key, value, new_leaf=True)
  return config


def run(config, workdir, kill_at_step=None):
  """train_and_evaluate, sending ourselves a real SIGTERM once `kill_at_step` is printed."""
  lines = []

  def print_fn(line):
    lines.append(line)
    if kill_at_step is not None and line.startswith(f"step {kill_at_step}/"):
      os.kill(os.getpid(), signal.SIGTERM)

  summary = train_and_evaluate(config, workdir, print_fn=print_fn)
  return summary, lines


def params_of(config, workdir):
  _, state = load_state(config, workdir)
  return jax.device_get(state.params), int(state.step)


def assert_trees_equal(a, b, rtol=0.0, atol=0.0):
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("family", ["primalformer", "primal_plus", "softmax"])
def test_train_and_eval_each_family(data_dir, tmp_path, family):
  config = smoke_config(data_dir, f"model={family}", total_steps=2)
  summary, lines = run(config, tmp_path)
  assert summary["steps"] == 2 and not summary["preempted"]
  assert (
    summary["devices"] == {"platform": "cpu", "kind": "cpu", "count": 8, "matmul_precision": None}
    and summary["jax_version"] == jax.__version__
  )
  assert 0.0 <= summary["best_test"]["accuracy"] <= 1.0
  final = summary["final"]
  assert final["step"] == 2 and np.isfinite(final["test/loss"])
  # 370 test cases, every one counted once in the eval.
  tests = read_metrics(tmp_path, dedupe=True, prefix="test")
  assert tests[-1]["scalars"]["count"] == 370
  train = read_metrics(tmp_path, dedupe=True, prefix="train")
  assert [m["step"] for m in train] == [1, 2]
  ksvd = train[-1]["scalars"]["ksvd_loss"]
  assert (ksvd == 0.0) if family == "softmax" else (ksvd > 0.0)
  ratio, eta = summary["ksvd_ratio"], config.ksvd.eta  # eta x KSVD / task loss at the first and last steps
  for when, record in (("start", train[0]), ("end", train[-1])):
    task, k = record["scalars"]["task_loss"], record["scalars"]["ksvd_loss"]
    assert ratio[when] == {
      "step": record["step"],
      "task_loss": task,
      "ksvd_loss": k,
      "eta": eta,
      "ratio": eta * k / task,
    }
  assert ratio["start"]["step"] == 1 and ratio["end"]["step"] == 2
  origin = summary["provenance"]  # what produced the record
  assert origin["devices"] == summary["devices"] and origin["versions"]["jax"] == jax.__version__
  assert (origin["commit"], origin["dirty"]) == provenance.checkout()  # this process's snapshot of the checkout
  assert origin["argv"] == sys.argv and origin["date"].endswith("+00:00")
  saved = json.loads((tmp_path / "config.json").read_text())["model"]
  assert saved["layers"] == list(model_layers(family, 2)) and stack_name(saved["layers"]) == family
  assert Checkpointer(tmp_path / "checkpoints").latest_step() == 2
  assert any("params" in line and "initialised from scratch" in line for line in lines)


@pytest.fixture(scope="module")
def straight_run(data_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("straight")
  config = smoke_config(data_dir)
  summary, _ = run(config, workdir)
  return config, workdir, summary


def test_sigterm_then_resume_is_bit_identical(straight_run, tmp_path):
  config, straight_dir, straight_summary = straight_run
  summary, lines = run(config, tmp_path, kill_at_step=3)
  assert summary["preempted"] and summary["steps"] == 3
  assert Checkpointer(tmp_path / "checkpoints").latest_step() == 3
  assert any("termination requested: saved step 3" in line for line in lines)

  summary, lines = run(config, tmp_path)
  assert any("resumed from step 3" in line for line in lines)
  assert summary["steps"] == 8 and summary["final"] == straight_summary["final"]
  experiment, state = load_state(config, tmp_path)
  assert evaluate(experiment, state, "test") == pytest.approx(
    {k.split("/")[1]: v for k, v in straight_summary["final"].items() if "/" in k} | {"count": 370.0}, rel=1e-6
  )
  resumed, step = params_of(config, tmp_path)
  straight, straight_step = params_of(config, straight_dir)
  assert step == straight_step == 8
  assert_trees_equal(resumed, straight)  # bit-identical
  for prefix in ("train", "test"):
    ours = [(m["step"], m["scalars"]) for m in read_metrics(tmp_path, dedupe=True, prefix=prefix)]
    ref = [(m["step"], m["scalars"]) for m in read_metrics(straight_dir, dedupe=True, prefix=prefix)]
    assert ours == ref


def test_resume_onto_a_different_mesh(straight_run, tmp_path):
  config, straight_dir, _ = straight_run
  run(config, tmp_path, kill_at_step=4)  # mesh (8, 1): data parallel
  config = smoke_config(config.data.data_dir, mesh_shape=(4, 2))  # the 2 heads over 2 "model" devices
  summary, lines = run(config, tmp_path)
  assert any("mesh {'data': 4, 'model': 2}" in line and "resumed from step 4" in line for line in lines)
  resumed, _ = params_of(config, tmp_path)
  straight, _ = params_of(config, straight_dir)
  assert_trees_equal(resumed, straight, rtol=1e-5, atol=1e-6)  # other reduction order: not bit-identical


def test_mesh_that_cannot_split_the_heads_is_a_clear_error(data_dir, tmp_path):
  config = smoke_config(data_dir, mesh_shape=(2, 4))  # 2 heads over 4 "model" devices
  with pytest.raises(ValueError, match=r"\['attention'\]\['\w+'\]: dimension 0 \(size 2\) is sharded over mesh axes"):
    run(config, tmp_path)


def test_corrupt_checkpoint_is_a_clear_error_and_is_kept(straight_run, tmp_path):
  config, straight_dir, _ = straight_run
  import shutil

  shutil.copytree(straight_dir, tmp_path / "run")
  step_dir = tmp_path / "run" / "checkpoints" / "8"
  victims = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.stat().st_size > 1000]
  assert victims
  victims[0].write_bytes(victims[0].read_bytes()[:100])  # truncated array data
  before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file() and "checkpoints" in p.parts}
  with pytest.raises(CheckpointError, match="8"):
    run(config, tmp_path / "run")
  after = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file() and "checkpoints" in p.parts}
  assert before == after  # nothing deleted or rewritten


def test_mismatched_checkpoint_names_the_leaf(straight_run, tmp_path):
  config, straight_dir, _ = straight_run
  import shutil

  shutil.copytree(straight_dir, tmp_path / "run")
  other = smoke_config(config.data.data_dir, **{"model.dim": 48})
  other.accept_config_changes = "model.dim"  # past the config continuity check, to the checkpoint's own
  with pytest.raises(CheckpointError, match=r"saved shape .*expected shape"):
    run(other, tmp_path / "run")


def test_init_from_another_run(straight_run, tmp_path):
  config, straight_dir, _ = straight_run
  other = smoke_config(config.data.data_dir, init_from=str(straight_dir / "checkpoints"), total_steps=1)
  summary, lines = run(other, tmp_path)
  assert any(f"params initialised from {straight_dir / 'checkpoints'}" in line for line in lines)
  straight, _ = params_of(config, straight_dir)
  restored = Checkpointer.restore_params(
    straight_dir / "checkpoints", load_state(config, straight_dir)[0].abstract.params
  )
  assert_trees_equal(jax.device_get(restored), straight)
  assert summary["steps"] == 1
  from_workdir = Checkpointer.restore_params(straight_dir, load_state(config, straight_dir)[0].abstract.params)
  assert_trees_equal(jax.device_get(from_workdir), straight)  # a run's workdir names its checkpoints too


def test_diverging_loss_stops_with_the_step_and_last_checkpoint(data_dir, tmp_path):
  config = smoke_config(data_dir, **{"optimizer.learning_rate": 1e6, "optimizer.grad_clip_norm": 0.0})
  config.ksvd.eta = 1e3
  with pytest.raises(TrainingError, match=r"non-finite loss .* at step (\d+).*Last good checkpoint") as info:
    run(config, tmp_path)
  message = str(info.value)
  latest = Checkpointer(tmp_path / "checkpoints").latest_step()
  assert f"step {latest} in" in message
  bad_step = int(message.split("at step ")[1].split(";")[0])
  assert latest is None or latest < bad_step  # the diverged state was never saved


def test_config_arguments_are_checked():
  with pytest.raises(ValueError, match="unknown config argument 'bogus'"):
    load_config(f"{CONFIG}:bogus=1")
  from primal_jax.models.registry import build_model

  info = types.SimpleNamespace(seq_len=29, num_classes=9)
  with pytest.raises(
    ValueError, match="model must be one of primalformer, primal_plus, cosformer, .*, softmax, yoso_e, got"
  ):
    load_config(f"{CONFIG}:model=bogus")
  config = load_config(f"{CONFIG}:dataset=BasicMotions,model=primal_plus")
  assert config.data.dataset == "BasicMotions" and config.model.layers == ("softmax", "primal")
  with pytest.raises(ValueError, match="layers"):
    build_model(ml_collections.ConfigDict(dict(config.model.to_dict(), layers=("primal", "bogus"))), info)
  release = load_config(str(CONFIG))
  primal = release.model.attention.primal
  assert (primal.low_rank, release.ksvd.eta, primal.rank_multi) == (40, 0.5, 5)
  assert (release.optimizer.name, release.optimizer.learning_rate, release.data.batch_size) == ("radam", 1e-3, 16)
  assert release.num_epochs == 100 and release.optimizer.grad_clip_norm == 4.0


@pytest.mark.parametrize(
  "extra, message",
  [
    (["--config.model.layerss=x"], "model has no field 'layerss'; its fields: attention,"),
    (["--config.total_steps=abc"], "--config.total_steps=abc"),
    ([f"--config={CONFIG}:smoke,bogus=1"], "unknown config argument 'bogus'"),
    (["--workdir="], "--workdir"),
    (["--allocator=mimalloc"], "--allocator"),
  ],
)
def test_bad_flags_exit_with_a_clear_message(tmp_path, extra, message):
  import subprocess
  import sys

  args = [f"--config={CONFIG}:smoke", f"--workdir={tmp_path}"]
  args = [a for a in args if not any(a.split("=")[0] == e.split("=")[0] for e in extra)] + extra
  result = subprocess.run(
    [sys.executable, "-m", "experiments.main", *args],
    cwd=CONFIG.parents[3],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 2  # a usage error, in one line (tests/test_cli.py has the other tries)
  assert result.stderr.startswith("python -m experiments.main: error: ") and message in result.stderr, result.stderr
  assert len(result.stderr.strip().splitlines()) == 1
  assert not (tmp_path / "checkpoints").exists()


# --- test protocols (config.test_eval) and config.checkpoint_on_eval

HONEST = {
  "data.val_fraction": 0.2,
  "best_metric": "validation/accuracy",
  "test_eval": "best_validation",
  "eval_every_steps": 2,
}


def count_eval_batches(monkeypatch) -> dict[str, int]:
  """Counts how often each split is read for evaluation (every InputPipeline.eval_batches call)."""
  from primal_jax.data.core import InputPipeline

  counts: dict[str, int] = {}
  original = InputPipeline.eval_batches

  def counting(self, split):
    counts[split] = counts.get(split, 0) + 1
    return original(self, split)

  monkeypatch.setattr(InputPipeline, "eval_batches", counting)
  return counts


@pytest.fixture(scope="module")
def honest_run(data_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("honest")
  config = smoke_config(data_dir, **HONEST)
  with pytest.MonkeyPatch.context() as monkeypatch:
    counts = count_eval_batches(monkeypatch)
    summary, lines = run(config, workdir)
  return config, workdir, summary, counts


def test_best_validation_evaluates_test_once_on_the_best_state(honest_run):
  config, workdir, summary, counts = honest_run
  assert counts == {"validation": 4, "test": 1}  # evaluations at steps 2, 4, 6, 8; test once, at the end
  history = json.loads((workdir / "eval_history.json").read_text())
  assert [h["step"] for h in history] == [2, 4, 6, 8] and all("test/accuracy" not in h for h in history)
  best_accuracy = max(h["validation/accuracy"] for h in history)
  best_steps = [h["step"] for h in history if h["validation/accuracy"] == best_accuracy]
  best_step = best_steps[-1]  # the latest on ties, as the Checkpointer's best step
  assert summary["test_eval"] == "best_validation"
  assert summary["test_at_best_validation"]["step"] == best_step
  assert summary["best_validation"] == {"step": best_step, "accuracy": best_accuracy}  # the same tie rule
  assert summary["validation_curve"] == [[h["step"], h["validation/accuracy"]] for h in history]  # convergence
  tests = read_metrics(workdir, prefix="test")
  assert len(tests) == 1 and tests[0]["step"] == best_step and tests[0]["scalars"]["count"] == 370
  # An independent evaluation of the checkpointed best-validation params gives the same test accuracy.
  assert Checkpointer(workdir / "checkpoints", best_metric="validation/accuracy").best_step() == best_step
  experiment, state = load_state(config, workdir, step=best_step)
  assert int(state.step) == best_step
  independent = evaluate(experiment, state, "test")
  assert independent["accuracy"] == pytest.approx(summary["test_at_best_validation"]["accuracy"], abs=1e-7)
  assert independent["loss"] == pytest.approx(summary["test_at_best_validation"]["loss"], rel=1e-5)


def test_best_validation_after_a_restart_restores_the_best_checkpoint(honest_run, tmp_path, monkeypatch):
  config, _, straight, _ = honest_run
  summary, _ = run(config, tmp_path, kill_at_step=8)  # SIGTERM at the last step: saved, test not evaluated
  assert summary["preempted"] and "test_at_best_validation" not in summary
  assert read_metrics(tmp_path, prefix="test") == []
  counts = count_eval_batches(monkeypatch)
  summary, _ = run(config, tmp_path)  # nothing left to train: the best state must come from its checkpoint
  assert counts == {"test": 1}
  assert summary["test_at_best_validation"] == straight["test_at_best_validation"]


def test_checkpoint_on_eval_false_saves_no_evaluation_checkpoints(data_dir, tmp_path):
  config = smoke_config(data_dir, checkpoint_on_eval=False, checkpoint_every_steps=100, eval_every_steps=2)
  summary, _ = run(config, tmp_path)
  assert [h["step"] for h in json.loads((tmp_path / "eval_history.json").read_text())] == [2, 4, 6, 8]
  assert not (tmp_path / "checkpoints").exists() or Checkpointer(tmp_path / "checkpoints").all_steps() == []
  assert summary["best_test"]["step"] in (2, 4, 6, 8) and summary["test_eval"] == "every_eval"


def test_best_validation_resume_without_the_best_checkpoint_fails_early(data_dir, tmp_path):
  config = smoke_config(data_dir, checkpoint_on_eval=False, checkpoint_every_steps=100, **HONEST)
  summary, _ = run(config, tmp_path, kill_at_step=5)  # saves step 5 only; the best (step 2 or 4) is lost
  assert summary["preempted"] and Checkpointer(tmp_path / "checkpoints").all_steps() == [5]
  with pytest.raises(TrainingError, match=r"resumed at step 5, but the best validation evaluation \(step [24]\)"):
    run(config, tmp_path)


@pytest.mark.parametrize(
  "overrides, message",
  [
    ({"test_eval": "bogus"}, "test_eval must be one of every_eval, best_validation"),
    ({"test_eval": "best_validation"}, r"needs validation and test splits \(data.val_fraction > 0\)"),
    ({**HONEST, "best_metric": "test/accuracy"}, "set best_metric='validation/accuracy'"),
  ],
)
def test_bad_test_eval_settings_are_clear_errors(data_dir, tmp_path, overrides, message):
  with pytest.raises(ValueError, match=message):
    run(smoke_config(data_dir, **overrides), tmp_path)
