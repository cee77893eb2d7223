"""Performer attention: FAVOR+ positive orthogonal random features (Choromanski et al., 2021).

exp(x^T y) = E_w[phi_w(x) phi_w(y)] with phi_w(z) = exp(w^T z - ||z||^2 / 2) and
w ~ N(0, I) (the Gaussian moment generating function: E exp(w^T (x + y)) =
exp(||x + y||^2 / 2)). With x = q p^-1/4, y = k p^-1/4 this is the softmax
kernel exp(q^T k / sqrt(p)), and softmax attention becomes kernelised attention
with m positive features. "Orthogonal": the w's come in blocks of p mutually
orthogonal directions (lower variance, same expectation), each rescaled to the
norm of an independent N(0, I_p) draw.
"""

from __future__ import annotations

import functools
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from primal_jax.attention.baselines.common import (
  CAUSAL_CHUNK,
  BaselineAttention,
  check_form,
  compute_dtype,
  decode_carry,
  in_chunks,
  random_state,
  zero_padded,
)
from primal_jax.attention.baselines.linear import kernelized_attention
from primal_jax.validation import check_positive

# performer-pytorch's `softmax_kernel` eps, added to every feature after the stabilised exp.
FEATURE_EPS = 1e-4
# Lower clamp of the normaliser: it binds only for a row with no real key (any real key gives >= ~1e-10);
# its square is a normal float32, so the clamped division's gradient stays finite (0/tiny^2 would be NaN).
DENOMINATOR_CLAMP = 1e-18


def orthogonal_random_features(key: jax.Array, num_features: int, dim: int) -> jax.Array:
  """[num_features, dim] FAVOR+ directions: orthogonal blocks with chi_dim row norms.

  Rows within each block of `dim` are orthogonal (Q of a Gaussian matrix's QR);
  row i is then scaled to ||g_i|| for an independent g_i ~ N(0, I_dim), so each
  row has the norm distribution of a Gaussian vector, so each row is exactly
  N(0, I_dim) and the estimator unbiased (performer-pytorch's
  `gaussian_orthogonal_random_matrix(scaling=0)`, plus the sign fix of Q that
  it omits). Computed in float32.

  Args:
    key: PRNG key (fixed features: the same key gives the same matrix).
    num_features: m.
    dim: p, the head dimension.
  Returns:
    [m, p] float32.
  """
  check_positive(num_features, "num_features")
  check_positive(dim, "dim")
  blocks = -(-num_features // dim)
  block_key, norm_key = jax.random.split(key)
  gaussian = jax.random.normal(block_key, (blocks, dim, dim), jnp.float32)
  q, r = jnp.linalg.qr(gaussian)  # [blocks, p, p], orthonormal columns
  # Householder QR makes sign(R_jj) depend on the data, which biases the columns' directions (e.g. the
  # first column's first coordinate is always <= 0); fixing diag(R) > 0 makes Q Haar-distributed.
  q = q * jnp.sign(jnp.diagonal(r, axis1=1, axis2=2))[:, None, :]
  rows = jnp.swapaxes(q, 1, 2).reshape(blocks * dim, dim)[:num_features]  # orthonormal rows per block
  norms = jnp.linalg.norm(jax.random.normal(norm_key, (num_features, dim), jnp.float32), axis=-1)
  return rows * norms[:, None]


def favor_features(
  x: jax.Array,
  projection: jax.Array,
  *,
  is_query: bool,
  valid: jax.Array | None = None,
  eps: float = FEATURE_EPS,
) -> jax.Array:
  """phi(x) = m^-1/2 (exp(w_i^T x' - ||x'||^2 / 2 - c) + eps), x' = x p^-1/4.

  The stabiliser c (no gradient) is the max of w_i^T x' over the features of
  each query, or over the features of all real keys of a (sequence, head). It
  cancels in the attention ratio up to the eps term.

  Args:
    x: [B, H, L, p] queries or keys.
    projection: [m, p] random directions.
    is_query: per-row stabiliser (queries) or one per (sequence, head) (keys).
    valid: [B, L] bool, keys only: padded keys are left out of the stabiliser
      and get features 0 (their content cannot leak through either).
    eps: added after the exponential (keeps the normaliser > 0).
  Returns:
    [B, H, L, m] positive features in the compute dtype.
  """
  dt = compute_dtype(x.dtype)
  p, m = x.shape[-1], projection.shape[0]
  xs = x.astype(dt) * jnp.asarray(p**-0.25, dt)
  logits = jnp.einsum("bhlp,mp->bhlm", xs, projection.astype(dt))  # w_i^T x'
  half_sq = 0.5 * jnp.sum(xs * xs, axis=-1, keepdims=True)  # ||x'||^2 / 2
  if is_query:
    stab = jnp.max(logits, axis=-1, keepdims=True)
  else:
    real = None if valid is None else valid[:, None, :, None]
    masked = logits if real is None else jnp.where(real, logits, -jnp.inf)
    stab = jnp.max(masked, axis=(2, 3), keepdims=True)
    stab = jnp.where(jnp.isfinite(stab), stab, 0.0)  # a sequence with no real key
  exponent = logits - half_sq - jax.lax.stop_gradient(stab)
  if not is_query and valid is not None:
    # 0, not -inf: padded exponents are unbounded, and exp(inf) * 0 would poison the gradients.
    exponent = jnp.where(valid[:, None, :, None], exponent, 0.0)
  features = (jnp.exp(exponent) + eps) / jnp.sqrt(jnp.asarray(m, dt))
  if not is_query and valid is not None:
    features = jnp.where(valid[:, None, :, None], features, 0.0)
  return features


def performer_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  projection: jax.Array,
  key_valid: jax.Array | None = None,
  *,
  eps: float = FEATURE_EPS,
) -> jax.Array:
  """FAVOR+ estimate of softmax(q k^T / sqrt(p)) v (non-causal).

  Args:
    q: [B, H, N, p]; k, v: [B, H, M, p].
    projection: [m, p] directions (`orthogonal_random_features`).
    key_valid: [B, M] bool or None; padded keys get zero features.
    eps: the features' additive eps.
  Returns:
    [B, H, N, p]: phi(q_i)^T sum_j phi(k_j) v_j^T / phi(q_i)^T sum_j phi(k_j).
  """
  phi_q = favor_features(q, projection, is_query=True, eps=eps)
  phi_k = favor_features(k, projection, is_query=False, valid=key_valid, eps=eps)
  # The normaliser is > 0 whenever a real key exists (every feature >= eps / sqrt(m)).
  return kernelized_attention(phi_q, phi_k, v, key_valid, eps=DENOMINATOR_CLAMP)


