"""Flax's `nnx.MultiHeadAttention` contract for the NNX layers of every registered mechanism (issue 53).

The project's own tests of what Flax's class promises (its constructor and call arguments, its state after a
call, the orbax checkpoint recipe of Flax's docs), not copies of Flax's tests. Shapes are those of `nnx_cases`.
"""

from __future__ import annotations

import dataclasses
import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from nnx_cases import D, H, N, decode_names, inputs, layer_pair, names, options

import primal_jax.nnx as pnnx
from primal_jax.nnx.arguments import FLAX_DEFAULTS


def build(name: str, seed: int = 0, **kwargs):
  return pnnx.get_attention(name)(num_heads=H, in_features=D, rngs=nnx.Rngs(seed), **options(name), **kwargs)


def linen_fields(name: str) -> set[str]:
  return {f.name for f in dataclasses.fields(pnnx.get_attention(name).linen_class)}


def variable_paths(module) -> dict[str, str]:
  """path -> Variable type of every Variable of `module` (nnx.Intermediate left out: sown per call, as in Flax)."""
  state = nnx.state(module)
  leaves = jax.tree_util.tree_leaves_with_path(state, is_leaf=lambda v: isinstance(v, nnx.Variable))
  return {jax.tree_util.keystr(p): type(v).__name__ for p, v in leaves if not isinstance(v, nnx.Intermediate)}


# ---- the constructor and the call take every argument of Flax's class ------------------------------------


@pytest.mark.parametrize("method", ["__init__", "__call__"])
def test_every_argument_of_flax_class_is_a_parameter_of_the_same_kind(method):
  flax = inspect.signature(getattr(nnx.MultiHeadAttention, method)).parameters
  ours = inspect.signature(getattr(pnnx.Attention, method)).parameters
  assert [n for n in flax if n not in ours] == []
  assert {n: p.kind for n, p in flax.items()} == {n: ours[n].kind for n in flax}


@pytest.mark.parametrize("rate", [-0.1, 1.0, 1.5, float("nan"), "0.1", True])
def test_dropout_rate_outside_zero_one_is_refused_in_one_line(rate):
  with pytest.raises(ValueError, match=r"^dropout_rate must be a number in \[0, 1\), got ") as err:
    build("softmax", dropout_rate=rate)
  assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", names())
def test_flax_defaults_passed_explicitly_change_nothing(name):
  explicit = dict(FLAX_DEFAULTS, kernel_metadata={}, query_ln_scale_metadata={}, key_ln_scale_metadata={})
  explicit.update(num_kv_heads=H, keep_rngs=True)
  x = inputs()
  np.testing.assert_array_equal(build(name, **explicit)(x), build(name)(x))


@pytest.mark.parametrize("name", names())
def test_out_initialisers_are_honoured_or_refused(name):
  if "out_kernel_init" not in linen_fields(name):
    with pytest.raises(ValueError, match="out_kernel_init="):
      build(name, out_kernel_init=nnx.initializers.zeros_init())
    return
  layer = build(name, out_kernel_init=nnx.initializers.zeros_init(), out_bias_init=nnx.initializers.ones_init())
  assert not np.any(np.asarray(layer.out["kernel"].get_value()))
  np.testing.assert_array_equal(layer(inputs()), np.ones((2, N, D)))  # 0 * heads + 1


@pytest.mark.parametrize("name", names())
def test_qkv_dot_general_drives_the_projections_or_is_refused(name):
  calls = []

  def dot_general(lhs, rhs, *args, **kwargs):
    calls.append(rhs.shape)
    return jax.lax.dot_general(lhs, rhs, *args, **kwargs)

  if "qkv_dot_general" not in linen_fields(name):
    with pytest.raises(ValueError, match="qkv_dot_general="):
      build(name, qkv_dot_general=dot_general)
    return
  layer, plain = build(name, qkv_dot_general=dot_general), build(name)
  calls.clear()
  x = inputs()
  np.testing.assert_array_equal(layer(x), plain(x))  # the hook computes the same products ...
  projections = [k for k in ("query", "key", "value") if k in layer.param_names]
  assert len(calls) == len(projections) > 0  # ... and is the one that computes them


def test_promote_dtype_other_than_flax_is_honoured_or_refused():
  def promote(args, /, *, dtype=None, inexact=True):
    return nnx.nn.dtypes.promote_dtype(args, dtype=dtype, inexact=inexact)

  if "qkv_promote_dtype" in linen_fields("softmax"):
    x = inputs()
    np.testing.assert_array_equal(build("softmax", qkv_promote_dtype=promote)(x), build("softmax")(x))
  else:
    with pytest.raises(ValueError, match="qkv_promote_dtype=.*promote.*Flax's default"):
      build("softmax", qkv_promote_dtype=promote)


@pytest.mark.parametrize("name", names())
def test_num_kv_heads_groups_heads_or_is_refused(name):
  cls = pnnx.get_attention(name).linen_class
  if not getattr(cls, "supports_kv_groups", False):
    with pytest.raises(ValueError, match="num_kv_heads=1"):
      build(name, num_kv_heads=1)
    return
  grouped = build(name, num_kv_heads=1)
  p = D // H
  assert grouped.key["kernel"].get_value().shape == (D, 1, p)
  # The same layer with every key/value head a copy of the shared one.
  full = build(name)
  for proj in ("query", "out"):
    for leaf in getattr(full, proj):
      getattr(full, proj)[leaf].set_value(getattr(grouped, proj)[leaf].get_value())
  for proj in [name for name in ("key", "value") if hasattr(grouped, name)]:  # Primal has no value projection
    for leaf in getattr(full, proj):
      getattr(full, proj)[leaf].set_value(jnp.repeat(getattr(grouped, proj)[leaf].get_value(), H, axis=-2))
  x = inputs()
  np.testing.assert_allclose(grouped(x), full(x), rtol=1e-6, atol=1e-6)


