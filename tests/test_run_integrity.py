"""Runs that cannot be corrupted or mixed (issue 18, items 6-9), on real smoke runs of the train loop.

Checkpoint checksums and the fall-back step, atomic run files, config continuity on resume, and the
workdir lock. Errors are matched as `ValueError` with their message, so that each test also fails (and
does not merely fail to import) on the code before these guarantees.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from primal_jax.cli.config_lookup import load_config
from primal_jax.dotted import set_dotted
from primal_jax.training.checkpointing.checkpointer import Checkpointer
from primal_jax.training.loop import TrainingError, load_state, train_and_evaluate

CONFIG = "uea"  # the packaged config, by name


def smoke_config(data_dir, **overrides):
  config = load_config(f"{CONFIG}:smoke", lock=False)
  config.data.data_dir = data_dir
  config.total_steps = 8
  config.log_every_steps = 1
  config.checkpoint_every_steps = 4
  config.eval_every_steps = 2
  config.checkpoint_on_eval = False  # checkpoints at steps 4 and 8 only
  for key, value in overrides.items():
    set_dotted(config, key, value, new_leaf=True)
  return config


def run(config, workdir):
  lines = []
  return train_and_evaluate(config, workdir, print_fn=lines.append), lines


def params_of(config, workdir):
  _, state = load_state(config, workdir)
  return jax.device_get(state.params)


def assert_trees_equal(a, b):
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))


def snapshot(workdir: Path) -> dict[str, bytes]:
  """Every file of a run but the lock file (which names each process that takes the lock)."""
  files = (p for p in sorted(workdir.rglob("*")) if p.is_file() and p.name != "run.lock")
  return {str(p.relative_to(workdir)): p.read_bytes() for p in files}


def largest_data_file(step_dir: Path) -> Path:
  """The biggest array data file of a step (OCDBT `d/` files hold the array bytes)."""
  return max((p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"), key=os.path.getsize)


def flip_bytes(path: Path, count: int = 64) -> None:
  data = bytearray(path.read_bytes())
  start = len(data) // 2 - count // 2
  for i in range(start, start + count):
    data[i] ^= 0xFF
  path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def finished_run(jv_tfds_dir, tmp_path_factory):
  """An 8-step smoke run: checkpoints at steps 4 and 8, evaluations every 2 steps."""
  workdir = tmp_path_factory.mktemp("finished")
  config = smoke_config(jv_tfds_dir)
  run(config, workdir)
  assert Checkpointer(workdir / "checkpoints").all_steps() == [4, 8]
  return config, workdir


@pytest.fixture
def copy_of_run(finished_run, tmp_path):
  config, workdir = finished_run
  shutil.copytree(workdir, tmp_path / "run")
  return config.copy_and_resolve_references(), tmp_path / "run"


# --- item 6: checksums ----------------------------------------------------------------------------


def test_flipped_bytes_name_the_step_and_the_file_and_resume_step_falls_back(finished_run, copy_of_run):
  config, workdir = copy_of_run
  victim = largest_data_file(workdir / "checkpoints" / "8")
  flip_bytes(victim)
  before = snapshot(workdir)
  with pytest.raises(ValueError, match=r"checkpoint step 8 .* is damaged") as info:
    run(config, workdir)
  message = str(info.value)
  assert victim.name in message and "sha256 differs" in message
  assert "--config.resume_step=4" in message  # the previous good step, and how to fall back to it
  assert (info.value.step, info.value.previous_good) == (8, 4)  # for code that handles it
  assert snapshot(workdir) == before  # nothing deleted or rewritten, the config included

  config.resume_step = 4
  summary, lines = run(config, workdir)
  assert any("resumed from step 4" in line and "steps [8] set aside" in line for line in lines)
  assert summary["steps"] == 8
  assert_trees_equal(params_of(config, workdir), params_of(*finished_run))  # the same run, bit for bit
  kept = workdir / "checkpoints.set_aside" / "8" / victim.relative_to(workdir / "checkpoints" / "8")
  assert kept.read_bytes() == before[str(victim.relative_to(workdir))]  # the evidence is kept, as it was
  assert Checkpointer(workdir / "checkpoints").verify(8) == []  # step 8 saved again, whole
  (entry,) = json.loads((workdir / "config_changes.json").read_text())
  assert (entry["resumed_from"], entry["set_aside"], entry["changes"]) == (4, [8], {})
  with pytest.raises(ValueError, match=r"resume_step=4 was applied already .* saved step 8 since"):
    run(config, workdir)  # the same command again would set the new step 8 aside: refused


def test_non_finite_loss_names_the_last_step_that_verifies(copy_of_run):
  from primal_jax.training.loop import _PendingScalars
  from primal_jax.training.objectives import get_objective

  _, workdir = copy_of_run
  flip_bytes(largest_data_file(workdir / "checkpoints" / "8"))
  # As the train loop opens it: the flipped bytes may hold the arrays' metadata (OCDBT stores both in `d/`
  # files, in the order its writes finished), and opening without allow_corrupt then refuses step 8 outright.
  ckpt = Checkpointer(workdir / "checkpoints", allow_corrupt=True)
  pending = _PendingScalars(get_objective("classification"), ckpt)
  names = ("task_loss_sum", "count", "ksvd_loss", "correct_sum", "grad_norm", "param_norm", "learning_rate")
  pending.push(9, {"loss": np.float32(np.nan), **{k: np.float32(1.0) for k in names}})
  with pytest.raises(TrainingError) as info:
    pending.check(all_steps=True)
  message = str(info.value)
  assert "Last good checkpoint (its checksums verified): step 4" in message
  assert "step 8 fails its checksums" in message and "--config.resume_step=4" in message


def test_unreadable_latest_step_that_fails_its_checksums_is_named_as_damaged(copy_of_run):
  _, workdir = copy_of_run
  victims = [p for p in (workdir / "checkpoints" / "8" / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
  for path in victims:  # every byte of every data file: the metadata stored among them cannot be read either
    flip_bytes(path, count=path.stat().st_size)
  with pytest.raises(ValueError, match=r"checkpoint step 8 .* is damaged: .*sha256 differs") as info:
    Checkpointer(workdir / "checkpoints")
  assert (info.value.step, info.value.previous_good) == (8, 4)
  assert sum(path.name in str(info.value) for path in victims) >= min(len(victims), 3)  # the first few named
  ckpt = Checkpointer(workdir / "checkpoints", allow_corrupt=True)  # opened anyway, the damage recorded
  assert "metadata failed" in ckpt.corrupt_steps[8]
  assert ckpt.last_verified_step() == 4
  ckpt.close()


def test_init_from_a_damaged_checkpoint_names_it(copy_of_run, tmp_path):
  config, workdir = copy_of_run
  victim = largest_data_file(workdir / "checkpoints" / "8")
  flip_bytes(victim)
  other = smoke_config(config.data.data_dir, init_from=str(workdir / "checkpoints"))
  with pytest.raises(ValueError, match=rf"checkpoint .*8 is damaged: .*{victim.name}: sha256 differs"):
    run(other, tmp_path / "fine_tune")


# --- item 7: atomic run files ---------------------------------------------------------------------


def test_run_files_are_replaced_whole_never_rewritten_in_place(copy_of_run):
  config, workdir = copy_of_run
  names = ("eval_history.json", "summary.json")
  inodes = {name: (workdir / name).stat().st_ino for name in names}
  with open(workdir / "eval_history.json") as reader:  # a reader that opened the file before the rewrite
    config.resume_step = 4
    run(config, workdir)
    assert [row["step"] for row in json.loads(reader.read())] == [2, 4, 6, 8]  # the old file, whole
  for name in names:
    assert (workdir / name).stat().st_ino != inodes[name], f"{name} was rewritten in place"
    json.loads((workdir / name).read_text())
  assert not [p for p in workdir.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("name", ["eval_history.json", "config.json"])
def test_damaged_run_file_names_its_path(copy_of_run, name):
  config, workdir = copy_of_run
  path = workdir / name
  path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # cut short, as by a partial copy
  with pytest.raises(ValueError, match=f"{path} .* is damaged"):
    run(config, workdir)


# --- item 8: config continuity ----------------------------------------------------------------------


@pytest.mark.parametrize(
  "key, value",
  [("optimizer.learning_rate", 1e-2), ("data.batch_size", 8), ("seed", 1), ("model.dim", 48)],
)
def test_changed_config_is_refused_before_anything_is_written(copy_of_run, key, value):
  config, workdir = copy_of_run
  before = snapshot(workdir)
  with pytest.raises(ValueError, match=rf"break its continuity: {key} .* -> {value}.*accept_config_changes={key}"):
    run(smoke_config(config.data.data_dir, **{key: value}), workdir)
  assert snapshot(workdir) == before  # config.json, the metrics and the checkpoints as they were


def test_accepted_change_is_recorded_and_config_json_kept(copy_of_run):
  from primal_jax.training.experiment import load_run_config

  config, workdir = copy_of_run
  original = (workdir / "config.json").read_bytes()
  changed = smoke_config(config.data.data_dir, **{"optimizer.learning_rate": 2e-3})
  changed.resume_step, changed.accept_config_changes = 4, "optimizer.learning_rate"
  summary, _ = run(changed, workdir)
  assert summary["steps"] == 8
  assert (workdir / "config.json").read_bytes() == original  # the run's record as it started
  (entry,) = json.loads((workdir / "config_changes.json").read_text())
  assert entry["step"] == 4 and entry["accepted"] == ["optimizer.learning_rate"]
  assert entry["changes"] == {"optimizer.learning_rate": {"old": 1e-3, "new": 2e-3}}
  assert load_run_config(workdir).optimizer.learning_rate == 2e-3

  # Compared with the run as it now is: the accepted rate needs no second acceptance, the old one does.
  longer = smoke_config(config.data.data_dir, **{"optimizer.learning_rate": 2e-3, "total_steps": 9})
  summary, _ = run(longer, workdir)  # total_steps is free: the schedule is constant
  assert summary["steps"] == 9
  second = json.loads((workdir / "config_changes.json").read_text())[1]
  assert second["changes"] == {"total_steps": {"old": 8, "new": 9}} and second["accepted"] == []
  with pytest.raises(ValueError, match=r"optimizer.learning_rate 0.002 -> 0.001"):
    run(smoke_config(config.data.data_dir, total_steps=9), workdir)


def test_which_changes_break_continuity(tmp_path):
  from primal_jax.training.guards.run_config import check_resume
  from primal_jax.training.metrics import MetricWriter

  def saved(**overrides):
    config = smoke_config("/data", **overrides)
    MetricWriter(tmp_path, is_primary=True, tensorboard=False).write_config(config.to_dict())
    return config

  config = saved()
  free = {"log_every_steps": 5, "eval_every_steps": 4, "checkpoint_every_steps": 2, "max_to_keep": 1,
          "data.eval_batch_size": 32, "data.data_dir": "/elsewhere", "mesh_shape": (4, 2), "total_steps": 20,
          "resume_step": 4}  # fmt: skip
  assert check_resume(smoke_config("/data", **free), tmp_path)["accepted"] == []
  assert check_resume(config, tmp_path) == {"changes": {}, "accepted": []}
  saved(**{"optimizer.schedule": "cosine"})  # the run's length now shapes its learning rate
  with pytest.raises(ValueError, match=r"continuity: total_steps 8 -> 20"):
    check_resume(smoke_config("/data", **{"optimizer.schedule": "cosine", "total_steps": 20}), tmp_path)
  prefix = smoke_config("/data", **{"optimizer.schedule": "cosine", "optimizer.b1": 0.5, "optimizer.b2": 0.9})
  prefix.accept_config_changes = "optimizer"  # a prefix accepts every key under it
  assert sorted(check_resume(prefix, tmp_path)["accepted"]) == ["optimizer.b1", "optimizer.b2"]


# --- item 9: the workdir lock -----------------------------------------------------------------------

HOLDER = """
import sys
from primal_jax.cli.config_lookup import load_config
from primal_jax.training.loop import train_and_evaluate
config = load_config(sys.argv[1], lock=False)
config.data.data_dir = sys.argv[2]
config.total_steps, config.log_every_steps, config.checkpoint_every_steps = 100_000, 1, 2
config.eval_every_steps = 100_000
train_and_evaluate(config, sys.argv[3], print_fn=lambda line: print(line, flush=True))
"""


def _wait_for(predicate, proc, what: str, timeout: float = 300.0) -> None:
  deadline = time.monotonic() + timeout
  while not predicate():
    if proc.poll() is not None:
      raise AssertionError(f"the holder exited ({proc.returncode}) before {what}: {proc.stdout.read()}")
    if time.monotonic() > deadline:
      raise AssertionError(f"timed out waiting for {what}")
    time.sleep(0.5)


def test_second_writer_is_refused_and_a_killed_holder_does_not_block(jv_tfds_dir, tmp_path):
  workdir = tmp_path / "run"
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one device: a lighter holder
  holder = subprocess.Popen(
    [sys.executable, "-c", HOLDER, f"{CONFIG}:smoke", jv_tfds_dir, str(workdir)],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
  )  # fmt: skip
  try:
    _wait_for(lambda: Checkpointer(workdir / "checkpoints").latest_step() is not None, holder, "a checkpoint")
    intruder = smoke_config(jv_tfds_dir, total_steps=1)
    with pytest.raises(ValueError, match=rf"in use by another run \(pid {holder.pid} on host "):
      run(intruder, workdir)
    assert holder.poll() is None  # the first writer goes on, undisturbed
  finally:
    holder.send_signal(signal.SIGKILL)  # no clean-up: the kernel drops its lock
    holder.wait()
  latest = Checkpointer(workdir / "checkpoints").latest_step()
  config = smoke_config(jv_tfds_dir, total_steps=latest + 1, checkpoint_every_steps=2, eval_every_steps=100_000)
  summary, lines = run(config, workdir)
  assert any(f"resumed from step {latest}" in line for line in lines) and summary["steps"] == latest + 1
  assert json.loads((workdir / "run.lock").read_text())["pid"] == os.getpid()


def test_lock_refuses_a_second_holder_in_the_same_process_until_released(tmp_path):
  from primal_jax.training.guards.workdir_lock import WorkdirLock

  with WorkdirLock(tmp_path):
    with pytest.raises(ValueError, match=rf"in use by another run \(pid {os.getpid()} "):
      WorkdirLock(tmp_path).acquire()
  with WorkdirLock(tmp_path) as again:
    assert again.held
