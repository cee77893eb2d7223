"""Longformer, YOSO-E and SOFT against float64 NumPy (tests/reference_baselines_numpy.py): layers, cores and
their gradients, masks, the causal Longformer, and the refusals.

Tolerances: max relative error (`numpy_reference.rel_err`) 1e-5 for float32 against float64 unless a test says
otherwise and why.
"""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest
import reference_baselines_numpy as nref
from attention_utils import normal, padding_mask, random_params, to_numpy
from flax import linen as nn

from primal_jax.attention import ATTENTIONS, get_attention
from primal_jax.attention.baselines import longformer_attention, newton_inverse, soft_attention, yoso_expectation

# Compares with float64 NumPy, golden numbers or the Linen layer at float32 tolerances: full float32 matmuls.
pytestmark = pytest.mark.matmul_precision("highest")

B, N, D, H = 3, 11, 16, 2
P = D // H
NEW = ("longformer", "yoso_e", "soft")
KWARGS = {
  "longformer": dict(window=4, num_global=1),
  "yoso_e": dict(hash_code_len=6, conv_window=3),
  "soft": dict(num_landmarks=3),
}


def _module(name, **kwargs):
  return get_attention(name)(num_heads=H, **{**KWARGS[name], **kwargs})


def _heads(params, x, names=("query", "key", "value")):
  x = np.asarray(x, np.float64)
  return [np.einsum("bnd,dhp->bhnp", x, params[n]["kernel"]) + params[n]["bias"][None, :, None] for n in names]


def _merge(params, heads_out):
  return np.einsum("bhnp,hpd->bnd", heads_out, params["out"]["kernel"]) + params["out"]["bias"]


def _conv(v, taps):
  """Depthwise conv of [N, p] with K taps (zero padding, cross-correlation)."""
  half = len(taps) // 2
  vz = np.concatenate([np.zeros((half, v.shape[1])), v, np.zeros((half, v.shape[1]))])
  return sum(taps[t] * vz[t : t + v.shape[0]] for t in range(len(taps)))


def reference(name, module, params, x, valid):
  """The layer in float64: per batch and head the numpy core, heads merged by the output projection."""
  p64 = to_numpy(params)
  valid = np.ones(x.shape[:2]) if valid is None else np.asarray(valid, np.float64)
  if name == "soft":
    q, v = _heads(p64, x, ("query", "value"))
  else:
    q, k, v = _heads(p64, x)
  out = np.zeros(q.shape)
  for b in range(x.shape[0]):
    for h in range(H):
      if name == "longformer":
        opts = dict(window=module.window, num_global=module.num_global, causal=module.causal)
        out[b, h] = nref.longformer_forward(q[b, h], k[b, h], v[b, h], valid[b], **opts)
      elif name == "yoso_e":
        out[b, h] = nref.yoso_forward(q[b, h], k[b, h], v[b, h], valid[b], valid[b], tau=module.hash_code_len)
        if module.conv_window:
          out[b, h] += _conv(v[b, h] * valid[b][:, None], p64["conv"][:, h])
      else:
        norm = (p64["landmark_norm"]["scale"], p64["landmark_norm"]["bias"]) if module.landmark_norm else None
        conv = p64["landmark_conv"] if module.landmarks == "conv" else None
        opts = dict(num_landmarks=module.num_landmarks, iterations=module.newton_iterations, norm=norm, conv=conv)
        out[b, h] = nref.soft_forward(q[b, h], v[b, h], valid[b], **opts)
  return _merge(p64, out)


CASES = [(n, {}) for n in NEW] + [
  ("longformer", dict(causal=True)),
  ("longformer", dict(num_global=0)),
  ("longformer", dict(window=2, num_global=3, causal=True)),
  ("longformer", dict(window=30)),  # wider than the sequence: full attention
  ("yoso_e", dict(conv_window=0)),
  ("soft", dict(landmark_norm=False, num_landmarks=4)),
]


