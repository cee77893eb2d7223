"""cosFormer past its horizon and Flowformer with a fully padded sequence (issue 54, items 1 and 2).

Before: cosFormer with `horizon` below the sequence length ran (outputs past the horizon reached 1e4 and more:
the angle passes pi/2 and the cos weights turn negative), in a full call and when decoding past it; Flowformer's
non-causal form gave NaN outputs for a fully padded sequence (a softmax over only -inf) and NaN parameter
gradients even where the loss masked that row out.
Tolerances: 1e-5 relative (`numpy_reference.rel_err`) for float32 against float64 NumPy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest
from attention_utils import normal, random_params, to_numpy
from flax import linen as nn
from test_baseline_attention import cosformer_ref
from test_reformer_flowformer import _directional_check, _heads, _merge, flow_ref

from primal_jax.attention import get_attention

pytestmark = pytest.mark.matmul_precision("highest")

B, D, H = 2, 8, 2


def _cosformer(**kwargs):
  return get_attention("cosformer")(num_heads=H, **kwargs)


@pytest.mark.parametrize("causal", [False, True])
def test_cosformer_full_call_longer_than_the_horizon_is_refused(causal):
  x = normal(0, (B, 8, D))
  with pytest.raises(ValueError, match=r"^CosformerAttention: sequence length 8 exceeds horizon=4 \(the re-weighting"):
    _cosformer(horizon=4, causal=causal).init(jax.random.key(0), x)
  module = _cosformer(horizon=8, causal=causal)  # horizon = the length: the unchanged paper form
  params = random_params(module, x)
  out = np.asarray(module.apply({"params": params}, x))
  p64 = to_numpy(params)
  heads = cosformer_ref(*(_heads(p64, x, r) for r in ("query", "key", "value")), causal=causal)
  ref.assert_rel_close(out, _merge(p64, heads), 1e-5, "cosformer")


def _decode_steps(module, params, x, steps, jit):
  cache = module.init(jax.random.key(0), x[:, :1])["cache"]
  step = lambda c, t: module.apply({"params": params, "cache": c}, t, mutable=["cache"])  # noqa: E731
  step = jax.jit(step) if jit else step
  outs = []
  for i in range(steps):
    out, updated = step(cache, x[:, i : i + 1])
    cache = updated["cache"]
    outs.append(np.asarray(out))
  return np.concatenate(outs, axis=1)


def test_cosformer_decoding_past_the_horizon_is_refused_or_nan_never_numbers():
  """Within the horizon the steps are the full causal forward (float64 reference); the step past it raises
  eagerly, and under jit its outputs and every later one are NaN (the running sums are poisoned)."""
  x = normal(1, (B, 6, D))
  module = _cosformer(horizon=4, causal=True, decode=True)
  params = random_params(_cosformer(horizon=4, causal=True), x[:, :4])
  p64 = to_numpy(params)
  expected = _merge(p64, cosformer_ref(*(_heads(p64, x[:, :4], r) for r in ("query", "key", "value")), causal=True))
  jitted = _decode_steps(module, params, x, 6, jit=True)
  ref.assert_rel_close(jitted[:, :4], expected, 1e-5, "decode within the horizon")
  assert np.isnan(jitted[:, 4:]).all()  # before: finite, up to 1e4 x the in-horizon outputs
  with pytest.raises(ValueError, match=r"^CosformerAttention: decoding past horizon=4 \(positions >= the horizon"):
    _decode_steps(module, params, x, 5, jit=False)


@pytest.mark.parametrize("vector_mask", [True, False])
def test_flowformer_fully_padded_sequence_is_finite_and_real_rows_match_numpy(vector_mask):
  """Row 1 has no real position: its heads' outputs are zeros (the output is the projection's bias), the
  parameter gradients of a loss that masks it out are finite, and row 0's real positions match float64."""
  module = get_attention("flowformer")(num_heads=H)
  x = normal(2, (B, 6, D))
  pad = np.array([[True, True, True, True, False, False], [False] * 6])
  params = random_params(module, x, mask=pad)
  p64 = to_numpy(params)
  mask = jnp.asarray(pad) if vector_mask else nn.make_attention_mask(pad, pad)
  out = np.asarray(module.apply({"params": params}, x, mask=mask))
  assert np.isfinite(out).all()  # before: row 1 all NaN
  heads = flow_ref(*(_heads(p64, x[:1], r) for r in ("query", "key", "value")), pad[:1])
  ref.assert_rel_close(out[0, pad[0]], _merge(p64, heads)[0, pad[0]], 1e-5, "real row")
  np.testing.assert_allclose(out[1], np.broadcast_to(p64["out"]["bias"], (6, D)), rtol=0, atol=1e-6)
  weights = jnp.asarray(pad[..., None] * normal(3, (B, 6, D)))  # the loss masks row 1 out

  def loss(p):
    return jnp.sum(module.apply({"params": p}, x, mask=mask) * weights)

  grads = jax.grad(loss)(params)
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))  # before: NaN everywhere


def test_flowformer_gradient_with_a_fully_padded_row_matches_float64_differences():
  module = get_attention("flowformer")(num_heads=H)
  x = normal(4, (B, 6, D))
  pad = np.array([[True, True, True, False, True, True], [False] * 6])

  def reference(p64, xs):
    heads = np.zeros((B, H, 6, D // H))
    heads[:1] = flow_ref(*(_heads(p64, xs[:1], r) for r in ("query", "key", "value")), pad[:1])
    return _merge(p64, heads) * pad[..., None]

  _directional_check(module, x, jnp.asarray(pad), reference, 5)
