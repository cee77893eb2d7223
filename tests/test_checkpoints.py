"""Tests of primal_jax.training.checkpointing.checkpointer on real orbax checkpoints in tmp_path.

Covers: round trip of a realistic train state, retention (latest N plus the best), restoring onto
other meshes, fingerprint mismatches, corrupt checkpoints (error, nothing touched, never collected),
restore_params from another directory, and the SIGTERM guard.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from device_utils import devices_for
from flax import linen as nn
from flax import struct
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from primal_jax.training.checkpointing.checkpointer import (
  Checkpointer,
  CheckpointError,
  restore_params,
  state_fingerprint,
)
from primal_jax.training.guards import PreemptionGuard


@struct.dataclass
class State:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array
  model_state: Any


class MLP(nn.Module):
  hidden: int = 32

  @nn.compact
  def __call__(self, x):
    x = nn.BatchNorm(use_running_average=True)(nn.Dense(self.hidden)(x))
    return nn.Dense(4)(nn.relu(x))


@functools.partial(jax.jit, static_argnums=(0,))
def _init(hidden: int, seed: jax.Array) -> State:
  key = jax.random.PRNGKey(seed)
  variables = MLP(hidden).init(key, jnp.ones((2, 16)))
  params = jax.tree.map(lambda x: x + 0.01 * jax.random.normal(key, x.shape), variables["params"])
  tx = optax.adam(1e-3)
  # A non-trivial Adam state: one update, so mu/nu/count are not their init values.
  _, opt_state = tx.update(jax.tree.map(jnp.ones_like, params), tx.init(params), params)
  return State(
    step=jnp.int32(7),
    params=params,
    opt_state=opt_state,
    rng=jax.random.fold_in(key, 1),
    model_state={"batch_stats": variables["batch_stats"]},
  )


def make_state(hidden: int = 32, seed: int = 0) -> State:
  """A small train state: flax params, BatchNorm stats, an Adam state, a step and a raw uint32 key."""
  return _init(hidden, seed)


def abstract_of(tree, sharding_fn=None):
  """ShapeDtypeStructs with each leaf's current sharding, or sharding_fn(leaf) if given."""
  pick = sharding_fn or (lambda x: x.sharding)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=pick(x)), tree)


def mesh_sharding(mesh, matrix_spec):
  """2-D leaves sharded with matrix_spec, everything else replicated on mesh."""
  return lambda x: NamedSharding(mesh, matrix_spec if x.ndim == 2 else P())


def make_mesh(shape):
  devices = devices_for(math.prod(shape))
  return jax.make_mesh(shape, ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2, devices=devices)


def assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def snapshot(directory: Path) -> dict[str, str | None]:
  return {
    str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
    for p in sorted(directory.rglob("*"))
  }


def test_round_trip_of_a_realistic_state(tmp_path):
  state = make_state()
  with Checkpointer(tmp_path / "ckpt") as ckpt:
    assert ckpt.latest_step() is None and ckpt.all_steps() == []
    assert ckpt.save(7, state, metrics={"loss": jnp.float32(0.25), "accuracy": np.float64(0.5)})
    ckpt.wait_until_finished()
    restored, info = ckpt.restore(abstract_of(state))
  assert isinstance(restored, State)
  assert_trees_equal(restored, state)
  assert info["step"] == 7 and info["metrics"] == {"loss": 0.25, "accuracy": 0.5}
  assert info["fingerprint"] == state_fingerprint(state)
  paths = [leaf["path"] for leaf in info["fingerprint"]["leaves"]]
  assert "params/Dense_0/kernel" in paths and "model_state/batch_stats/BatchNorm_0/mean" in paths
  # Atomic rename: only the final step directory remains, no tmp directory.
  assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name[0].isdigit()) == ["7"]


def test_a_relative_directory_restores(tmp_path, monkeypatch):
  """`--workdir=runs/x` used to save fine and then fail to resume: orbax refuses relative restore paths."""
  monkeypatch.chdir(tmp_path)
  state = make_state()
  with Checkpointer("runs/x/checkpoints") as ckpt:
    assert ckpt.save(7, state, force=True)
    ckpt.wait_until_finished()
  with Checkpointer(Path("runs/x/checkpoints")) as ckpt:
    assert ckpt.directory.is_absolute()
    restored, _ = ckpt.restore(abstract_of(state))
  assert_trees_equal(restored, state)
  params = Checkpointer.restore_params("runs/x", abstract_of(state.params))  # a run's workdir, relative
  assert_trees_equal(params, state.params)


