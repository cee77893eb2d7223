"""Tests of primal_jax.attention.SoftmaxAttention, the baseline (release masking: -1e6 at masked keys)."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest
from absl.testing import parameterized
from attention_utils import normal, padding_mask, random_params, to_numpy
from flax import linen as nn

from primal_jax.attention import SoftmaxAttention

# Compares with float64 NumPy or golden numbers at float32 tolerances: full float32 matmuls on every platform.
pytestmark = pytest.mark.matmul_precision("highest")

B, N, M, D, H = 3, 7, 5, 16, 2
P = D // H


def _allowed(mask_kind, pad, causal, n_q=N, n_k=N):
  """[B, 1, n_q, n_k] "may attend" mask in float64 NumPy, or None."""
  allowed = np.ones((B, 1, n_q, n_k), bool)
  if mask_kind is not None:
    allowed &= pad[:, None, None, :n_k]
  if causal:
    allowed &= np.tril(np.ones((n_q, n_k), bool))[None, None]
  return allowed if (mask_kind is not None or causal) else None


@pytest.mark.parametrize("mask_kind", [None, "padding", "attention"])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_numpy(mask_kind, causal):
  """softmax(Q K^T / sqrt(p) - 1e6 (1 - mask)) V, merged heads, output projection; padded queries still attend."""
  module = SoftmaxAttention(num_heads=H, causal=causal)
  x = normal(0, (B, N, D))
  pad = padding_mask(0, B, N)
  mask = {None: None, "padding": pad, "attention": nn.make_attention_mask(np.ones((B, N), bool), pad)}[mask_kind]
  params = random_params(module, x, mask=mask)
  out = module.apply({"params": params}, x, mask=mask)
  expected = ref.softmax_attention(to_numpy(params), x, x, num_heads=H, allowed=_allowed(mask_kind, pad, causal))
  chex.assert_shape(out, (B, N, D))
  ref.assert_rel_close(out, expected, 1e-5)


def test_cross_attention_and_widths():
  """inputs_kv of another length M, qkv_features != D and out_features."""
  module = SoftmaxAttention(num_heads=H, qkv_features=8, out_features=5)
  x, y = normal(1, (B, N, D)), normal(2, (B, M, D))
  variables = jax.eval_shape(functools.partial(module.init, inputs_kv=y), jax.random.key(0), x)
  params = jax.tree_util.tree_map(lambda a: jnp.asarray(normal(4, a.shape)), nn.meta.unbox(variables["params"]))
  out = module.apply({"params": params}, x, inputs_kv=y)
  chex.assert_shape(out, (B, N, 5))
  ref.assert_rel_close(out, ref.softmax_attention(to_numpy(params), x, y, num_heads=H), 1e-5)
  np.testing.assert_array_equal(module.apply({"params": params}, x, y), out)


def test_equals_flax_multi_head_attention():
  """Same parameter tree as nn.MultiHeadDotProductAttention and the same numbers (no fully masked rows)."""
  x = normal(5, (B, N, D))
  pad = padding_mask(5, B, N)
  mask = nn.make_attention_mask(pad, pad)
  flax_mha = nn.MultiHeadDotProductAttention(num_heads=H)
  params = random_params(flax_mha, x, mask=mask)
  ours = SoftmaxAttention(num_heads=H)
  assert jax.tree_util.tree_map(jnp.shape, params) == jax.tree_util.tree_map(jnp.shape, random_params(ours, x))
  out_flax = flax_mha.apply({"params": params}, x, mask=mask)
  out_ours = ours.apply({"params": params}, x, mask=mask)
  ref.assert_rel_close(np.asarray(out_ours)[pad], np.asarray(out_flax)[pad], 1e-5)


def test_fully_masked_row_is_finite():
  """A query with every key masked gets finite weights summing to 1 (release: -1e6, not -inf), never NaN.

  Not uniform in float32: s - 1e6 keeps s to 1/16, so the row is ~ the unmasked softmax.
  """
  module = SoftmaxAttention(num_heads=H)
  x = normal(6, (B, N, D))
  allowed = np.ones((B, 1, N, N), bool)
  allowed[0, 0, 2, :] = False
  params = random_params(module, x)
  out, state = module.apply({"params": params}, x, mask=allowed, sow_weights=True, mutable=["intermediates"])
  weights = np.asarray(state["intermediates"]["attention_weights"][0])
  chex.assert_tree_all_finite(out)
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
  assert np.all(weights[0, :, 2] > 0)


def test_sow_weights_masked_keys_get_zero_weight():
  """sow_weights=True stores [B, H, N, M] rows that sum to 1 and vanish at masked keys."""
  module = SoftmaxAttention(num_heads=H)
  x = normal(7, (B, N, D))
  pad = padding_mask(7, B, N)
  params = random_params(module, x)
  _, state = module.apply({"params": params}, x, mask=pad, sow_weights=True, mutable=["intermediates"])
  weights = np.asarray(state["intermediates"]["attention_weights"][0])
  chex.assert_shape(weights, (B, H, N, N))
  np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
  assert np.all(weights[np.broadcast_to(~pad[:, None, None, :], weights.shape)] < 1e-30)


class SoftmaxShapesTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(dtype=[jnp.float32, jnp.bfloat16], causal=[False, True])
  def test_shapes_and_dtypes(self, dtype, causal):
    """[B, N, D] -> [B, N, D] in the module dtype, also with bf16 parameters."""
    module = SoftmaxAttention(num_heads=H, causal=causal, dtype=dtype, param_dtype=dtype)
    x = jnp.asarray(normal(8, (B, N, D)), dtype)
    variables = {"params": random_params(module, x)}
    out = self.variant(lambda v, x: module.apply(v, x, mask=jnp.asarray(padding_mask(8, B, N))))(variables, x)
    chex.assert_shape(out, (B, N, D))
    chex.assert_type(out, dtype)
    chex.assert_tree_all_finite(out)


def test_dropout_on_attention_weights():
  """Dropout needs deterministic; deterministic=True equals dropout_rate=0, False changes the output."""
  x = normal(9, (B, N, D))
  base = SoftmaxAttention(num_heads=H)
  params = random_params(base, x)
  drop = SoftmaxAttention(num_heads=H, dropout_rate=0.5)
  np.testing.assert_array_equal(
    drop.apply({"params": params}, x, deterministic=True), base.apply({"params": params}, x)
  )
  noisy = drop.apply({"params": params}, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
  assert ref.rel_err(noisy, base.apply({"params": params}, x)) > 1e-3


X, Y, Y1 = (np.zeros(shape, np.float32) for shape in ((B, N, D), (B, M, D), (B, M + 1, D)))


@pytest.mark.parametrize(
  "kwargs,inputs,call_kwargs,match",
  [
    (dict(), X[0, 0], {}, "inputs_q"),
    (dict(num_heads=3), X, {}, "qkv_features"),
    (dict(num_heads=0), X, {}, "num_heads"),
    (dict(), X, dict(mask=np.ones((B, N + 1), bool)), "mask"),
    (dict(), X, dict(inputs_k=Y, inputs_v=Y1), "inputs_v"),
    (dict(), X, dict(inputs_k=Y, inputs_kv=Y), "inputs_kv"),
    (dict(causal=True), X, dict(inputs_kv=Y), "causal"),
    (dict(init_style="kaiming"), X, {}, "init_style"),
    (dict(num_kv_heads=0), X, {}, "num_kv_heads"),
  ],
)
def test_clear_errors(kwargs, inputs, call_kwargs, match):
  """Invalid configurations and inputs raise ValueError naming the argument."""
  with pytest.raises(ValueError, match=match):
    module = SoftmaxAttention(**{"num_heads": H, **kwargs})
    jax.eval_shape(functools.partial(module.init, **call_kwargs), jax.random.key(0), inputs)


def test_debug_checks():
  """debug_checks=True rejects NaN inputs eagerly, naming the input."""
  module = SoftmaxAttention(num_heads=H, debug_checks=True)
  x = normal(10, (B, N, D))
  variables = {"params": random_params(module, x)}
  bad = x.copy()
  bad[0, 0, 0] = np.nan
  with pytest.raises(ValueError, match="inputs_q"):
    module.apply(variables, bad)