_orthogonal_random_features = jax.jit(orthogonal_random_features, static_argnums=(1, 2))


@functools.cache
def fixed_projection(seed: int, num_features: int, dim: int) -> np.ndarray:
  """`orthogonal_random_features(jax.random.key(seed), num_features, dim)` as a host array, computed once per
  process and arguments (also while a step is being traced: it becomes a constant of that step), read-only.
  XLA:CPU's QR of the [blocks, p, p] Gaussians is slow, and inside a step it was paid at every call."""
  with jax.ensure_compile_time_eval():
    directions = np.array(_orthogonal_random_features(jax.random.key(seed), num_features, dim))
  directions.flags.writeable = False
  return directions


def release_performer_attention(
  q: jax.Array, k: jax.Array, v: jax.Array, projection: jax.Array, key_valid: jax.Array | None = None
) -> jax.Array:
  """The release's `PerformerAttention` (performer-pytorch 1.1.4 `FastAttention`, FAVOR+ features).

  It scales q and k by p^-1/4 and zeroes padded keys and values, then the kernel scales by p^-1/4 AGAIN
  (so the estimated kernel is exp(q.k / p), not exp(q.k / sqrt(p))); padded keys are zero vectors whose
  features m^-1/2 (exp(-c) + 1e-4) still enter the key stabiliser c and the normaliser. `kernel_type` of
  its config is ignored by the release (generalized_attention=False).
  """
  dt = compute_dtype(q.dtype)
  scale = jnp.asarray(q.shape[-1] ** -0.25, dt)
  q, k, v = q.astype(dt) * scale, zero_padded(k.astype(dt) * scale, key_valid), zero_padded(v.astype(dt), key_valid)
  phi_q = favor_features(q, projection, is_query=True)
  phi_k = favor_features(k, projection, is_query=False)
  return kernelized_attention(phi_q, phi_k, v, None, eps=DENOMINATOR_CLAMP)


_FLOOR = -1e30  # the stabiliser of "no key yet": exp(_FLOOR - c) == 0 for any real c


def _rescaled_sum(a, b):
  """Combines (c, S, K) running sums held relative to exp(c): the associative step of the causal scan."""
  (ca, sa, ka), (cb, sb, kb) = a, b
  c = jnp.maximum(ca, cb)
  fa, fb = jnp.exp(ca - c), jnp.exp(cb - c)
  return c, sa * fa[..., None] + sb * fb[..., None], ka * fa[..., None, None] + kb * fb[..., None, None]


