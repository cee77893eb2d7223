"""Masks PrimalAttention cannot honour are refused, never silently reduced to padding (issue 18, item 1)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_utils import normal, padding_mask
from flax import linen as nn

from primal_jax.attention import PrimalAttention
from primal_jax.masks import mask_honoured

B, N, D, H = 2, 8, 16, 2
T = 5  # tokens at positions >= T are changed


def _layer(**kwargs):
  return PrimalAttention(num_heads=H, low_rank=3, num_samples=6, **kwargs)


def _inputs():
  x = jnp.asarray(normal(0, (B, N, D)))
  x_changed = x.at[:, T:].set(jnp.asarray(normal(1, (B, N - T, D))))
  return x, x_changed


def _causal_change(module, params, mask, apply_fn=None):
  """max |out[:, :T] - out'[:, :T]| when only tokens >= T change."""
  apply_fn = apply_fn or (lambda v: module.apply({"params": params}, v, mask=mask))
  x, x_changed = _inputs()
  return float(jnp.max(jnp.abs(apply_fn(x)[:, :T] - apply_fn(x_changed)[:, :T])))


def test_multi_head_attention_honours_a_causal_mask():
  """The control: the layer Primal-Attention stands in for ignores future tokens under a causal mask."""
  x, _ = _inputs()
  mask = nn.make_causal_mask(jnp.ones((B, N)))
  module = nn.MultiHeadDotProductAttention(num_heads=H)
  params = module.init(jax.random.key(0), x, mask=mask)["params"]
  assert _causal_change(module, params, mask) == 0.0


@pytest.mark.parametrize("combine_padding", [False, True])
def test_causal_mask_refused_by_a_non_causal_layer(combine_padding):
  """Eagerly a ValueError says what to do; the layer used to reduce the mask to padding and leak the future."""
  x, _ = _inputs()
  mask = nn.make_causal_mask(jnp.ones((B, N)))
  if combine_padding:
    pad = padding_mask(0, B, N)
    mask = nn.combine_masks(mask, nn.make_attention_mask(pad, pad))
  module = _layer()
  params = module.init(jax.random.key(0), x)["params"]
  with pytest.raises(ValueError, match="causal=True"):
    module.apply({"params": params}, x, mask=mask)


def test_causal_mask_under_jit_turns_the_outputs_nan():
  """Under jit the mask is a tracer: the sequences whose mask is not honoured come out NaN, never finite and wrong."""
  x, _ = _inputs()
  module = _layer()
  params = module.init(jax.random.key(0), x)["params"]
  causal = nn.make_causal_mask(jnp.ones((B, N)))
  full = nn.make_attention_mask(jnp.ones((B, N)), jnp.ones((B, N)))
  mask = jnp.concatenate([causal[:1], full[1:]])  # sequence 0 causal, sequence 1 not
  out = jax.jit(lambda v, m: module.apply({"params": params}, v, mask=m))(x, mask)
  assert bool(jnp.all(jnp.isnan(out[0])))
  assert bool(jnp.all(jnp.isfinite(out[1])))


def test_debug_checks_raise_under_jit():
  """With debug_checks the ValueError comes from a host callback (JAX wraps it in its runtime error)."""
  x, _ = _inputs()
  module = _layer(debug_checks=True)
  params = module.init(jax.random.key(0), x)["params"]
  mask = nn.make_causal_mask(jnp.ones((B, N)))
  with pytest.raises(Exception, match="causal=True"):
    jax.block_until_ready(jax.jit(lambda v, m: module.apply({"params": params}, v, mask=m))(x, mask))


@pytest.mark.parametrize("sampling", ["release", "padding_aware"])
def test_causal_layer_honours_causal_and_padding_masks(sampling):
  """causal=True: a causal mask, alone or combined with padding, is honoured (outputs before T do not move)."""
  x, _ = _inputs()
  pad = np.ones((B, N), bool)
  pad[1, -2:] = False  # padding after T only: padding before T would, in release mode, be averaged in by design
  module = _layer(causal=True, data_dependent=False, sampling=sampling)
  params = module.init(jax.random.key(0), x)["params"]
  causal = nn.make_causal_mask(jnp.ones((B, N)))
  for mask in (causal, nn.combine_masks(causal, nn.make_attention_mask(pad, pad))):
    assert _causal_change(module, params, mask) == 0.0


def test_non_mixing_layer_accepts_a_causal_mask():
  """Data-independent, cosine, non-causal: output i depends on x_i alone, so a causal mask is already honoured."""
  module = PrimalAttention(num_heads=H, low_rank=3, data_dependent=False)
  x, _ = _inputs()
  params = module.init(jax.random.key(0), x)["params"]
  assert _causal_change(module, params, nn.make_causal_mask(jnp.ones((B, N)))) == 0.0


def test_block_diagonal_mask_refused():
  """Packed sequences (a block-diagonal mask) cannot be honoured by sampled rows spanning the whole input."""
  x, _ = _inputs()
  segment = jnp.asarray(np.repeat([0, 1], N // 2))[None].repeat(B, 0)
  mask = nn.make_attention_mask(segment, segment, jnp.equal)
  module = _layer()
  params = module.init(jax.random.key(0), x)["params"]
  with pytest.raises(ValueError, match="cannot honour"):
    module.apply({"params": params}, x, mask=mask)


@pytest.mark.parametrize("forbidden", [-jnp.inf, -1e9])
def test_additive_mask_refused(forbidden):
  """An additive float mask (0 = attend, -inf = not) is refused, not cast to bool (which would invert it)."""
  x, _ = _inputs()
  pad = padding_mask(0, B, N)
  additive = jnp.where(nn.make_attention_mask(pad, pad) > 0, 0.0, forbidden)
  module = _layer()
  params = module.init(jax.random.key(0), x)["params"]
  with pytest.raises(ValueError, match="0 and 1"):
    module.apply({"params": params}, x, mask=additive)
  with pytest.raises(ValueError, match="0 and 1"):
    module.apply({"params": params}, x, mask=jnp.where(pad, 0.0, forbidden))


def test_mask_honoured_rule():
  """The rule itself: the pairs the layer uses must all be allowed by the mask, per sequence."""
  pad = jnp.asarray([[True] * 4, [True, True, True, False]])
  padding_form = nn.make_attention_mask(pad, pad)
  causal_form = nn.combine_masks(padding_form, nn.make_causal_mask(pad))
  np.testing.assert_array_equal(mask_honoured(padding_form, pad, "all"), [True, True])
  np.testing.assert_array_equal(mask_honoured(causal_form, pad, "all"), [False, False])
  np.testing.assert_array_equal(mask_honoured(causal_form, pad, "causal"), [True, True])
  np.testing.assert_array_equal(mask_honoured(causal_form, pad, "self"), [True, True])
  np.testing.assert_array_equal(mask_honoured(pad, pad, "all"), [True, True])  # a padding vector is always honoured