def test_typed_prng_keys_round_trip(tmp_path):
  state = {"rng": jax.random.split(jax.random.key(3), 4), "w": jnp.arange(6.0)}
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, state)
    restored, info = ckpt.restore(state)  # concrete arrays as the target, straight after the async save
  assert jax.dtypes.issubdtype(restored["rng"].dtype, jax.dtypes.prng_key)
  np.testing.assert_array_equal(jax.random.key_data(restored["rng"]), jax.random.key_data(state["rng"]))
  assert info["fingerprint"]["leaves"][0] == {"path": "rng", "shape": [4], "dtype": str(state["rng"].dtype)}


@pytest.mark.parametrize(
  ("mode", "values", "best"), [("max", [0.5, 0.9, 0.6, 0.7, 0.65], 2), ("min", [3, 1, 2, 4, 5], 2)]
)
def test_latest_n_plus_best_are_kept(tmp_path, mode, values, best):
  state = {"w": jnp.zeros(3)}
  with Checkpointer(tmp_path, max_to_keep=2, best_metric="score", best_mode=mode) as ckpt:
    for step, value in enumerate(values, start=1):
      ckpt.save(step, state, metrics={"score": value})
    ckpt.save(6, state, metrics={"other": 1.0})  # no score: never the best, still among the latest
    ckpt.wait_until_finished()
    assert ckpt.all_steps() == [best, 5, 6]
    assert ckpt.best_step() == best and ckpt.latest_step() == 6
  assert sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()) == [best, 5, 6]
  with Checkpointer(tmp_path, max_to_keep=2, best_metric="score", best_mode=mode) as reopened:
    assert reopened.best_step() == best  # rebuilt from the info records
    reopened.save(7, state, metrics={"score": values[best - 1]})  # a tie: the later step becomes the best
    reopened.wait_until_finished()
    assert reopened.best_step() == 7 and reopened.all_steps() == [6, 7]


def test_without_keep_best_only_latest_survive(tmp_path):
  with Checkpointer(tmp_path, max_to_keep=2, best_metric="acc", keep_best=False) as ckpt:
    for step, acc in [(1, 0.9), (2, 0.1), (3, 0.2)]:
      ckpt.save(step, {"w": jnp.zeros(2)}, metrics={"acc": acc})
    ckpt.wait_until_finished()
    assert ckpt.all_steps() == [2, 3] and ckpt.best_step() == 3


def test_save_interval_force_and_existing_step(tmp_path):
  state = {"w": jnp.zeros(2)}
  with Checkpointer(tmp_path, save_interval_steps=10, best_metric=None) as ckpt:
    assert ckpt.save(3, state)  # orbax saves the first step of an empty directory
    assert not ckpt.save(5, state) and ckpt.save(10, state) and ckpt.save(15, state, force=True)
    assert ckpt.best_step() is None
    with pytest.raises(CheckpointError, match="already exists"):
      ckpt.save(15, state, force=True)
    with pytest.raises(ValueError, match="metric 'loss' must be a scalar"):
      ckpt.save(20, state, metrics={"loss": np.ones(3)})
    ckpt.wait_until_finished()
    assert ckpt.all_steps() == [3, 10, 15]
    with pytest.raises(CheckpointError, match=r"no checkpoint for step 4 .* available steps: \[3, 10, 15\]"):
      ckpt.restore(abstract_of(state), step=4)
  with Checkpointer(tmp_path / "empty") as empty, pytest.raises(CheckpointError, match="no checkpoint in"):
    empty.restore(abstract_of(state))
  with pytest.raises(ValueError, match="max_to_keep"):
    Checkpointer(tmp_path, max_to_keep=0)


