"""Causal forms and decoding of the baseline attentions.

Causality: perturbing the inputs after position t never changes the outputs at positions <= t (to float32
round-off, 1e-6 relative; the prefix sums and scans never read later elements). Decoding: the mechanisms with
a constant-size state (linear, cosFormer, Performer, Flowformer) fed token by token, or a prefix then tokens,
give the full causal forward (1e-5 relative), also with padded positions; so does a CausalLM of them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest
from attention_utils import normal, padding_mask, random_params

from primal_jax.attention import get_attention
from primal_jax.models import TransformerConfig
from primal_jax.models.lm import CausalLM, decode_step, init_cache

# Compares with float64 NumPy, golden numbers or the Linen layer at float32 tolerances: full float32 matmuls.
pytestmark = pytest.mark.matmul_precision("highest")

B, N, D, H = 2, 12, 16, 2
CAUSAL = [
  ("linear", {}),
  ("cosformer", {}),
  ("performer", dict(num_features=16)),
  ("flowformer", {}),
  ("flowformer", dict(form="release")),
  ("reformer", dict(chunk_length=4)),
]
DECODING = [
  ("linear", {}),
  ("cosformer", dict(horizon=N)),
  ("performer", dict(num_features=16)),
  ("flowformer", {}),
  ("flowformer", dict(form="release")),
]


def _ids(cases):
  return [f"{name}-{'-'.join(f'{k}={v}' for k, v in kw.items()) or 'paper'}" for name, kw in cases]


def _module(name, kwargs, **extra):
  return get_attention(name)(num_heads=H, causal=True, **kwargs, **extra)


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("name,kwargs", CAUSAL, ids=_ids(CAUSAL))
def test_outputs_at_t_ignore_later_inputs(name, kwargs, padded):
  module = _module(name, kwargs)
  x = normal(1, (B, N, D))
  pad = padding_mask(1, B, N) if padded and kwargs.get("form") != "release" else None
  params = random_params(module, x, mask=pad)
  apply = jax.jit(lambda inputs: module.apply({"params": params}, inputs, mask=pad))
  base = np.asarray(apply(x))
  for t in (0, 4, 8, N - 2):
    later = x.copy()
    later[:, t + 1 :] = normal(2 + t, (B, N - t - 1, D), scale=3.0)
    changed = np.asarray(apply(later))
    ref.assert_rel_close(changed[:, : t + 1], base[:, : t + 1], 1e-6, f"{name} t={t}")
    assert ref.rel_err(changed[:, t + 1 :], base[:, t + 1 :]) > 1e-3  # later outputs do depend on them


LEFT_PADDED = [
  pytest.param(name, kw, marks=pytest.mark.slow) if name == "performer" else (name, kw)
  for name, kw in CAUSAL[:4] + CAUSAL[5:]
]


@pytest.mark.parametrize("name,kwargs", LEFT_PADDED, ids=_ids(CAUSAL[:4] + CAUSAL[5:]))
def test_left_padding_is_finite_and_leaves_real_outputs_alone(name, kwargs):
  """Left padding (a Decision Transformer's short histories): values and gradients finite; real outputs equal the
  unpadded suffix run alone (except cosFormer, whose re-weighting counts absolute positions)."""
  module = _module(name, kwargs)
  x = normal(5, (B, N, D))
  pad = np.ones((B, N), bool)
  pad[1, :4] = False
  params = random_params(module, x, mask=pad)

  def loss(p, inputs):
    return jnp.sum(jnp.where(pad[..., None], module.apply({"params": p}, inputs, mask=pad), 0.0) ** 2)

  grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)  # one compilation (eager: one per op)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads)), name
  out = np.asarray(module.apply({"params": params}, x, mask=pad))
  assert np.all(np.isfinite(out))
  if name != "cosformer":
    alone = np.asarray(module.apply({"params": params}, x[1:, 4:]))
    ref.assert_rel_close(out[1, 4:], alone[0], 1e-5, name)


@functools.partial(jax.jit, static_argnums=0)
def _step(module, params, cache, x_t, mask_t):
  return module.apply({"params": params, "cache": cache}, x_t, mask=mask_t, mutable=["cache"])


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("chunks", [[1] * N, [5] + [1] * (N - 5)], ids=["tokens", "prefix"])
@pytest.mark.parametrize("name,kwargs", DECODING, ids=_ids(DECODING))
def test_decoding_equals_the_full_forward(name, kwargs, chunks, padded):
  full = _module(name, kwargs)
  dec = _module(name, kwargs, decode=True)
  x = normal(3, (B, N, D))
  pad = padding_mask(3, B, N) if padded else None
  params = random_params(full, x, mask=pad)
  want = np.asarray(full.apply({"params": params}, x, mask=pad))
  cache = jax.jit(lambda x_1: dec.init(jax.random.key(0), x_1)["cache"])(x[:, :1])  # no parameter initialisers
  outs, start = [], 0
  for size in chunks:
    m = None if pad is None else jnp.asarray(pad[:, start : start + size])
    out, state = _step(dec, params, cache, x[:, start : start + size], m)
    outs.append(np.asarray(out))
    cache, start = state["cache"], start + size
  got = np.concatenate(outs, axis=1)
  rows = np.ones((B, N), bool) if pad is None or kwargs.get("form") == "release" else pad
  ref.assert_rel_close(got[rows], want[rows], 1e-5, name)


def test_cache_size_is_independent_of_the_length():
  """The decoding state of each constant-state mechanism has the same shapes after 1 and after N tokens."""
  for name, kwargs in DECODING:
    dec = _module(name, kwargs, decode=True)
    x = normal(4, (B, N, D))
    short, long = (jax.eval_shape(lambda a, m=dec: m.init(jax.random.key(0), a)["cache"], x[:, :n]) for n in (1, N))
    assert jax.tree.map(lambda a: a.shape, short) == jax.tree.map(lambda a: a.shape, long), name


@pytest.mark.slow
def test_causal_lm_decodes_with_constant_state_baselines():
  """A CausalLM of Flowformer, Performer, linear and cosFormer layers: decode_step token by token gives the
  full forward's logits."""
  layers = ("flowformer", ("performer", {"num_features": 16}), "linear", ("cosformer", {"horizon": 10}))
  config = TransformerConfig(
    layers=layers, vocab_size=13, max_len=10, dim=16, hidden_dim=32, num_heads=2, dropout_rate=0.0
  )
  model = CausalLM(config)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 13, (2, 10)), jnp.int32)
  params = model.init(jax.random.key(0), tokens)["params"]
  full = np.asarray(model.apply({"params": params}, tokens))
  cache = init_cache(model, 2)
  outs = []
  for i in range(10):
    logits, cache = decode_step(model, params, cache, tokens[:, i : i + 1])
    outs.append(np.asarray(logits))
  ref.assert_rel_close(np.concatenate(outs, axis=1), full, 1e-5, "lm")