# ---- state hygiene: a fresh module has every Variable a called one has; Flax's orbax recipe works ---------


@pytest.mark.parametrize("name", names())
def test_fresh_module_has_every_variable_of_a_called_one(name):
  layer = build(name)
  fresh = variable_paths(layer)
  layer(inputs())
  assert variable_paths(layer) == fresh


class Model(nnx.Module):
  """Two attention layers and a head: what the orbax recipe saves and restores."""

  def __init__(self, name: str, rngs: nnx.Rngs):
    cls = pnnx.get_attention(name)
    self.first = cls(num_heads=H, in_features=D, rngs=rngs, **options(name))
    self.second = cls(num_heads=H, in_features=D, rngs=rngs, **options(name))
    self.head = nnx.Linear(D, 3, rngs=rngs)

  def __call__(self, x):
    return self.head(self.second(self.first(x)))


@pytest.mark.parametrize("name", ["primal", "softmax"])
def test_orbax_recipe_restores_a_called_model_into_a_fresh_abstract_one(name, tmp_path):
  ocp = pytest.importorskip("orbax.checkpoint")
  model = Model(name, nnx.Rngs(0))
  x = inputs()
  expected = model(x)  # a called model: Primal layers now hold their (batch-shaped) KSVD terms
  if name == "primal":
    assert len(pnnx.layer_terms(model)) == 2
  _, state = nnx.split(model)
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / "state", state)
  checkpointer.wait_until_finished()
  abstract = nnx.eval_shape(lambda: Model(name, nnx.Rngs(1)))  # other weights: the restore must replace them
  graphdef, abstract_state = nnx.split(abstract)
  restored = nnx.merge(graphdef, checkpointer.restore(tmp_path / "state", abstract_state))
  for path, value in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)):
    got = dict(jax.tree_util.tree_leaves_with_path(nnx.state(restored, nnx.Param)))[path]
    np.testing.assert_array_equal(got, value, err_msg=jax.tree_util.keystr(path))
  np.testing.assert_array_equal(restored(x), expected)
  if name == "primal":  # the restored model's loss reads the terms of its own calls
    np.testing.assert_allclose(pnnx.ksvd_loss(restored), pnnx.ksvd_loss(model), rtol=1e-6)


def test_keep_rngs_as_flax():
  kept = build("softmax", dropout_rate=0.5)
  _, _, rest = nnx.split(kept, nnx.Param, ...)
  assert isinstance(rest["rngs"]["count"], nnx.RngCount) and isinstance(rest["rngs"]["key"], nnx.RngKey)
  dropped = build("softmax", dropout_rate=0.5, keep_rngs=False)
  assert dropped.rngs is None
  x = inputs()
  with pytest.raises(ValueError, match="rngs"):
    dropped(x, deterministic=False)
  a = dropped(x, deterministic=False, rngs=nnx.Rngs(dropout=3))
  b = dropped(x, deterministic=False, rngs=nnx.Rngs(dropout=3))
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, dropped(x, deterministic=True))
  assert math.isfinite(float(jnp.sum(a)))


# ---- decoding: another batch, or a chunk past the cache, is never silent ---------------------------------


@pytest.fixture(scope="module", params=decode_names())
def decoder(request):
  layer, _, _ = layer_pair(request.param, causal=True)
  return request.param, layer


def test_decoding_another_batch_than_the_cache_is_refused(decoder):
  name, layer = decoder
  x = inputs()
  layer.init_cache(x.shape)
  with pytest.raises(ValueError, match=r"batch axes \(1,\), the cache holds \(2,\)"):
    layer(x[:1, :1], decode=True)  # Flax refuses it; it used to broadcast against the batch-2 state


def test_decoding_past_the_cache_is_refused_eagerly_and_nan_under_jit(decoder):
  name, layer = decoder
  x = inputs()
  layer.init_cache((2, 2, D))
  layer(x[:, :2], decode=True)
  with pytest.raises(ValueError, match="past the cache's 2 positions"):
    layer(x[:, 2:3], decode=True)
  layer.init_cache((2, 2, D))
  step = nnx.jit(lambda layer, t: layer(t, decode=True))
  assert np.all(np.isfinite(step(layer, x[:, :1]))) and np.all(np.isfinite(step(layer, x[:, 1:2])))
  assert np.all(np.isnan(step(layer, x[:, 2:3])))  # flagged, never silent numbers


def test_cache_batch_leaf_follows_a_beam_gather_and_decoding_goes_on():
  layer, _, _ = layer_pair("primal", causal=True)
  x = inputs()
  layer.init_cache(x.shape)
  layer(x[:, :3], decode=True)
  order = jnp.array([1, 1, 0])  # three beams from two sequences: every batch-leading cache leaf gathered
  cache = nnx.state(layer, nnx.Cache)
  nnx.update(layer, jax.tree.map(lambda v: v if v.ndim == 0 else v[order], cache))
  assert layer.cache_batch.shape == (3,)
  out = layer(x[order, 3:4], decode=True)
  fresh, _, _ = layer_pair("primal", causal=True)
  np.testing.assert_allclose(out, fresh(x[order, :4])[:, 3:], rtol=1e-5, atol=1e-5)
