"""primal_jax.nnx layers: the Linen layers' numbers (outputs, gradients, KSVD terms, annotations) in NNX,
their constructor/call rules, and decoding equal to the full forward.

Tolerance: float32, rtol 1e-5 / atol 1e-6 (the NNX layer applies the Linen layer's code, so differences
come only from XLA fusing the two programs differently; eager runs agree to the bit)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx
from nnx_cases import B, D, H, N, assert_trees_close, decode_names, inputs, layer_pair, names, options, padding

import primal_jax.nnx as pnnx
from primal_jax.attention import get_attention as linen_class
from primal_jax.ksvd import collect_terms, ksvd_loss

# Compares with float64 NumPy, golden numbers or the Linen layer at float32 tolerances: full float32 matmuls.
pytestmark = pytest.mark.matmul_precision("highest")


@pytest.mark.parametrize("name", names())
def test_outputs_and_gradients_equal_linen(name):
  layer, module, params = layer_pair(name)
  x, mask = inputs(), padding()

  def linen_loss(p):
    out, state = module.apply({"params": p}, x, mask=mask, mutable=["ksvd"])
    return jnp.sum(out**2) + (ksvd_loss(state["ksvd"]) if state else 0.0), out

  def nnx_loss(layer):
    out = layer(x, mask=mask)
    return jnp.sum(out**2) + pnnx.ksvd_loss(layer, allow_empty=True), out

  # Jitted, each one compilation (eager, every op of the forward and backward compiles on its own: up to 1.6x the
  # CPU time for the larger mechanisms); the two programs differ, so XLA may fuse them differently: within rtol.
  (loss_l, out_l), grad_l = jax.jit(jax.value_and_grad(linen_loss, has_aux=True))(params)
  (loss_n, out_n), grad_n = nnx.jit(nnx.value_and_grad(nnx_loss, has_aux=True))(layer)
  np.testing.assert_allclose(out_n, out_l, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(loss_n, loss_l, rtol=1e-5)
  assert_trees_close(pnnx.trees.to_tree(grad_n), grad_l)
  assert float(jnp.max(jnp.abs(out_n))) > 0.1  # a real output, not zeros


@pytest.mark.parametrize("name", names())
def test_linen_checkpoint_round_trip(name):
  """Linen init -> NNX (from_linen) -> Linen gives the same tree, and the NNX layer the Linen output."""
  module = linen_class(name)(num_heads=H, **options(name))
  x = inputs(1)
  variables = module.init(jax.random.key(3), x)
  layer = pnnx.from_linen(module, variables, in_features=D)
  back = pnnx.linen_variables(layer)
  assert_trees_close(back["params"], nn.unbox(variables["params"]), rtol=0, atol=0)
  np.testing.assert_allclose(layer(x), module.apply(variables, x, mutable=["ksvd"])[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", names())
def test_logical_partitioning_equals_linen(name):
  layer, module, _ = layer_pair(name)
  boxed = module.init(jax.random.key(0), inputs())["params"]
  linen_names = {
    jax.tree_util.keystr(path): tuple(box.names)
    for path, box in jax.tree_util.tree_leaves_with_path(boxed, is_leaf=lambda v: isinstance(v, nn.Partitioned))
  }
  state = nnx.state(layer, nnx.Param)
  nnx_names = {
    jax.tree_util.keystr(path): v.get_metadata()["out_sharding"]
    for path, v in jax.tree_util.tree_leaves_with_path(state, is_leaf=lambda v: isinstance(v, nnx.Variable))
  }
  assert nnx_names == linen_names and linen_names
  spec = nnx.get_partition_spec(state)
  assert tuple(spec["query"]["kernel"].get_value()) == ("embed", "heads", "kv")


def test_ksvd_terms_replaced_each_call_and_equal_linen():
  layer, module, params = layer_pair("primal")
  x, mask = inputs(), padding()
  with pytest.raises(ValueError, match="holds no KSVDTerms"):
    pnnx.ksvd_loss(nnx.state(layer, pnnx.KSVDVariable))  # the forgotten collection
  layer(inputs(5), mask=mask)
  layer(x, mask=mask)  # replaces the first call's terms
  state = nnx.state(layer, pnnx.KSVDVariable)
  terms = pnnx.layer_terms(state)
  assert len(terms) == 1
  _, linen_state = module.apply({"params": params}, x, mask=mask, mutable=["ksvd"])
  assert_trees_close(terms[0], collect_terms(linen_state["ksvd"])[0])
  for spec in ("paper", "release_lra", "release_sequence"):
    np.testing.assert_allclose(pnnx.ksvd_loss(state, spec), ksvd_loss(linen_state["ksvd"], spec), rtol=1e-6)
  np.testing.assert_allclose(
    pnnx.ksvd_regularizer(layer, 0.5), 0.5 * ksvd_loss(linen_state["ksvd"]), rtol=1e-6
  )  # a model is filtered for the user
  popped = nnx.pop(layer, pnnx.KSVDVariable)
  assert len(pnnx.layer_terms(popped)) == 1 and not pnnx.layer_terms(layer)
  layer(x, mask=mask)
  assert len(pnnx.layer_terms(layer)) == 1
  with pytest.raises(ValueError, match="eta"):
    pnnx.ksvd_regularizer(layer, -1.0)


@pytest.mark.parametrize("name", decode_names())
def test_decoding_equals_the_full_forward(name):
  layer, _, _ = layer_pair(name, causal=True)
  x = inputs(2)
  full = layer(x)
  layer.init_cache(x.shape)
  step = nnx.jit(lambda layer, t: layer(t, decode=True))
  tokens = [step(layer, x[:, i : i + 1]) for i in range(N)]
  np.testing.assert_allclose(jnp.concatenate(tokens, 1), full, rtol=1e-5, atol=1e-6)
  layer.init_cache(x.shape)  # chunks of several tokens decode the same
  chunks = [layer(x[:, :3], decode=True), layer(x[:, 3:], decode=True)]
  np.testing.assert_allclose(jnp.concatenate(chunks, 1), full, rtol=1e-5, atol=1e-6)


def test_primal_decoding_state_is_constant_in_the_context():
  layer, _, _ = layer_pair("primal", causal=True)
  sizes = []
  for max_len in (8, 512):
    layer.init_cache((B, max_len, D))
    sizes.append(sum(v.size for v in jax.tree_util.tree_leaves(pnnx.linen_variables(layer)["cache"])))
  assert sizes[0] == sizes[1] == B * (2 * D + 1)  # sum_q, sum_k [B, H, p] and the count [B]
  soft, _, _ = layer_pair("softmax", causal=True)
  soft.init_cache((B, 512, D))
  cache = jax.tree_util.tree_leaves(pnnx.linen_variables(soft)["cache"])
  assert sum(v.size for v in cache) >= 2 * B * 512 * D  # every key and value, whatever the cache's layout


def test_rules_are_the_linen_rules():
  x = inputs()
  causal_mask = nnx.make_causal_mask(jnp.ones((B, N)))
  primal, _, _ = layer_pair("primal")
  with pytest.raises(ValueError, match="cannot honour this mask"):
    primal(x, mask=causal_mask)  # non-causal Primal mixes all pairs
  with pytest.raises(ValueError, match="causal=True needs data_dependent=False"):
    primal(x, is_causal=True)
  linformer, _, _ = layer_pair("linformer")  # non-causal only (Performer has a causal form since issue 28)
  with pytest.raises(ValueError, match="causal=True is not supported by LinformerAttention"):
    linformer(x, is_causal=True)
  with pytest.raises(ValueError, match="=True is not supported by LinformerAttention"):
    linformer.init_cache(x.shape)
  soft, _, _ = layer_pair("softmax")
  with pytest.raises(ValueError, match="call init_cache"):
    soft(x[:, :1], decode=True)
  with pytest.raises(ValueError, match="in_features is 16"):
    soft(jnp.ones((B, N, 3)))
  with pytest.raises(ValueError, match="'low_rnak' is not an option"):
    pnnx.PrimalAttention(num_heads=H, in_features=D, low_rnak=3, rngs=nnx.Rngs(0))
  # normalize_qk=True was refused here; it is honoured now, as Flax does it (tests/test_flax_contract_nnx.py).
  with pytest.raises(ValueError, match="needs max_len"):
    pnnx.get_attention("linformer")(num_heads=H, in_features=D, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="attention must be one of"):
    pnnx.get_attention("nope")
  # softmax honours a causal mask as nnx.MultiHeadAttention does
  np.testing.assert_allclose(soft(x, mask=causal_mask), soft(x, is_causal=True), rtol=1e-6, atol=1e-6)


def test_dropout_keys_come_from_rngs_as_in_linen():
  layer, module, params = layer_pair("softmax", dropout_rate=0.3)
  x = inputs()
  with pytest.raises(ValueError, match="needs deterministic"):
    layer(x)
  key = nnx.Rngs(dropout=7).dropout()  # the key the layer draws from nnx.Rngs(dropout=7)
  out = layer(x, deterministic=False, rngs=nnx.Rngs(dropout=7))
  linen = module.apply({"params": params}, x, deterministic=False, rngs={"dropout": key})
  np.testing.assert_allclose(out, linen, rtol=1e-6, atol=1e-6)
  assert not np.allclose(out, layer(x, deterministic=True))
  layer.eval()  # nnx's eval() sets deterministic
  np.testing.assert_allclose(layer(x), layer(x, deterministic=True))


def test_sow_weights_and_bf16():
  soft, module, params = layer_pair("softmax")
  x = inputs()
  _, sown = nnx.capture(lambda layer, x: layer(x, sow_weights=True), nnx.Intermediate)(soft, x)
  weights = sown["attention_weights"][0]
  _, linen_state = module.apply({"params": params}, x, sow_weights=True, mutable=["intermediates"])
  np.testing.assert_allclose(weights, linen_state["intermediates"]["attention_weights"][0], rtol=1e-6)
  for name in ("primal", "softmax"):
    f32, _, _ = layer_pair(name)
    bf16, module, params = layer_pair(name, dtype=jnp.bfloat16)
    out = bf16(x)
    assert out.dtype == jnp.bfloat16
    assert all(v.dtype == jnp.float32 for v in jax.tree_util.tree_leaves(nnx.state(bf16, nnx.Param)))
    np.testing.assert_allclose(out.astype(jnp.float32), f32(x), rtol=0.05, atol=0.05)
    linen = module.apply({"params": params}, x, mutable=["ksvd"])[0]
    np.testing.assert_allclose(out.astype(jnp.float32), linen.astype(jnp.float32), rtol=1e-2, atol=1e-2)


def test_a_mechanism_registered_later_gets_an_nnx_class():
  from primal_jax.attention import SoftmaxAttention, register_attention, unregister_attention

  class Halved(SoftmaxAttention):
    scale: float = 0.5

    def attend(self, q, k, v, **kwargs):
      return self.scale * super().attend(q, k, v, **kwargs)

  register_attention("halved_test", Halved)
  try:
    cls = pnnx.get_attention("halved_test")
    assert cls is pnnx.get_attention("halved_test") and cls.linen_class is Halved
    layer = cls(num_heads=H, in_features=D, scale=0.25, rngs=nnx.Rngs(0))
    module, variables = pnnx.to_linen(layer)
    np.testing.assert_allclose(layer(inputs()), module.apply(variables, inputs()), rtol=1e-6)
    assert module.scale == 0.25
  finally:
    unregister_attention("halved_test")


def test_partitioning_metadata_of_the_nnx_constructor():
  """kernel_metadata / out_kernel_metadata and nnx.with_partitioning initialisers annotate the projections,
  as in nnx.MultiHeadAttention; the mechanism's own parameters keep the Linen names."""
  layer = pnnx.PrimalAttention(
    num_heads=H,
    in_features=D,
    kernel_init=nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "model", None)),
    out_kernel_metadata={"out_sharding": ("model", None, None)},
    rngs=nnx.Rngs(0),
    **options("primal"),
  )
  names = {k: getattr(layer, k)["kernel"].get_metadata()["out_sharding"] for k in ("query", "key", "out")}
  assert names == {"query": (None, "model", None), "key": (None, "model", None), "out": ("model", None, None)}
  assert layer.query["bias"].get_metadata()["out_sharding"] == ("heads", "kv")
  assert layer.We.get_metadata()["out_sharding"] == ("heads", None, "rank")
  assert layer.combine["kernel"].get_metadata()["out_sharding"] == ("rank2", "kv")
  reference = pnnx.PrimalAttention(num_heads=H, in_features=D, rngs=nnx.Rngs(0), **options("primal"))
  np.testing.assert_array_equal(layer.query["kernel"].get_value(), reference.query["kernel"].get_value())


def test_set_view_creates_the_cache_for_decoding():
  layer, _, _ = layer_pair("primal", causal=True)
  x = inputs()
  full = layer(x)
  view = nnx.view(layer, decode=True, batch_size=B, max_length=N)
  assert view.decode and view.cache is not None
  np.testing.assert_allclose(jnp.concatenate([view(x[:, i : i + 1]) for i in range(N)], 1), full, atol=1e-6)