@pytest.mark.parametrize("mask_kind", [None, "padding", "attention"])
@pytest.mark.parametrize("name,kwargs", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_layer_matches_numpy(name, kwargs, mask_kind):
  module = _module(name, **kwargs)
  x = normal(1, (B, N, D))
  pad = padding_mask(1, B, N)
  mask = {None: None, "padding": pad, "attention": nn.make_attention_mask(pad, pad)}[mask_kind]
  if mask_kind == "attention" and module.causal:
    mask = nn.combine_masks(mask, nn.make_causal_mask(pad))
  params = random_params(module, x, mask=mask)
  out = jax.jit(module.apply)({"params": params}, x, mask=mask)
  chex.assert_shape(out, (B, N, D))
  ref.assert_rel_close(out, reference(name, module, params, x, None if mask is None else pad), 1e-5, name)


@pytest.mark.parametrize("landmark_norm", [True, False])
def test_soft_conv_landmarks_match_numpy(landmark_norm):
  """landmarks='conv': a learned [r, p, p] map of each block of r = 3 positions (N = 12: 4 landmarks), padded."""
  module = _module("soft", landmarks="conv", conv_block=3, landmark_norm=landmark_norm)
  x = normal(7, (B, 12, D))
  pad = padding_mask(7, B, 12)
  params = random_params(module, x, mask=pad)
  assert params["landmark_conv"].shape == (3, P, P)
  out = jax.jit(module.apply)({"params": params}, x, mask=pad)
  ref.assert_rel_close(out, reference("soft", module, params, x, pad), 1e-5, "conv landmarks")


@pytest.mark.parametrize("name", NEW)
def test_padded_positions_do_not_influence_real_outputs(name):
  module = _module(name)
  x = normal(2, (B, N, D))
  pad = padding_mask(2, B, N)
  params = random_params(module, x, mask=pad)
  noisy = np.where(pad[..., None], x, normal(3, (B, N, D), scale=1e3))
  forward = jax.jit(module.apply)
  out, out_noisy = (np.asarray(forward({"params": params}, inp, mask=pad)) for inp in (x, noisy))
  ref.assert_rel_close(out_noisy[pad], out[pad], 1e-6, name)


@pytest.mark.parametrize("kwargs", [dict(window=4, num_global=1), dict(window=2, num_global=0)])
def test_causal_longformer_never_sees_the_future(kwargs):
  """Perturbing tokens after t never changes outputs at <= t (exactly), and does change them after t."""
  module = _module("longformer", causal=True, **kwargs)
  x = normal(4, (B, N, D))
  params = random_params(module, x)
  forward = jax.jit(lambda inp: module.apply({"params": params}, inp))
  base = np.asarray(forward(x))
  for t in (0, 3, N - 2):
    changed = x.copy()
    changed[:, t + 1 :] += normal(5 + t, changed[:, t + 1 :].shape)
    other = np.asarray(forward(changed))
    np.testing.assert_array_equal(other[:, : t + 1], base[:, : t + 1], err_msg=f"t={t}")
    assert not np.allclose(other[:, t + 1], base[:, t + 1], atol=1e-4)


@pytest.mark.parametrize("core", ["longformer", "yoso_e"])
def test_core_memory_is_linear(core):
  """The compiled core's value-and-gradient temporaries grow as N (not N^2): doubling N at most ~doubles XLA's
  temp bytes (Longformer: banded blocks; YOSO-E: E formed per block of queries, forward and backward)."""
  fns = {
    "longformer": lambda q, k, v: longformer_attention(q, k, v, window=64, num_global=1),
    "yoso_e": lambda q, k, v: yoso_expectation(q, k, v, tau=8),
  }

  def temp_bytes(n):
    shape = jax.ShapeDtypeStruct((1, 2, n, 16), jnp.float32)
    fn = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fns[core](q, k, v) ** 2), argnums=(0, 1, 2)))
    return fn.lower(shape, shape, shape).compile().memory_analysis().temp_size_in_bytes

  small, large = temp_bytes(4096), temp_bytes(8192)
  dense = 4 * 2 * 8192 * 8192  # one float32 N x N score matrix per head
  assert large <= 2.2 * small and large < dense / 4, (small, large, dense)  # a dense core: 4x per doubling


# ============================================================================ cores and their gradients


def _qkv(seed, n=N, m=None):
  m = m or n
  return normal(seed, (B, H, n, P)), normal(seed + 1, (B, H, m, P)), normal(seed + 2, (B, H, m, P))


@pytest.mark.parametrize("causal,num_global", [(False, 1), (True, 2), (False, 0)])
def test_longformer_core_gradient(causal, num_global):
  q, k, v = _qkv(10)
  pad = padding_mask(10, B, N)
  grad = normal(13, q.shape)
  opts = dict(window=4, num_global=num_global, causal=causal)
  loss = lambda q, k, v: jnp.sum(longformer_attention(q, k, v, pad, **opts) * grad)  # noqa: E731
  got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
  for b in range(B):
    for h in range(H):
      f64 = [a[b, h].astype(np.float64) for a in (q, k, v)]
      expected = nref.longformer_backward(*f64, pad[b], grad[b, h], **opts)
      for g, e, what in zip(got, expected, "qkv", strict=True):
        ref.assert_rel_close(g[b, h], e, 1e-5, f"d{what} b={b} h={h}")


