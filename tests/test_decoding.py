"""Incremental decoding: token-by-token outputs equal the full causal forward (SPEC 4)."""

import functools
import math
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest
from attention_utils import normal, padding_mask, random_params
from flax import linen as nn

from primal_jax.attention import PrimalAttention, SoftmaxAttention

# Compares with float64 NumPy or golden numbers at float32 tolerances: full float32 matmuls on every platform.
pytestmark = pytest.mark.matmul_precision("highest")

B, N, D, H, S = 2, 9, 16, 2, 3
P = D // H


def _primal(feature_map, **kwargs):
  full = PrimalAttention(num_heads=H, low_rank=S, data_dependent=False, causal=True, feature_map=feature_map, **kwargs)
  return full, full.clone(decode=True)


@functools.partial(jax.jit, static_argnums=0)
def _step(module, params, cache, x_t, mask_t):
  """One jitted decoding call; compiled once per (module, chunk length) and shared across tests."""
  return module.apply({"params": params, "cache": cache}, x_t, mask=mask_t, mutable=["cache"])


def _decode(module, params, cache, x, chunks, mask=None):
  """Feeds x in consecutive chunks of the given sizes; returns [B, N, D] outputs and the final cache."""
  outs, start = [], 0
  for size in chunks:
    m = None if mask is None else jnp.asarray(mask[:, start : start + size])
    out, state = _step(module, params, cache, x[:, start : start + size], m)
    outs.append(out)
    cache = state["cache"]
    start += size
  assert start == x.shape[1]
  return np.concatenate([np.asarray(o) for o in outs], axis=1), cache


@pytest.mark.parametrize("feature_map", ["cosine", "softmax_kernel"])
@pytest.mark.parametrize("chunks", [[1] * N, [4] + [1] * (N - 4)], ids=["tokens", "prefix"])
def test_primal_decoding_equals_full_forward(feature_map, chunks):
  """Cached running sums reproduce the causal layer: tokens one by one, or a prefix chunk then tokens."""
  full, dec = _primal(feature_map)
  x = normal(0, (B, N, D))
  params = random_params(full, x)
  expected = np.asarray(full.apply({"params": params}, x))
  cache = dec.init(jax.random.key(0), x[:, :1])["cache"]
  out, _ = _decode(dec, params, cache, x, chunks)
  ref.assert_rel_close(out, expected, 1e-5)


@pytest.mark.parametrize("feature_map", ["cosine", "softmax_kernel"])
def test_primal_cache_shapes_independent_of_length(feature_map):
  """The cache holds running sums only: its shapes do not depend on the sequence length."""
  full, dec = _primal(feature_map)
  x = normal(1, (B, N, D))
  params = random_params(full, x)
  shapes = lambda tree: jax.tree_util.tree_map(jnp.shape, tree)
  variables_1 = dec.init(jax.random.key(0), x[:, :1])
  assert shapes(nn.meta.unbox(variables_1["params"])) == shapes(params)  # same tree as decode=False
  cache_1 = variables_1["cache"]
  cache_n = dec.init(jax.random.key(0), x)["cache"]
  expected = {"sum_q": (B, H, P), "sum_k": (B, H, P), "count": (B,)}
  if feature_map == "softmax_kernel":
    expected["sum_phi_k"] = (B, H, P)
  assert shapes(cache_1) == shapes(cache_n) == expected
  _, final = _decode(dec, params, cache_1, x, [1] * N)
  assert shapes(final) == expected
  np.testing.assert_array_equal(final["count"], np.full(B, N, np.float32))
  # sum_q = sum_t (x_t Wq + bq) over all N tokens.
  sum_q = np.einsum("bnd,dhp->bhp", x, params["query"]["kernel"]) + N * np.asarray(params["query"]["bias"])
  np.testing.assert_allclose(final["sum_q"], sum_q, rtol=1e-5, atol=1e-5)


def test_primal_decode_does_not_sow_ksvd_terms():
  """Decoding is inference: no KSVD terms are sown (the cache is the only mutable state)."""
  full, dec = _primal("cosine")
  x = normal(2, (B, N, D))
  params = random_params(full, x)
  cache = dec.init(jax.random.key(0), x[:, :1])["cache"]
  _, state = dec.apply({"params": params, "cache": cache}, x[:, :1], mutable=["cache", "ksvd"])
  assert not state.get("ksvd")