def _chunked_favor_sums(phi_q, e, c, v, carry, chunk):
  """phi_q_i . sum_{j <= i} e_j v_j^T exp(c_j - C_i) and phi_q_i . sum_{j <= i} e_j exp(c_j - C_i), C_i the running
  max of c (and the carry's), continuing from carry = (c, s, kv); returns them and the sums after the last position.

  Within a chunk the masked [chunk, chunk] products (each factor exp(c_j - C_i) <= 1, the masked ones exactly 0);
  across chunks each chunk's sums, relative to its own max, combined by the associative scan (`_rescaled_sum`).
  Memory O(T / chunk * m * p + T * chunk), where a rescaled sum per position took O(T m p).
  """
  b, h, t, m = phi_q.shape
  size = min(chunk, t)
  # Padded positions: no key weight (e = 0, c at the floor, so the running max repeats its last value there);
  # their outputs are dropped.
  q_, e_, v_, c_ = in_chunks(phi_q, size), in_chunks(e, size), in_chunks(v, size), in_chunks(c, size, _FLOOR)
  n = c_.shape[2]
  running_ = jnp.maximum(carry[0][:, :, None], jax.lax.cummax(c_.reshape(b, h, n * size), axis=2))
  running_ = running_.reshape(b, h, n, size)  # C_i, the running max of c (and the carry's)
  top = jnp.max(c_, axis=-1)  # each chunk's own max: its sums are held relative to it
  weight = jnp.exp(c_ - top[..., None])
  own = (top, jnp.einsum("bhnsm,bhns->bhnm", e_, weight), jnp.einsum("bhnsm,bhns,bhnsp->bhnmp", e_, weight, v_))
  start = tuple(x[:, :, None] for x in carry)
  through = _rescaled_sum(start, jax.lax.associative_scan(_rescaled_sum, own, axis=2))  # through each chunk's end
  before = tuple(jnp.concatenate([a, x[:, :, :-1]], axis=2) for a, x in zip(start, through, strict=True))
  scale = jnp.exp(before[0][..., None] - running_)  # the carried sums, from their max to C_i (<= 1)
  num = jnp.einsum("bhnsm,bhnmp->bhnsp", q_, before[2]) * scale[..., None]
  den = jnp.einsum("bhnsm,bhnm->bhns", q_, before[1]) * scale
  causal = jnp.tril(jnp.ones((size, size), bool))
  factor = jnp.exp(jnp.where(causal, c_[:, :, :, None, :] - running_[..., None], -jnp.inf))  # [B, H, n, i, j]
  scores = jnp.einsum("bhnsm,bhntm->bhnst", q_, e_) * factor
  num = num + jnp.einsum("bhnst,bhntp->bhnsp", scores, v_)
  den = den + jnp.sum(scores, axis=-1)
  last = tuple(x[:, :, -1] for x in through)
  return num.reshape(b, h, n * size, -1)[:, :, :t], den.reshape(b, h, n * size)[:, :, :t], last


def causal_favor(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  projection: jax.Array,
  key_valid: jax.Array | None = None,
  carry: dict | None = None,
  *,
  eps: float = FEATURE_EPS,
  chunk: int = CAUSAL_CHUNK,
) -> tuple[jax.Array, dict]:
  """Causal FAVOR+: out_i = phi(q_i)^T sum_{j<=i} phi_i(k_j) v_j^T / phi(q_i)^T sum_{j<=i} phi_i(k_j).

  The key stabiliser may not look ahead: phi_i(k_j) = exp(w^T k_j' - ||k_j'||^2 / 2 - c_i) + eps with c_i the
  running max over the real keys j <= i (the non-causal form's c at i = N), kept with rescaled running sums
  (`_chunked_favor_sums`: within `chunk` positions masked products, across chunks an associative scan), so
  decoding from `carry` reproduces the full forward exactly.

  Args:
    q, k, v: [B, H, T, p]; projection [m, p]; key_valid [B, T] or None.
    carry: the sums of earlier positions (`decode`), None at the start.
  Returns:
    ([B, H, T, p] in the compute dtype, the carry after the last position).
  """
  dt = compute_dtype(q.dtype)
  b, h, t, p = q.shape
  m = projection.shape[0]
  valid = jnp.ones((b, t), bool) if key_valid is None else key_valid
  phi_q = favor_features(q, projection, is_query=True, eps=eps)
  ks = k.astype(dt) * jnp.asarray(p**-0.25, dt)
  exponent = jnp.einsum("bhlp,mp->bhlm", ks, projection.astype(dt)) - 0.5 * jnp.sum(ks * ks, -1, keepdims=True)
  real = valid[:, None, :]  # [B, 1, T]
  c = jnp.where(real, jax.lax.stop_gradient(jnp.max(exponent, axis=-1)), _FLOOR)  # [B, H, T]
  # The exponent is zeroed at padded keys BEFORE the exp: an unbounded one would give exp(inf) * 0 = NaN gradients.
  e = jnp.where(real[..., None], jnp.exp(jnp.where(real[..., None], exponent - c[..., None], 0.0)), 0.0)
  v = zero_padded(v.astype(dt), key_valid)
  v_sum, count = jnp.cumsum(v, axis=2), jnp.cumsum(jnp.broadcast_to(real, (b, h, t)).astype(dt), axis=2)
  if carry is None:
    carry = dict(c=jnp.full((b, h), _FLOOR, dt), s=jnp.zeros((b, h, m), dt), kv=jnp.zeros((b, h, m, p), dt))
    carry.update(v=jnp.zeros((b, h, p), dt), count=jnp.zeros((b, h), dt))
  kv_num, s_den, last_sums = _chunked_favor_sums(phi_q, e, c, v, (carry["c"], carry["s"], carry["kv"]), chunk)
  v_sum, count = v_sum + carry["v"][:, :, None], count + carry["count"][:, :, None]
  feature_sum = jnp.sum(phi_q, axis=-1)  # the eps added to every key feature meets every query feature
  num = kv_num + eps * feature_sum[..., None] * v_sum
  den = s_den + eps * feature_sum * count
  out = num / jnp.maximum(den, DENOMINATOR_CLAMP)[..., None]
  last = dict(zip(("c", "s", "kv"), last_sums, strict=True), v=v_sum[:, :, -1], count=count[:, :, -1])
  return out, last