@pytest.mark.parametrize("query_block", [512, 3])
def test_yoso_core_value_and_upstream_gradient(query_block):
  """normalize(E V) and the upstream's surrogate backward (tau / 2 E as dE/dcos), with query/key padding; E
  formed whole or in blocks of 3 queries (7 = 3 + 3 + 1 padded)."""
  q, k, v = _qkv(20, n=7, m=9)
  q_pad, k_pad = padding_mask(20, B, 7), padding_mask(21, B, 9)
  grad = normal(23, q.shape)
  tau = 5
  core = lambda q, k, v: yoso_expectation(q, k, v, q_pad, k_pad, tau=tau, query_block=query_block)  # noqa: E731
  out, vjp = jax.vjp(core, q, k, v)
  got = vjp(jnp.asarray(grad))
  for b in range(B):
    for h in range(H):
      f64 = [a[b, h].astype(np.float64) for a in (q, k, v)]
      masks = (q_pad[b].astype(float), k_pad[b].astype(float))
      ref.assert_rel_close(out[b, h], nref.yoso_forward(*f64, *masks, tau=tau), 1e-5, "value")
      expected = nref.yoso_backward(*f64, *masks, grad[b, h], tau=tau)
      for g, e, what in zip(got, expected, "qkv", strict=True):
        ref.assert_rel_close(g[b, h], e, 1e-5, f"d{what} b={b} h={h}")
  assert np.all(np.asarray(out)[~np.broadcast_to(q_pad[:, None], (B, H, 7))] == 0.0)  # padded queries: 0


def test_yoso_collision_probability_endpoints_and_no_nan():
  """E = 1 for identical directions (also when rounding puts the cosine above 1), 0 for opposite ones."""
  x = normal(30, (1, 1, 4, P))
  out = yoso_expectation(x, np.concatenate([x, -x], axis=2), np.ones((1, 1, 8, P), np.float32), tau=3)
  assert np.all(np.isfinite(np.asarray(out)))
  from primal_jax.attention.baselines import collision_probability

  np.testing.assert_allclose(collision_probability(jnp.array([1.0000001, 1.0, -1.0, 0.0]), 2), [1, 1, 0, 0.25])


def test_polynomial_arccos_matches_float64_arccos():
  """A&S 4.4.46 in float64 is within its bound of the exact arccos; the float32 version within 2 ulp of pi."""
  from primal_jax.attention.baselines.yoso import ARCCOS_COEFFICIENTS, polynomial_arccos

  x = np.concatenate([np.linspace(-1.0, 1.0, 200_001), [-1.0, -0.5, 0.0, 0.5, 1.0, 1e-8, -1e-8]])
  a = np.abs(x)
  poly = np.polynomial.polynomial.polyval(a, ARCCOS_COEFFICIENTS)
  exact64 = np.where(x < 0, math.pi - np.sqrt(1.0 - a) * poly, np.sqrt(1.0 - a) * poly)
  assert np.max(np.abs(exact64 - np.arccos(x))) <= 2.2e-8  # A&S print 2e-8; c0 alone is 2.18e-8 off pi / 2
  got = np.asarray(polynomial_arccos(jnp.asarray(x, jnp.float32)), np.float64)
  expected = np.arccos(x.astype(np.float32).astype(np.float64))
  assert np.max(np.abs(got - expected)) <= 2 * np.spacing(np.float32(math.pi))
  assert got[-7] == np.float32(math.pi) and got[-3] == 0.0  # exact at -1 and 1


def test_soft_core_value_and_upstream_gradient():
  q, _, v = _qkv(40, n=12)
  q = 0.5 * q
  landmarks = normal(43, (B, H, 4, P), scale=0.5)
  grad = normal(44, q.shape)
  out, vjp = jax.vjp(lambda q, lm, v: soft_attention(q, lm, v, iterations=20), q, landmarks, v)
  got = vjp(jnp.asarray(grad))
  for b in range(B):
    for h in range(H):
      f64 = [a[b, h].astype(np.float64) for a in (q, landmarks, v)]
      # 1e-4: the Newton iterate of a 4 x 4 Gaussian kernel matrix (condition ~1e2) in float32.
      ref.assert_rel_close(out[b, h], nref.soft_core(*f64, 20), 1e-4, "value")
      expected = nref.soft_core_backward(*f64, grad[b, h], 20)
      for g, e, what in zip(got, expected, ("q", "landmarks", "v"), strict=True):
        ref.assert_rel_close(g[b, h], e, 1e-4, f"d{what} b={b} h={h}")


