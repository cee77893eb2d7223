"""YOSO-E (Zeng et al., 2021, "You Only Sample (Almost) Once"): the expectation of LSH-based attention.

YOSO hashes unit queries and keys with tau random hyperplanes; a query and a key collide with probability
(1 - arccos(q . k) / pi)^tau. YOSO-E replaces the sampled collisions by that expectation (mlpen/YOSO,
`yoso_v1/yoso.py` `YOSOEAttention` with `kernel.Cumulation`, the exact O(N^2) reference of their sampler):

  q^ = q / norm(q),  k^ = k / norm(k),   E_ij = (1 - arccos(q^_i . k^_j) / pi)^tau m_i m_j,
  out_i = normalize(sum_j E_ij v_j)  [+ depthwise conv of the masked values, optional]

There is no softmax and no division by sum_j E_ij: the rows are L2-normalised instead. The upstream's
backward is not the derivative of E (which is infinite where q^ . k^ = +-1): it takes dE/d(q^ . k^) =
tau / 2 E, the derivative YOSO's sampler uses. `yoso_expectation` keeps that gradient (`jax.custom_vjp`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from primal_jax.attention.baselines.common import BaselineAttention, compute_dtype, zero_padded
from primal_jax.attention.baselines.nystromformer import depthwise_sequence_conv
from primal_jax.feature_maps import cosine_feature_map
from primal_jax.initializers import linear_inits
from primal_jax.validation import check_positive

# Queries per block of E (memory O(QUERY_BLOCK * M) instead of O(N * M)).
QUERY_BLOCK = 256


# Abramowitz & Stegun 4.4.46: arccos(a) = sqrt(1 - a) (c0 + c1 a + ... + c7 a^7) on [0, 1], |error| <= 2.2e-8
# (printed as 2e-8; at a = 0 it is 2.18e-8).
ARCCOS_COEFFICIENTS = (
  1.5707963050,
  -0.2145988016,
  0.0889789874,
  -0.0501743046,
  0.0308918810,
  -0.0170881256,
  0.0066700901,
  -0.0012624911,
)


def polynomial_arccos(x: jax.Array) -> jax.Array:
  """arccos on [-1, 1] (A&S 4.4.46 on abs(x), pi minus it below 0): exact at -1 and 1.

  Arithmetic only, so it vectorises: XLA:CPU lowers `jnp.arccos` to an atan2 that it does not, and YOSO-E
  takes one arccos per query-key pair, forward and again in the backward (`benchmarks/efficiency.py`,
  `--variants=yoso_e`, times the step). Within float32 rounding of the exact value (tests).
  """
  a = jnp.abs(x)
  poly = jnp.full_like(a, ARCCOS_COEFFICIENTS[-1])
  for c in ARCCOS_COEFFICIENTS[-2::-1]:
    poly = poly * a + c
  angle = jnp.sqrt(jnp.maximum(1.0 - a, 0.0)) * poly
  return jnp.where(x < 0, math.pi - angle, angle)


def collision_probability(cosine: jax.Array, tau: int) -> jax.Array:
  """(1 - arccos(x) / pi)^tau, with x clipped to [-1, 1] (rounding can put abs(q^ . k^) just above 1)."""
  return (1.0 - polynomial_arccos(jnp.clip(cosine, -1.0, 1.0)) / math.pi) ** tau


def _expectation(q_hat, k_hat, q_weight, k_weight, tau):
  """E [B, H, N, M]: the collision probabilities times the query and key weights (0/1 padding)."""
  cosine = jnp.einsum("bhnp,bhmp->bhnm", q_hat, k_hat)
  return collision_probability(cosine, tau) * q_weight[:, None, :, None] * k_weight[:, None, None, :]


def _query_blocks(x: jax.Array, block: int) -> jax.Array:
  """[B, H, N, f] or [B, N] -> [nb, ...] blocks of `block` queries along N (zero-padded at the end)."""
  axis = x.ndim - 2 if x.ndim == 4 else 1
  nb = -(-x.shape[axis] // block)
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, nb * block - x.shape[axis])
  x = jnp.pad(x, pad)
  x = x.reshape(x.shape[:axis] + (nb, block) + x.shape[axis + 1 :])
  return jnp.moveaxis(x, axis, 0)


def _unblock(blocks: jax.Array, length: int) -> jax.Array:
  """[nb, B, H, block, f] -> [B, H, N, f]."""
  x = jnp.moveaxis(blocks, 0, 2)
  return x.reshape(x.shape[:2] + (-1,) + x.shape[4:])[:, :, :length]


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _cumulation(q_hat, k_hat, v, q_weight, k_weight, tau, block):
  """E V, one block of `block` queries at a time (memory O(block M), not O(N M))."""

  def one(args):
    q_blk, w_blk = args
    return jnp.einsum("bhnm,bhmp->bhnp", _expectation(q_blk, k_hat, w_blk, k_weight, tau), v)

  blocks = jax.lax.map(one, (_query_blocks(q_hat, block), _query_blocks(q_weight, block)))
  return _unblock(blocks, q_hat.shape[2])


def _cumulation_fwd(q_hat, k_hat, v, q_weight, k_weight, tau, block):
  return _cumulation(q_hat, k_hat, v, q_weight, k_weight, tau, block), (q_hat, k_hat, v, q_weight, k_weight)


def _cumulation_bwd(tau, block, res, grad):
  """Upstream's `Cumulation.backward`: W = (G V^T) * E, dq^ = W (tau/2) k^, dk^ = W^T (tau/2) q^, dv = E^T G.

  E is recomputed per block of queries; dk^ and dv accumulate over the blocks.
  """
  q_hat, k_hat, v, q_weight, k_weight = res
  half = jnp.asarray(tau / 2, q_hat.dtype)

  def one(carry, args):
    grad_k, grad_v = carry
    q_blk, w_blk, g_blk = args
    expectation = _expectation(q_blk, k_hat, w_blk, k_weight, tau)
    weighted = jnp.einsum("bhnp,bhmp->bhnm", g_blk, v) * expectation
    grad_k = grad_k + half * jnp.einsum("bhnm,bhnp->bhmp", weighted, q_blk)
    grad_v = grad_v + jnp.einsum("bhnm,bhnp->bhmp", expectation, g_blk)
    return (grad_k, grad_v), half * jnp.einsum("bhnm,bhmp->bhnp", weighted, k_hat)

  blocks = tuple(_query_blocks(x, block) for x in (q_hat, q_weight, grad))
  (grad_k, grad_v), grad_q = jax.lax.scan(one, (jnp.zeros_like(k_hat), jnp.zeros_like(v)), blocks)
  zero = jax.tree.map(jnp.zeros_like, (q_weight, k_weight))
  return _unblock(grad_q, q_hat.shape[2]), grad_k, grad_v, *zero


_cumulation.defvjp(_cumulation_fwd, _cumulation_bwd)


def yoso_expectation(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  query_valid: jax.Array | None = None,
  key_valid: jax.Array | None = None,
  *,
  tau: int,
  query_block: int = QUERY_BLOCK,
) -> jax.Array:
  """normalize(E V) of YOSO-E (no conv residual), with upstream's gradient through E.

  Args:
    q: [B, H, N, p]; k, v: [B, H, M, p].
    query_valid: [B, N] bool or None (padded queries: E row 0, output 0).
    key_valid: [B, M] bool or None (padded keys: E column 0).
    tau: hash code length (the exponent).
    query_block: queries per block: E is formed [query_block, M] at a time, forward and backward
      (time stays O(N M), memory O(query_block M)).
  Returns:
    [B, H, N, p] in the compute dtype; rows of unit norm (0 where E V is 0).
  """
  dt = compute_dtype(q.dtype)
  q_hat, k_hat = cosine_feature_map(q.astype(dt)), cosine_feature_map(k.astype(dt))
  ones = lambda n: jnp.ones((q.shape[0], n), dt)  # noqa: E731
  q_weight = ones(q.shape[2]) if query_valid is None else query_valid.astype(dt)
  k_weight = ones(k.shape[2]) if key_valid is None else key_valid.astype(dt)
  block = min(query_block, q.shape[2])
  return cosine_feature_map(_cumulation(q_hat, k_hat, v.astype(dt), q_weight, k_weight, tau, block))


class YosoAttention(BaselineAttention):
  """ "yoso_e": YOSO-E, the expected LSH-collision attention of mlpen/YOSO (non-causal, O(N^2)).

  Attributes:
    hash_code_len: tau, the number of hyperplanes per hash (the exponent of the collision probability);
      mlpen/YOSO's LRA configs use 10-12, Hugging Face's `YosoConfig` defaults to 9.
    conv_window: K of the depthwise conv residual on the padding-zeroed values (upstream's optional
      `conv_window`; one K-tap kernel per head, odd), 0 = off (upstream's default: no conv).
    The rest: see `BaselineAttention` (non-causal only).

  Masks: padding is honoured as upstream: padded queries and keys get E = 0 (a padded query's output is
  0 plus the conv residual). Parameter "conv" [K, H] as `NystromAttention`'s.
  """

  hash_code_len: int = 9
  conv_window: int = 0

  def validate(self) -> None:
    check_positive(self.hash_code_len, "hash_code_len")
    size = self.conv_window
    if not isinstance(size, int) or isinstance(size, bool) or size < 0 or (size > 0 and size % 2 == 0):
      raise ValueError(f"conv_window must be 0 (off) or an odd integer >= 1, got {size!r}")

  def attend_heads(self, q, k, v, query_valid, key_valid):
    out = yoso_expectation(q, k, v, query_valid, key_valid, tau=self.hash_code_len)
    if self.conv_window == 0:
      return out
    if q.shape[2] != k.shape[2]:
      raise ValueError(f"the conv residual (conv_window={self.conv_window}) needs as many queries as keys")
    init, _ = linear_inits(self.init_style, self.conv_window)
    kernel = self.param(
      "conv", self.logical(init, (None, "heads")), (self.conv_window, self.num_heads), self.param_dtype
    )
    return out + depthwise_sequence_conv(zero_padded(v.astype(out.dtype), key_valid), kernel.astype(out.dtype))