class PerformerAttention(BaselineAttention):
  """ "performer": FAVOR+ with fixed positive orthogonal random features.

  Attributes:
    num_features: m, the number of random features (the release's "performer-256":
      rp_dim = 256).
    feature_seed: seed of the features, drawn once (never redrawn); every
      layer with the same seed shares them. A `random_state` collection entry
      "projection" [m, p] (`common.RANDOM_STATE_COLLECTION`) replaces the draw
      (a converted release checkpoint carries its per-layer matrices there).
    feature_eps: performer-pytorch's eps added to the features.
    form: "paper" (default) or "release" (`release_performer_attention`: the input scaled by
      p^-1/4 twice, padded keys kept in the stabiliser and the normaliser; non-causal only).
    The rest: see `BaselineAttention`; causal=True (`causal_favor`: a running key stabiliser) and
    decode=True (its running sums: constant-size state) are supported in the paper form.
  """

  num_features: int = 256
  feature_seed: int = 0
  feature_eps: float = FEATURE_EPS
  form: str = "paper"

  supports_causal: ClassVar[bool] = True
  supports_decode: ClassVar[bool] = True
  kv_only_state: ClassVar[bool] = True  # the key stabiliser and sums, one projection for all heads

  def validate(self):
    check_form(self.form, self.causal, "PerformerAttention")
    check_positive(self.num_features, "num_features")
    if not (isinstance(self.feature_eps, int | float) and math.isfinite(self.feature_eps) and self.feature_eps > 0):
      raise ValueError(f"feature_eps must be a finite float > 0, got {self.feature_eps!r}")

  def projection(self, head_dim: int) -> jax.Array:
    """[num_features, head_dim] directions of this module (a function of `feature_seed` only): a constant of the
    traced step (`fixed_projection`), not a QR the step computes again at every call."""
    return jnp.asarray(fixed_projection(self.feature_seed, self.num_features, head_dim))

  def attend_heads(self, q, k, v, query_valid, key_valid):
    del query_valid
    p = q.shape[-1]
    projection = random_state(self, "projection", (self.num_features, p), lambda: self.projection(p))
    if self.form == "release":
      return release_performer_attention(q, k, v, projection, key_valid)
    if not self.causal:
      return performer_attention(q, k, v, projection, key_valid, eps=self.feature_eps)
    if not self.decode:
      return causal_favor(q, k, v, projection, key_valid, eps=self.feature_eps)[0]
    dt = compute_dtype(q.dtype)
    b, h, _, _ = q.shape
    m = self.num_features
    zeros = dict(c=jnp.full((b, h), _FLOOR, dt), s=jnp.zeros((b, h, m), dt), kv=jnp.zeros((b, h, m, p), dt))
    zeros.update(v=jnp.zeros((b, h, p), dt), count=jnp.zeros((b, h), dt))
    state, store = decode_carry(self, zeros)
    out, last = causal_favor(q, k, v, projection, key_valid, state, eps=self.feature_eps)
    store(last)
    return out