def test_newton_inverse_converges_to_the_ridge_inverse():
  """20 iterations reach (S + 0.01 I)^-1 of a Gaussian kernel matrix; the backward is -V^T G V^T."""
  pts = normal(50, (2, 6, P), scale=0.4)
  s = np.stack([nref.gaussian(p.astype(np.float64), p.astype(np.float64)) for p in pts])
  got = newton_inverse(jnp.asarray(s, jnp.float32), 20)
  ref.assert_rel_close(got, np.linalg.inv(s + 0.01 * np.eye(6)), 1e-4, "ridge inverse")
  g = normal(51, s.shape)
  (grad,) = jax.vjp(lambda m: newton_inverse(m, 20), jnp.asarray(s, jnp.float32))[1](jnp.asarray(g))
  inv = np.asarray(got, np.float64)
  ref.assert_rel_close(grad, -np.swapaxes(inv, 1, 2) @ g @ np.swapaxes(inv, 1, 2), 1e-5, "backward")


# ============================================================================ options, masks, dtypes


@pytest.mark.parametrize(
  "name,kwargs,match",
  [
    ("longformer", dict(window=3), "window must be even"),
    ("longformer", dict(window=0), "window"),
    ("longformer", dict(num_global=-1), "num_global"),
    ("yoso_e", dict(hash_code_len=0), "hash_code_len"),
    ("yoso_e", dict(conv_window=4), "conv_window"),
    ("yoso_e", dict(causal=True), "causal=True is not supported"),
    ("soft", dict(num_landmarks=0), "num_landmarks"),
    ("soft", dict(newton_iterations=0), "newton_iterations"),
    ("soft", dict(num_landmarks=N + 1), "num_landmarks"),
    ("soft", dict(landmarks="grid"), "landmarks"),
    ("soft", dict(conv_block=0), "conv_block"),
    ("soft", dict(landmarks="conv", conv_block=4), "divisible by conv_block=4"),
    ("soft", dict(causal=True), "causal=True is not supported"),
  ],
)
def test_bad_options_are_refused(name, kwargs, match):
  with pytest.raises(ValueError, match=match):
    _module(name, **kwargs).init(jax.random.key(0), jnp.ones((1, N, D)))


@pytest.mark.parametrize("name", NEW)
def test_masks_that_say_more_than_padding_are_refused(name):
  """A causal mask given to a non-causal layer is refused with one ValueError line."""
  module = _module(name, **({"window": 2, "num_global": 0} if name == "longformer" else {}))
  x = jnp.ones((1, N, D))
  causal_mask = nn.make_causal_mask(jnp.ones((1, N)))
  params = random_params(module, x)
  with pytest.raises(ValueError, match="cannot honour this mask"):
    module.apply({"params": params}, x, mask=causal_mask)


@pytest.mark.parametrize("name", ["longformer", "soft"])
def test_cross_attention_is_refused(name):
  with pytest.raises(ValueError, match="inputs_k"):
    _module(name).init(jax.random.key(0), jnp.ones((1, N, D)), jnp.ones((1, N + 2, D)))


@pytest.mark.parametrize("name", NEW)
def test_bfloat16_and_jit_gradients(name):
  module = _module(name, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
  x = jnp.asarray(normal(6, (B, N, D)), jnp.bfloat16)
  pad = padding_mask(6, B, N)
  params = random_params(module, x, mask=pad)
  out = jax.jit(module.apply)({"params": params}, x, mask=pad)
  chex.assert_type(out, jnp.bfloat16)
  chex.assert_tree_all_finite(out)
  f32 = _module(name)
  p32 = jax.tree.map(lambda a: a.astype(jnp.float32), params)
  loss = lambda p, inp: jnp.sum(jnp.where(pad[..., None], f32.apply({"params": p}, inp, mask=pad), 0.0) ** 2)  # noqa: E731
  g_params, g_x = jax.jit(jax.grad(loss, argnums=(0, 1)))(p32, x.astype(jnp.float32))
  chex.assert_tree_all_finite((g_params, g_x))
  assert all(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(g_params)), "a parameter gets no gradient"


def test_registered():
  assert {"longformer", "yoso_e", "soft"} <= set(ATTENTIONS)
