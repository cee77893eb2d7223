"""Sharded train steps: data-parallel and data x model (heads) meshes of 8 fake CPU devices
give the loss and parameters of one device (tests/conftest.py creates the devices)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from device_utils import devices_for
from flax import linen as nn
from train_utils import TINY_INFO, random_batch, tiny_model_config, tiny_optimizer_config

from primal_jax.ksvd import RELEASE_SEQUENCE
from primal_jax.models.registry import build_model
from primal_jax.training.optimizers import make_optimizer
from primal_jax.training.sharding import (
  batch_sharding,
  global_batch,
  make_mesh,
  replicated,
  resolve_mesh_shape,
)
from primal_jax.training.state import abstract_state, init_state, make_init_fn
from primal_jax.training.steps import make_eval_step, make_train_step

STEPS = 3


def run_steps(devices, mesh_shape, family="primalformer", norm_type="layer"):
  """Loss per step and final params of STEPS train steps on a mesh over `devices`."""
  built = build_model(tiny_model_config(family, norm_type=norm_type), TINY_INFO)
  tx, schedule = make_optimizer(tiny_optimizer_config(), 100)
  mesh = make_mesh(mesh_shape, devices)
  example = (random_batch(0)["inputs"][:1], random_batch(0)["mask"][:1])
  init_fn = make_init_fn(built.module, tx, example)
  rng = jax.random.PRNGKey(0)
  abstract, shardings = abstract_state(init_fn, rng, mesh)
  state = init_state(init_fn, rng, shardings)
  step = jax.jit(
    make_train_step(built, tx, schedule, eta=0.5, spec=RELEASE_SEQUENCE),
    in_shardings=(shardings, batch_sharding(mesh)),
    out_shardings=(shardings, replicated(mesh)),
    donate_argnums=0,
  )
  losses = []
  for i in range(STEPS):
    state, scalars = step(state, global_batch(random_batch(i + 1), mesh))
    losses.append(float(scalars["loss"]))
  evaluate = jax.jit(make_eval_step(built, eta=0.5, spec=RELEASE_SEQUENCE))
  sums = jax.device_get(evaluate(state, global_batch(random_batch(99), mesh)))
  return losses, jax.device_get(state.params), state, abstract, sums


@pytest.fixture(scope="module")
def single_device():
  return {family: run_steps(devices_for(8)[:1], (1, 1), family) for family in ("primalformer", "primal_plus")}


def test_eight_devices_exist():
  devices = devices_for(8)
  assert len({d.id for d in devices}) == 8
  if jax.default_backend() == "cpu":
    assert jax.device_count() == 8, "tests/conftest.py must set --xla_force_host_platform_device_count=8"


@pytest.mark.parametrize("family", ["primalformer", "primal_plus"])
@pytest.mark.parametrize("mesh_shape", [(8, 1), (4, 2), (2, 4)])
def test_sharded_steps_match_single_device(single_device, family, mesh_shape):
  ref_losses, ref_params, *_, ref_sums = single_device[family]
  losses, params, state, abstract, sums = run_steps(devices_for(8), mesh_shape, family)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(ref_params), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path))
  for key in ("correct_sum", "task_loss_sum", "count"):
    np.testing.assert_allclose(sums[key], ref_sums[key], rtol=1e-5)
  assert ref_losses[-1] != ref_losses[0]  # the steps really train


def test_heads_are_split_over_the_model_axis():
  *_, state, abstract, _ = run_steps(devices_for(8), (4, 2))
  attention = state.params["encoder"]["block_0"]["attention"]
  we = attention["We"]  # [H, n, s], heads over "model"
  assert we.sharding.spec[0] == "model"
  assert we.addressable_shards[0].data.shape[0] == we.shape[0] // 2
  # Moments of the optimizer follow their parameters; the step counter is replicated.
  moments = [
    leaf
    for path, leaf in jax.tree_util.tree_leaves_with_path(state.opt_state)
    if "block_0']['attention']['We']" in jax.tree_util.keystr(path)
  ]
  assert len(moments) == 2  # RAdam's mu and nu
  assert all(m.sharding.spec == we.sharding.spec for m in moments)
  assert state.step.sharding.is_fully_replicated
  # The embedding axis is replicated: the input projection is whole on every device.
  kernel = state.params["input_projection"]["kernel"]
  assert kernel.addressable_shards[0].data.shape == kernel.shape
  assert abstract.params["encoder"]["block_0"]["attention"]["We"].sharding == we.sharding


def test_batchnorm_statistics_sharded_match_single_device():
  ref_losses, ref_params, ref_state, *_ = run_steps(devices_for(8)[:1], (1, 1), norm_type="batch")
  losses, params, state, *_ = run_steps(devices_for(8), (8, 1), norm_type="batch")
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  a = jax.device_get(state.model_state["batch_stats"])
  b = jax.device_get(ref_state.model_state["batch_stats"])
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
  assert any(np.abs(x).max() > 0 for x in jax.tree.leaves(a))  # the running means moved


@pytest.mark.parametrize(
  "shape, devices, expected",
  [((-1, 1), 8, (8, 1)), ((-1, 2), 8, (4, 2)), ((2, -1), 8, (2, 4)), ((1, 1), 1, (1, 1))],
)
def test_resolve_mesh_shape(shape, devices, expected):
  assert resolve_mesh_shape(shape, devices) == expected


@pytest.mark.parametrize(
  "shape, match",
  [((-1, 3), "does not divide"), ((2, 2), "needs 4 devices"), ((-1, -1), "at most one -1"), ((8,), "2 entries")],
)
def test_bad_mesh_shape(shape, match):
  with pytest.raises(ValueError, match=match):
    resolve_mesh_shape(shape, 8)


def test_global_batch_rejects_indivisible_batch():
  mesh = make_mesh((8, 1), devices_for(8))
  with pytest.raises(ValueError, match="divisible by the mesh's data axis"):
    global_batch(random_batch(0, batch=6), mesh)


def test_logical_boxes_are_removed_from_state():
  built = build_model(tiny_model_config(), TINY_INFO)
  tx, _ = make_optimizer(tiny_optimizer_config(), 10)
  example = (random_batch(0)["inputs"][:1], random_batch(0)["mask"][:1])
  init_fn = make_init_fn(built.module, tx, example)
  abstract, _ = abstract_state(init_fn, jax.random.PRNGKey(0), make_mesh((1, 1), jax.devices()[:1]))
  leaves = jax.tree.leaves(abstract, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  assert not any(isinstance(x, nn.Partitioned) for x in leaves)
