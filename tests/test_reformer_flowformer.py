"""Reformer (LSH) and Flowformer attention against float64 NumPy references written here from the papers' /
release's definitions (loops over batch, heads, rounds and positions; never `primal_jax`), value and gradient.

Tolerances: max relative error (`numpy_reference.rel_err`) 1e-5 for float32 outputs against float64; gradients
are checked along random directions against float64 central differences (step 1e-4 on O(1) inputs: truncation
~1e-8), 1e-4 relative (float32 rounding of the JAX gradient).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest
from attention_utils import normal, padding_mask, random_params, to_numpy

from primal_jax.attention import get_attention
from primal_jax.attention.baselines import RANDOM_STATE_COLLECTION, REDRAW_RNG
from primal_jax.attention.baselines.reformer import default_num_buckets

# Compares with float64 NumPy, golden numbers or the Linen layer at float32 tolerances: full float32 matmuls.
pytestmark = pytest.mark.matmul_precision("highest")

B, D, H = 2, 16, 2
P = D // H
F64 = np.float64


def _heads(params, x, role):
  x = np.asarray(x, F64)
  return np.einsum("bnd,dhp->bhnp", x, params[role]["kernel"]) + params[role]["bias"][None, :, None]


def _merge(params, heads_out):
  return np.einsum("bhnp,hpd->bnd", heads_out, params["out"]["kernel"]) + params["out"]["bias"]


# ============================================================================ Reformer reference


def _key_vectors(x):
  return x / np.sqrt(np.mean(x**2, -1, keepdims=True) + 1e-6) / np.sqrt(x.shape[-1])


def _combine(outs, logits):
  """sum_r out_r exp(l_r - logsumexp_r l_r): outs [R, N, p], logits [R, N]."""
  w = np.exp(logits - logits.max(0))
  w = w / w.sum(0)
  return np.sum(outs * w[..., None], axis=0)


def _row(dots, vals):
  """(softmax(dots) @ vals, logsumexp(dots))."""
  top = dots.max()
  lse = top + np.log(np.exp(dots - top).sum())
  return np.exp(dots - lse) @ vals, lse


def reformer_ref(qk, v, rot, valid, chunk, before=1, after=0, causal=False):
  """HF LSHSelfAttention (chunked, non-causal) or exact in-bucket causal LSH attention; qk, v [B, H, N, p]."""
  b_, h_, n, p = qk.shape
  rounds, half = rot.shape[2], rot.shape[3]
  nb = 2 * half
  padded_batch = valid is not None and not valid.all()
  out = np.zeros(qk.shape)
  buckets_all = np.zeros((b_, h_, rounds, n), int)
  for b in range(b_):
    ok = np.ones(n, bool) if valid is None else valid[b]
    for h in range(h_):
      x, vv = qk[b, h], v[b, h]
      buckets = np.zeros((rounds, n), int)
      for r in range(rounds):
        rotated = x @ rot[h, :, r, :]
        buckets[r] = np.argmax(np.concatenate([rotated, -rotated], -1), -1)
        buckets[r][~ok] = nb
      buckets_all[b, h] = buckets
      keys = _key_vectors(x)
      outs, logits = np.zeros((rounds, n, p)), np.zeros((rounds, n))
      if causal:
        for r in range(rounds):
          for i in range(n):
            dots = np.array([keys[j] @ x[i] for j in range(n)])
            allowed = (buckets[r] == buckets[r][i]) & ok & (np.arange(n) <= i)
            dots = np.where(allowed, dots, -1e9)
            dots[i] = -1e5
            outs[r, i], logits[r, i] = _row(dots, vv)
      else:
        total = nb + 1 if padded_batch else nb
        order = np.argsort((buckets + np.arange(rounds)[:, None] * total).reshape(-1), kind="stable")
        pos = order % n
        chunks = len(order) // chunk
        sorted_out, sorted_lse = np.zeros((len(order), p)), np.zeros(len(order))
        for c in range(chunks):
          window = np.concatenate(
            [pos[((c + d) % chunks) * chunk : ((c + d) % chunks + 1) * chunk] for d in range(-before, after + 1)]
          )
          for a in range(chunk):
            i = pos[c * chunk + a]
            dots = keys[window] @ x[i]
            dots = np.where(ok[window], dots, -1e9)
            dots = np.where(window == i, -1e5, dots)
            sorted_out[c * chunk + a], sorted_lse[c * chunk + a] = _row(dots, vv[window])
        outs[order // n, pos], logits[order // n, pos] = sorted_out, sorted_lse
      out[b, h] = _combine(outs, logits)
  return out, buckets_all


def _reformer(**kwargs):
  return get_attention("reformer")(num_heads=H, **kwargs)


def _rotations(seed, n, chunk, rounds, num_buckets=None):
  nb = num_buckets or default_num_buckets(n, chunk)
  return normal(seed, (H, P, rounds, nb // 2))


@pytest.mark.parametrize(
  "n,chunk,rounds,causal,padded",
  [(16, 4, 2, False, True), (16, 4, 3, False, False), (12, 4, 1, False, True), (10, 4, 2, True, True)],
  ids=["chunked-pad", "chunked-3rounds", "one-round", "causal-pad"],
)
def test_reformer_matches_numpy(n, chunk, rounds, causal, padded):
  """Output and bucket ids against the float64 reference, with the rotations fed through `random_state`."""
  module = _reformer(num_hashes=rounds, chunk_length=chunk, causal=causal)
  x = normal(1, (B, n, D))
  pad = padding_mask(2, B, n) if padded else None
  params = random_params(module, x, mask=pad)
  rot = _rotations(3, n, chunk, rounds)
  variables = {"params": params, RANDOM_STATE_COLLECTION: {"rotations": rot}}
  out, state = module.apply(variables, x, mask=pad, mutable=["intermediates"])
  p64 = to_numpy(params)
  heads, buckets = reformer_ref(
    _heads(p64, x, "query"), _heads(p64, x, "value"), np.asarray(rot, F64), pad, chunk, causal=causal
  )
  ref.assert_rel_close(out, _merge(p64, heads), 1e-5, "reformer")
  np.testing.assert_array_equal(state["intermediates"]["buckets"][0], buckets)


def test_reformer_seeded_rotations_are_deterministic_and_replaceable():
  """Without a random_state the rotations come from hash_seed (same seed, same output; another seed differs)."""
  x = normal(4, (B, 16, D))
  module = _reformer(chunk_length=4)
  params = random_params(module, x)
  a, b = (module.apply({"params": params}, x) for _ in range(2))
  np.testing.assert_array_equal(a, b)
  other = _reformer(chunk_length=4, hash_seed=1).apply({"params": params}, x)
  assert ref.rel_err(other, a) > 1e-3
  rot = np.asarray(jax.random.normal(jax.random.key(0), (H, P, 2, default_num_buckets(16, 4) // 2)))
  fed = module.apply({"params": params, RANDOM_STATE_COLLECTION: {"rotations": rot}}, x)
  np.testing.assert_array_equal(fed, a)
  with pytest.raises(ValueError, match="rotations must have shape"):
    module.apply({"params": params, RANDOM_STATE_COLLECTION: {"rotations": rot[..., :1]}}, x)


def test_reformer_per_call_rotations_redraw_from_the_redraw_stream():
  """rotations="per_call" (the release's redraw): two calls with different "redraw" keys differ, the same key
  gives the same output; "seeded" gives the same output at every call; given rotations win in both modes."""
  x = normal(4, (B, 16, D))
  module = _reformer(chunk_length=4, rotations="per_call")
  params = random_params(module, x)  # init draws from the "params" key (Flax's fallback)
  first, second, again = (module.apply({"params": params}, x, rngs={REDRAW_RNG: jax.random.key(k)}) for k in (1, 2, 1))
  assert ref.rel_err(second, first) > 1e-3
  np.testing.assert_array_equal(again, first)
  # Two calls in one apply draw two sets (as the release's two consecutive forwards do).
  twice = module.apply({"params": params}, x, rngs={REDRAW_RNG: jax.random.key(1)}, method=lambda m, x: (m(x), m(x)))
  assert ref.rel_err(twice[1], twice[0]) > 1e-3
  seeded = _reformer(chunk_length=4)
  a, b = (seeded.apply({"params": params}, x, rngs={REDRAW_RNG: jax.random.key(k)}) for k in (1, 2))
  np.testing.assert_array_equal(a, b)
  rot = np.asarray(jax.random.normal(jax.random.key(0), (H, P, 2, default_num_buckets(16, 4) // 2)))
  given = module.apply({"params": params, RANDOM_STATE_COLLECTION: {"rotations": rot}}, x)  # no key needed
  np.testing.assert_array_equal(given, a)  # hash_seed 0 draws these rotations
  with pytest.raises(ValueError, match="'redraw' RNG"):
    module.apply({"params": params}, x)
  with pytest.raises(ValueError, match="rotations must be one of"):
    _reformer(chunk_length=4, rotations="fixed").apply({"params": params}, x)


def test_reformer_short_sequences_use_full_attention_with_self_mask():
  """N <= chunk_length: Hugging Face's standard self-attention (every real key, own position at -1e5)."""
  module = _reformer()
  x = normal(5, (B, 9, D))
  pad = padding_mask(5, B, 9)
  params = random_params(module, x, mask=pad)
  p64 = to_numpy(params)
  qk, v = _heads(p64, x, "query"), _heads(p64, x, "value")
  expected = np.zeros(qk.shape)
  for b in range(B):
    for h in range(H):
      keys = _key_vectors(qk[b, h])
      for i in range(9):
        dots = np.where(pad[b], keys @ qk[b, h, i], -1e9)
        dots[i] = -1e5
        expected[b, h, i] = _row(dots, v[b, h])[0]
  ref.assert_rel_close(module.apply({"params": params}, x, mask=pad), _merge(p64, expected), 1e-5)


# ============================================================================ Flowformer reference


def _sigmoid(z):
  return 1.0 / (1.0 + np.exp(-z))


def flow_ref(q, k, v, valid=None, causal=False, clamp=1.0, eps=1e-6):
  """Flow attention per (b, h) with explicit loops over positions; padded positions dropped from the sequence."""
  out = np.zeros(q.shape)
  for b in range(q.shape[0]):
    idx = np.arange(q.shape[2]) if valid is None else np.flatnonzero(valid[b])
    for h in range(q.shape[1]):
      qs, ks, vs = _sigmoid(q[b, h, idx]), _sigmoid(k[b, h, idx]), v[b, h, idx]
      n = len(idx)
      res = np.zeros((n, q.shape[-1]))
      if not causal:
        inc = np.array([1 / ((qs[i] + eps) @ (ks.sum(0) + eps)) for i in range(n)])
        outg = np.array([1 / ((ks[j] + eps) @ (qs.sum(0) + eps)) for j in range(n)])
        sink = np.array([(qs[i] + eps) @ ((ks * outg[:, None]).sum(0) + eps) for i in range(n)])
        src = np.clip([(ks[j] + eps) @ ((qs * inc[:, None]).sum(0) + eps) for j in range(n)], -clamp, clamp)
        comp = np.exp(src) / np.exp(src).sum() * n
        for i in range(n):
          scores = np.array([(qs[i] * inc[i]) @ ks[j] for j in range(n)])
          res[i] = _sigmoid(sink[i]) * (scores @ (vs * comp[:, None]))
      else:
        cnt = np.arange(1, n + 1.0)
        inc = np.array([cnt[i] / ((qs[i] + eps) @ (ks[: i + 1].sum(0) + eps)) for i in range(n)])
        outg = np.array([cnt[i] / ((ks[i] + eps) @ (qs[: i + 1].sum(0) + eps)) for i in range(n)])
        sink = np.array([(qs[i] + eps) @ ((ks[: i + 1] * outg[: i + 1, None]).sum(0) + eps) / cnt[i] for i in range(n)])
        src = [(ks[i] + eps) @ ((qs[: i + 1] * inc[: i + 1, None]).sum(0) + eps) / cnt[i] for i in range(n)]
        src = np.exp(np.clip(src, -clamp, clamp))
        comp = np.array([src[i] / src[: i + 1].sum() * cnt[i] for i in range(n)])
        for i in range(n):
          scores = np.array([(qs[i] * inc[i] / cnt[i]) @ ks[j] for j in range(i + 1)])
          res[i] = _sigmoid(sink[i]) * (scores @ (vs[: i + 1] * comp[: i + 1, None]))
      out[b, h, idx] = res
  return out


FLOW_CASES = [
  (dict(), "padding"),
  (dict(), None),
  (dict(causal=True), "padding"),
  (dict(causal=True, form="release"), None),
  (dict(causal=True, form="release"), "padding"),
]


@pytest.mark.parametrize("kwargs,mask", FLOW_CASES, ids=["paper-pad", "paper", "causal-pad", "release", "release-mask"])
def test_flowformer_matches_numpy(kwargs, mask):
  """Real rows against the float64 reference; the release form ignores the mask (clamp 10, all positions)."""
  module = get_attention("flowformer")(num_heads=H, **kwargs)
  x = normal(6, (B, 11, D))
  pad = padding_mask(6, B, 11) if mask else None
  params = random_params(module, x, mask=pad)
  out = np.asarray(module.apply({"params": params}, x, mask=pad))
  p64 = to_numpy(params)
  release = kwargs.get("form") == "release"
  heads = flow_ref(
    *(_heads(p64, x, r) for r in ("query", "key", "value")),
    None if release else pad,
    causal=kwargs.get("causal", False),
    clamp=10.0 if release else 1.0,
  )
  expected = _merge(p64, heads)
  rows = np.ones((B, 11), bool) if pad is None or release else pad
  ref.assert_rel_close(out[rows], expected[rows], 1e-5, str(kwargs))


# ============================================================================ gradients


def _directional_check(module, x, mask, reference_fn, seed):
  """<d/dx loss, d> from JAX (float32) against float64 central differences of the NumPy reference."""
  params = random_params(module, x, mask=mask)
  p64 = to_numpy(params)
  weights = normal(seed, x.shape)
  direction = normal(seed + 1, x.shape)

  def loss(inputs):
    return jnp.sum(module.apply({"params": params}, inputs, mask=mask) * weights)

  grad = jax.grad(loss)(jnp.asarray(x))
  assert np.all(np.isfinite(np.asarray(grad)))
  step = 1e-4
  f = [np.sum(reference_fn(p64, np.asarray(x, F64) + s * step * direction) * weights) for s in (1, -1)]
  numeric = (f[0] - f[1]) / (2 * step)
  analytic = float(np.sum(np.asarray(grad, F64) * direction))
  assert abs(analytic - numeric) <= 1e-4 * max(abs(numeric), 1.0), (analytic, numeric)


@pytest.mark.parametrize("kwargs", [dict(), dict(causal=True), dict(causal=True, form="release")])
def test_flowformer_gradient(kwargs):
  module = get_attention("flowformer")(num_heads=H, **kwargs)
  x = normal(7, (B, 8, D))
  pad = None if kwargs.get("form") else padding_mask(7, B, 8)
  clamp = 10.0 if kwargs.get("form") else 1.0

  def reference(p64, xs):
    heads = flow_ref(*(_heads(p64, xs, r) for r in ("query", "key", "value")), pad, kwargs.get("causal", False), clamp)
    out = _merge(p64, heads)
    return out if pad is None else out * pad[..., None]

  _directional_check(module, x, pad, reference, 8)


@pytest.mark.parametrize("causal", [False, True])
def test_reformer_gradient(causal):
  """Gradients flow through the sorted gathers (the hashing is piecewise constant: no gradient)."""
  module = _reformer(chunk_length=4, causal=causal)
  x = normal(9, (B, 16, D))
  rot = _rotations(10, 16, 4, 2)
  params = random_params(module, x)
  p64 = to_numpy(params)

  def reference(p, xs):
    heads, _ = reformer_ref(
      _heads(p, xs, "query"), _heads(p, xs, "value"), np.asarray(rot, F64), None, 4, causal=causal
    )
    return _merge(p, heads)

  weights, direction = normal(11, x.shape), normal(12, x.shape)
  variables = {"params": params, RANDOM_STATE_COLLECTION: {"rotations": rot}}
  grad = jax.grad(lambda xs: jnp.sum(module.apply(variables, xs) * weights))(jnp.asarray(x))
  step = 1e-4
  f = [np.sum(reference(p64, np.asarray(x, F64) + s * step * direction) * weights) for s in (1, -1)]
  numeric = (f[0] - f[1]) / (2 * step)
  analytic = float(np.sum(np.asarray(grad, F64) * direction))
  assert abs(analytic - numeric) <= 1e-4 * max(abs(numeric), 1.0), (analytic, numeric)