def test_restore_onto_other_meshes(tmp_path):
  mesh_4x2, mesh_2x4 = make_mesh((4, 2)), make_mesh((2, 4))
  host_state = make_state()
  state = jax.device_put(host_state, jax.tree.map(mesh_sharding(mesh_4x2, P("data", "model")), host_state))
  assert state.params["Dense_0"]["kernel"].sharding.spec == P("data", "model")
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, state)
    ckpt.wait_until_finished()
    target = abstract_of(state, mesh_sharding(mesh_2x4, P("model", "data")))
    on_2x4, _ = ckpt.restore(target)
    device = jax.devices()[0]
    on_one, _ = ckpt.restore(abstract_of(state, lambda x: SingleDeviceSharding(device)))
  for restored, abstract in [(on_2x4, target), (on_one, None)]:
    assert_trees_equal(restored, host_state)
    for leaf, want in zip(jax.tree.leaves(restored), jax.tree.leaves(abstract or restored), strict=True):
      assert leaf.sharding == (want.sharding if abstract else SingleDeviceSharding(device))
  assert on_2x4.params["Dense_0"]["kernel"].sharding == NamedSharding(mesh_2x4, P("model", "data"))


def test_mismatched_state_names_the_leaf(tmp_path):
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(3, make_state(hidden=32))
    ckpt.wait_until_finished()
    with pytest.raises(CheckpointError) as err:
      ckpt.restore(abstract_of(make_state(hidden=48)))
    message = str(err.value)
    assert str(tmp_path / "3") in message
    assert "params/Dense_0/kernel: saved shape (16, 32) float32, expected shape (16, 48) float32" in message
    assert "... and" in message  # bias, BatchNorm and Adam moments differ too; only the first are listed
    other = {"w": jax.ShapeDtypeStruct((2,), jnp.float32, sharding=SingleDeviceSharding(jax.devices()[0]))}
    with pytest.raises(CheckpointError, match="w: not in the checkpoint"):
      ckpt.restore(other)
    with pytest.raises(ValueError, match="leaf 'step' has no sharding"):
      ckpt.restore(jax.eval_shape(make_state))


def _data_files(step_dir: Path) -> list[Path]:
  files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
  assert files, f"no OCDBT data files under {step_dir}"
  return files


CORRUPTIONS = {
  "truncated_data": lambda d: [os.truncate(p, 7) for p in _data_files(d)],
  "deleted_data": lambda d: [p.unlink() for p in _data_files(d)],
  "garbage_state_metadata": lambda d: (d / "state" / "_METADATA").write_text("{not json"),
  "garbage_info": lambda d: (d / "info" / "metadata").write_text("\x00garbage"),
}


# A failed TensorStore read can leave an async callback behind that Python reports as unraisable.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("corrupt", list(CORRUPTIONS))
def test_corrupt_checkpoint_raises_and_is_never_deleted(tmp_path, corrupt):
  state = make_state()
  ckpt = Checkpointer(tmp_path, max_to_keep=2)
  ckpt.save(1, state)
  ckpt.save(2, state)
  ckpt.wait_until_finished()
  CORRUPTIONS[corrupt](tmp_path / "2")
  before = snapshot(tmp_path)
  with pytest.raises(CheckpointError, match="nothing was deleted") as err:
    ckpt.restore(abstract_of(state))
  assert str(tmp_path / "2") in str(err.value)
  assert snapshot(tmp_path) == before
  assert 2 in ckpt.corrupt_steps
  for step in (3, 4, 5):  # max_to_keep=2 would have collected step 2 by now
    ckpt.save(step, state)
  ckpt.wait_until_finished()
  assert ckpt.all_steps() == [2, 4, 5]
  assert {k: v for k, v in snapshot(tmp_path).items() if k.startswith("2/")} == {
    k: v for k, v in before.items() if k.startswith("2/")
  }
  restored, _ = ckpt.restore(abstract_of(state), step=4)  # the intact steps still restore
  assert_trees_equal(restored, state)
  ckpt.close()