@pytest.mark.parametrize("chunk", [1, 4, 5, 64])
def test_chunked_causal_numerator_equals_the_float64_prefix_sum(chunk):
  """`causal_numerator` (masked products within a chunk, running sums across) against the per-position prefix
  sum in float64, T = 13 (not a multiple of 4 or 5), continuing from a carry; 1e-5 relative."""
  from primal_jax.attention.baselines.common import causal_numerator

  rng = np.random.default_rng(chunk)
  phi_q, phi_k = (np.abs(rng.normal(size=(2, 3, 13, 6))) for _ in range(2))
  v, carry = rng.normal(size=(2, 3, 13, 5)), rng.normal(size=(2, 3, 6, 5))
  prefix = carry[:, :, None] + np.cumsum(np.einsum("bhtf,bhtp->bhtfp", phi_k, v), axis=2)  # [B, H, T, f, p]
  want = np.einsum("bhtf,bhtfp->bhtp", phi_q, prefix)
  args = (jnp.asarray(x, jnp.float32) for x in (phi_q, phi_k, v, carry))
  num, last = causal_numerator(*args, chunk=chunk)
  ref.assert_rel_close(np.asarray(num), want, 1e-5, f"chunk {chunk}")
  ref.assert_rel_close(np.asarray(last), prefix[:, :, -1], 1e-5, f"chunk {chunk} carry")


@pytest.mark.parametrize("chunk", [1, 4, 5])
def test_causal_favor_is_the_same_for_every_chunk_size(chunk):
  """`causal_favor`'s chunks (masked products within, the rescaled scan across) give the one-chunk result, with
  padded keys and continuing from a carry (the state after a first segment); 1e-5 relative."""
  from primal_jax.attention.baselines.performer import causal_favor, orthogonal_random_features

  rng = np.random.default_rng(chunk)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 3, 13, 8)), jnp.float32) for _ in range(3))
  projection = orthogonal_random_features(jax.random.key(0), 16, 8)
  valid = jnp.asarray(np.arange(13)[None, :] < np.array([[13], [9]]))
  _, carry = causal_favor(q[:, :, :6], k[:, :, :6], v[:, :, :6], projection, valid[:, :6], chunk=64)
  want, want_last = causal_favor(q, k, v, projection, valid, carry, chunk=64)
  got, got_last = causal_favor(q, k, v, projection, valid, carry, chunk=chunk)
  ref.assert_rel_close(np.asarray(got), np.asarray(want), 1e-5, f"chunk {chunk}")
  for key in ("s", "kv", "v", "count"):
    ref.assert_rel_close(np.asarray(got_last[key]), np.asarray(want_last[key]), 1e-5, f"chunk {chunk} {key}")
  np.testing.assert_array_equal(np.asarray(got_last["c"]), np.asarray(want_last["c"]))