@pytest.mark.parametrize("feature_map", ["cosine", "softmax_kernel"])
@pytest.mark.parametrize("chunks", [[1] * N, [2, 3, 4]], ids=["tokens", "chunks"])
def test_primal_padding_aware_decoding_equals_full_forward(feature_map, chunks):
  """With sampling="padding_aware" and a [B, N] mask (padding anywhere), decoding equals the full forward."""
  full, dec = _primal(feature_map, sampling="padding_aware", mask_outputs=False)
  x = normal(3, (B, N, D))
  mask = np.ones((B, N), bool)
  mask[0, [2, 4, 5]] = False  # padded chunk starts (2 and 5 for chunks [2, 3, 4]) and inside a chunk
  mask[1, [1, 7]] = False
  params = random_params(full, x, mask=mask)
  expected = np.asarray(full.apply({"params": params}, x, mask=mask))
  cache = dec.init(jax.random.key(0), x[:, :1], mask=mask[:, :1])["cache"]
  out, _ = _decode(dec, params, cache, x, chunks, mask)
  ref.assert_rel_close(out[mask], expected[mask], 1e-5, "real positions")
  ref.assert_rel_close(out, expected, 1e-5, "all positions")


def test_softmax_decoding_equals_full_causal_forward():
  """SoftmaxAttention(decode=True) with a max-length cache, token by token and prefix + tokens."""
  full = SoftmaxAttention(num_heads=H, causal=True)
  dec = full.clone(decode=True)
  x = normal(4, (B, N, D))
  params = random_params(full, x)
  expected = np.asarray(full.apply({"params": params}, x))
  cache = dec.init(jax.random.key(0), x)["cache"]  # its length is the maximum length
  chex.assert_shape(cache["cached_key"], (B, H, P, N))  # batch-leading, positions last for the decode contraction
  for chunks in ([1] * N, [5] + [1] * (N - 5)):
    out, final = _decode(dec, params, cache, x, chunks)
    ref.assert_rel_close(out, expected, 1e-5, str(chunks))
    assert int(final["cache_index"]) == N


def test_softmax_decode_rejects_mask():
  """SoftmaxAttention's decode cache is causal; an explicit mask is refused with a clear error."""
  dec = SoftmaxAttention(num_heads=H, causal=True, decode=True)
  x = normal(5, (B, N, D))
  variables = dec.init(jax.random.key(0), x)
  with pytest.raises(ValueError, match="mask"):
    dec.apply(variables, x[:, :1], mask=jnp.ones((B, 1), bool), mutable=["cache"])


def test_padding_mask_helper_pads_somewhere():
  """Sanity check of the shared helper used above: it really produces padding."""
  assert not padding_mask(0, 3, N).all()


def test_softmax_fused_impl_decoding_equals_full_causal_forward():
  """impl="dot_product_attention" decodes from the same cache: token by token and prefix + tokens."""
  full = SoftmaxAttention(num_heads=H, causal=True, impl="dot_product_attention")
  dec = full.clone(decode=True)
  x = normal(6, (B, N, D))
  params = random_params(full, x)
  expected = np.asarray(SoftmaxAttention(num_heads=H, causal=True).apply({"params": params}, x))
  cache = dec.init(jax.random.key(0), x)["cache"]
  for chunks in ([1] * N, [5] + [1] * (N - 5)):
    out, _ = _decode(dec, params, cache, x, chunks)
    ref.assert_rel_close(out, expected, 1e-5, str(chunks))