def test_corrupt_latest_checkpoint_refuses_to_open(tmp_path):
  state = {"w": jnp.arange(300.0)}
  with Checkpointer(tmp_path, max_to_keep=1) as ckpt:
    ckpt.save(1, state)
    ckpt.wait_until_finished()
  (tmp_path / "1" / "info" / "metadata").write_text("{")
  with pytest.raises(CheckpointError, match=r"checkpoint step 1 .* is damaged: .*info/metadata: 1 bytes, recorded"):
    Checkpointer(tmp_path, max_to_keep=1)  # the checksums name the file
  (tmp_path / "1" / "checksums.json").unlink()  # as a step saved before checksums were recorded
  before = {k: v for k, v in snapshot(tmp_path).items() if k.startswith("1/")}
  with pytest.raises(CheckpointError, match=r"latest checkpoint .*1 is unreadable; nothing was deleted"):
    Checkpointer(tmp_path, max_to_keep=1)
  with Checkpointer(tmp_path, max_to_keep=1, allow_corrupt=True) as ckpt:
    assert list(ckpt.corrupt_steps) == [1]
    ckpt.save(2, state)
    ckpt.save(3, state)
    ckpt.wait_until_finished()
    assert ckpt.all_steps() == [1, 3]
  assert {k: v for k, v in snapshot(tmp_path).items() if k.startswith("1/")} == before


def test_unfinished_tmp_directory_is_not_a_step(tmp_path):
  (tmp_path / "9.orbax-checkpoint-tmp" / "state").mkdir(parents=True)
  with Checkpointer(tmp_path) as ckpt:
    assert ckpt.all_steps() == [] and ckpt.latest_step() is None


def test_restore_params_from_another_directory(tmp_path):
  other = tmp_path / "pretrained"
  state = make_state(seed=5)
  with Checkpointer(other) as ckpt:
    ckpt.save(10, state, metrics={"loss": 1.0})
    ckpt.save(20, make_state(seed=6))
    ckpt.wait_until_finished()
  mesh = make_mesh((2, 4))
  abstract_params = abstract_of(make_state(seed=0).params, mesh_sharding(mesh, P(None, "model")))
  params = restore_params(other, abstract_params, step=10)
  assert_trees_equal(params, state.params)
  assert params["Dense_0"]["kernel"].sharding == NamedSharding(mesh, P(None, "model"))
  assert_trees_equal(restore_params(other, abstract_params), make_state(seed=6).params)  # the latest step
  assert_trees_equal(Checkpointer.restore_params(other / "10", abstract_params), state.params)  # a step directory
  with pytest.raises(
    CheckpointError,
    match=r"(?s)params subtree.*\n  Dense_0/kernel: saved shape \(16, 32\) float32, expected shape \(16, 8\)",
  ):
    restore_params(other, abstract_of(make_state(hidden=8).params))
  (tmp_path / "empty").mkdir()
  with pytest.raises(CheckpointError, match=r"no checkpoint for step None in .*empty; available steps: \[\]"):
    restore_params(tmp_path / "empty", abstract_params)
  with pytest.raises(CheckpointError, match="not a directory"):
    restore_params(tmp_path / "missing", abstract_params)


def _wait_for(predicate, timeout=5.0):
  deadline = time.monotonic() + timeout
  while not predicate() and time.monotonic() < deadline:
    time.sleep(0.01)
  return predicate()


def test_preemption_guard_sets_flag_and_restores_handler():
  def previous(signum, frame):
    raise AssertionError("the previous handler must not run while the guard is active")

  original = signal.signal(signal.SIGTERM, previous)
  try:
    with PreemptionGuard() as guard:
      assert not guard.requested and guard.received_signal is None
      os.kill(os.getpid(), signal.SIGTERM)
      assert _wait_for(lambda: guard.requested)
      assert guard.received_signal == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is previous
  finally:
    signal.signal(signal.SIGTERM, original)


def test_preemption_guard_second_sigint_interrupts():
  before = signal.getsignal(signal.SIGINT)
  with pytest.raises(KeyboardInterrupt), PreemptionGuard((signal.SIGTERM, signal.SIGINT)) as guard:
    os.kill(os.getpid(), signal.SIGINT)
    assert _wait_for(lambda: guard.requested)
    os.kill(os.getpid(), signal.SIGINT)
    _wait_for(lambda: False, timeout=1.0)
  assert signal.getsignal(signal.SIGINT) is before
