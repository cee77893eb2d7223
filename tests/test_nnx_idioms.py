"""The NNX idioms on primal_jax.nnx layers: nnx.jit with nnx.value_and_grad and an nnx.Optimizer, nnx.scan
over a stack of blocks (with stacked KSVD terms), nnx.remat, nnx.vmap over an ensemble, a sharded forward
on the 8 fake CPU devices of conftest.py, and the CausalLM example's decoding."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from nnx_cases import B, D, H, N, assert_trees_close, inputs, layer_pair, options, padding

import primal_jax.nnx as pnnx
from primal_jax.ksvd import ksvd_loss
from primal_jax.training.sharding import LOGICAL_AXIS_RULES, make_mesh

# Compares with float64 NumPy, golden numbers or the Linen layer at float32 tolerances: full float32 matmuls.
pytestmark = pytest.mark.matmul_precision("highest")

PRIMAL = functools.partial(pnnx.PrimalAttention, num_heads=H, in_features=D, **options("primal"))


class Block(nnx.Module):
  def __init__(self, rngs):
    self.attention = PRIMAL(rngs=rngs)
    self.norm = nnx.LayerNorm(D, rngs=rngs)

  def __call__(self, x):
    return x + self.attention(self.norm(x))


def test_jit_value_and_grad_and_optimizer_train():
  layer, module, params = layer_pair("primal")
  x, mask = inputs(), padding()
  target = jnp.asarray(np.random.default_rng(9).standard_normal((B, N, D)), jnp.float32)

  def loss_fn(layer):
    return jnp.mean((layer(x, mask=mask) - target) ** 2) + pnnx.ksvd_regularizer(layer, 0.1)

  def linen_loss(p):
    out, state = module.apply({"params": p}, x, mask=mask, mutable=["ksvd"])
    return jnp.mean((out - target) ** 2) + 0.1 * ksvd_loss(state["ksvd"])

  loss, grads = nnx.jit(nnx.value_and_grad(loss_fn))(layer)
  linen_value, linen_grads = jax.value_and_grad(linen_loss)(params)
  np.testing.assert_allclose(loss, linen_value, rtol=1e-5)
  assert_trees_close(pnnx.trees.to_tree(grads), linen_grads)
  optimizer = nnx.Optimizer(layer, optax.adam(1e-2), wrt=nnx.Param)

  @nnx.jit
  def step(layer, optimizer):
    loss, grads = nnx.value_and_grad(loss_fn)(layer)
    optimizer.update(layer, grads)
    return loss

  losses = [float(step(layer, optimizer)) for _ in range(8)]
  assert losses[-1] < losses[0] * 0.95, losses


def _stack(num_layers, seed=0):
  @nnx.split_rngs(splits=num_layers)
  @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
  def create(rngs):
    return Block(rngs)

  return create(nnx.Rngs(seed))


def _scan_forward(stack, x):
  @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry, transform_metadata={nnx.PARTITION_NAME: "layers"})
  def forward(x, block):
    return block(x)

  return forward(x, stack)


def test_scan_over_blocks_matches_the_unrolled_stack_with_stacked_terms():
  num_layers = 3
  stack = _stack(num_layers)
  x = inputs()
  out = nnx.jit(_scan_forward)(stack, x)
  stacked = nnx.state(stack, pnnx.KSVDVariable)
  assert stacked["attention"]["ksvd"].get_value().count.shape == (num_layers, B)
  # The same blocks one by one.
  graphdef, state = nnx.split(stack)
  y, terms = x, []
  for i in range(num_layers):
    block = nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], state))
    y = block(y)
    terms.append(block.attention.ksvd.get_value())
  np.testing.assert_allclose(out, y, rtol=1e-5, atol=1e-5)
  for spec in ("paper", "release_lra"):
    np.testing.assert_allclose(pnnx.ksvd_loss(stacked, spec), ksvd_loss(terms, spec), rtol=1e-5)
  # Annotations gain the "layers" axis.
  assert stack.attention.query["kernel"].get_metadata()["out_sharding"] == ("layers", "embed", "heads", "kv")


def test_remat_gives_the_same_values_and_gradients():
  block = Block(nnx.Rngs(0))
  x = inputs()

  def loss(block, remat):
    call = nnx.remat(lambda block, x: block(x)) if remat else (lambda block, x: block(x))
    return jnp.sum(call(block, x) ** 2) + pnnx.ksvd_loss(block)

  plain = nnx.value_and_grad(functools.partial(loss, remat=False))(block)
  remat = nnx.jit(nnx.value_and_grad(functools.partial(loss, remat=True)))(block)
  np.testing.assert_allclose(remat[0], plain[0], rtol=1e-5)
  assert_trees_close(pnnx.trees.to_tree(remat[1]), pnnx.trees.to_tree(plain[1]), rtol=1e-4, atol=1e-5)


def test_vmap_over_an_ensemble():
  members = 3

  @nnx.split_rngs(splits=members)
  @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "ensemble"})
  def create(rngs):
    return PRIMAL(rngs=rngs)

  ensemble = create(nnx.Rngs(0))
  x = inputs()
  out = nnx.vmap(lambda layer, x: layer(x), in_axes=(0, None), transform_metadata={nnx.PARTITION_NAME: "ensemble"})(
    ensemble, x
  )
  assert out.shape == (members, B, N, D)
  graphdef, state = nnx.split(ensemble)
  for i in range(members):
    member = nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], state))
    np.testing.assert_allclose(out[i], member(x), rtol=1e-5, atol=1e-6)
  assert not np.allclose(out[0], out[1])  # members differ
  assert len(pnnx.layer_terms(ensemble)) == members


def test_sharded_forward_on_eight_devices():
  assert jax.device_count() == 8
  layer, _, _ = layer_pair("primal")
  x = jnp.tile(inputs(), (4, 1, 1))  # batch 8
  expected = layer(x)
  mesh = make_mesh((4, 2))
  state = nnx.state(layer)
  # The Linen layers' logical names, mapped by the same rules as the Linen training's.
  shardings = nn.logical_to_mesh_sharding(nnx.get_partition_spec(state), mesh, LOGICAL_AXIS_RULES)
  nnx.update(layer, jax.device_put(state, shardings))
  assert layer.query["kernel"].get_value().sharding.spec == PartitionSpec(None, "model", None)
  assert layer.We.get_value().sharding.spec == PartitionSpec("model", None, None)
  x = jax.device_put(x, NamedSharding(mesh, PartitionSpec("data")))
  out = nnx.jit(lambda layer, x: layer(x))(layer, x)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
  assert len(out.sharding.device_set) == 8


def test_causal_lm_decodes_its_full_forward_and_generates():
  for attention in (pnnx.lm.DEFAULT_ATTENTION, pnnx.SoftmaxAttention):
    model = pnnx.CausalLM(vocab_size=11, max_len=12, dim=16, num_heads=2, attention=attention, rngs=nnx.Rngs(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 11, (B, 9)), jnp.int32)
    full = model(tokens)
    model.init_cache(B, 9)
    pieces = [model(tokens[:, :4], decode=True)] + [model(tokens[:, i : i + 1], decode=True) for i in range(4, 9)]
    np.testing.assert_allclose(jnp.concatenate(pieces, 1), full, rtol=1e-5, atol=1e-5)
    out = model.generate(tokens[:, :3], 4)
    assert out.shape == (B, 7) and (out[:, :3] == tokens[:, :3]).all()
    np.testing.assert_array_equal(out[:, 3], jnp.argmax(model(out[:, :3])[:, -1], -1))  # greedy = the argmax