def _softmax_lm_step(max_len: int, batch: int, dim: int = 32, heads: int = 2):
  """The compiled greedy decode step (cache donated) of a 2-layer softmax CausalLM with a `max_len` cache."""
  from primal_jax.models.config import TransformerConfig
  from primal_jax.models.lm import CausalLM, decode_step

  config = TransformerConfig(
    layers=("softmax", "softmax"), vocab_size=256, max_len=max_len, dim=dim, hidden_dim=2 * dim, num_heads=heads,
    num_classes=256,
  )  # fmt: skip
  model = CausalLM(config)
  tokens = jax.ShapeDtypeStruct((batch, 1), jnp.int32)
  params = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"]))
  cache = jax.eval_shape(
    lambda: model.clone(decode=True).init(jax.random.key(0), jnp.zeros((batch, max_len), jnp.int32))["cache"]
  )

  def step(p, c, t):
    logits, c = decode_step(model, p, c, t)
    return jnp.argmax(logits[:, -1], axis=-1), c

  return jax.jit(step, donate_argnums=1).lower(params, cache, tokens).compile(), cache


@pytest.mark.parametrize("batch", [1, 3])
def test_softmax_decode_step_reads_the_cache_in_place(batch):
  """The decode step's XLA temporaries do not grow with the cache: no copy or transpose of the keys and values.

  From 1K to 32K positions they may grow by the step's [B, H, 1, max_len] scores (two rows of float32 per layer),
  never by a cache: one layer's keys are p = dim / heads times a score row (the old [B, max_len, H, p] layout
  transposed every layer's keys and values, whose temporaries grew like the cache). The cache is donated: every
  cache buffer is aliased to an output.
  """
  heads, dim = 2, 32
  temps, caches = {}, {}
  for max_len in (1024, 8192, 32768):
    compiled, cache = _softmax_lm_step(max_len, batch, dim, heads)
    temps[max_len] = compiled.memory_analysis().temp_size_in_bytes
    caches[max_len] = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
    assert compiled.memory_analysis().alias_size_in_bytes >= caches[max_len] - 64  # position counters aside
    copies = re.findall(r"= [a-z0-9]+\[([\d,]+)\]\S* (?:copy|transpose)\(", compiled.as_text())
    largest = max((math.prod(int(d) for d in dims.split(",")) for dims in copies), default=0)
    assert largest < batch * dim * max_len // 4, largest  # one layer's keys: batch * dim * max_len elements
  score_row = 4 * batch * heads  # bytes per position of one layer's scores
  growth = temps[32768] - temps[1024]
  assert growth <= 2 * 2 * score_row * (32768 - 1024) * 1.05, (temps, caches)  # <= 2 score rows per layer
  assert caches[32768] - caches[1024] >= 8 * growth  # the caches grew by far more


@pytest.mark.parametrize("layers", [("softmax", "primal"), ("primal", "primal"), ("softmax", "softmax")])
def test_greedy_decode_loop_is_the_argmax_of_the_full_forward(layers):
  """lm.greedy_decode (one lax.scan, cache donated) continues a prefilled prompt as the full forward's argmax."""
  from primal_jax.models.config import TransformerConfig
  from primal_jax.models.lm import CausalLM, decode_step, greedy_decode, init_cache

  config = TransformerConfig(
    layers=layers, attention={"primal": {"low_rank": 3, "data_dependent": False}}, vocab_size=16, max_len=20,
    dim=16, hidden_dim=32, num_heads=2, num_classes=16,
  )  # fmt: skip
  model = CausalLM(config)
  params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 20), jnp.int32))["params"])
  leaves, tree = jax.tree.flatten(params)  # larger weights: a continuation that depends on the context
  keys = jax.random.split(jax.random.key(5), len(leaves))
  noise = [x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
  params = jax.tree.unflatten(tree, noise)
  prompt = jnp.asarray([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]], jnp.int32)
  _, cache = decode_step(model, params, init_cache(model, 2), prompt[:, :-1])
  loop = jax.jit(functools.partial(greedy_decode, model, steps=8), donate_argnums=1)
  new, cache = loop(params, cache, prompt[:, -1:])
  assert new.shape == (2, 8) and int(cache["position"]) == 12  # 4 prefilled + 8 fed
  sequence = jnp.concatenate([prompt, new], axis=1)
  predicted = np.asarray(jnp.argmax(model.apply({"params": params}, sequence), -1))  # position t predicts t + 1
  np.testing.assert_array_equal(predicted[:, 4:-1], np.asarray(new))
  assert len(set(np.asarray(new).ravel().tolist())) > 1
