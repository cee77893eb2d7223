"""Primal-Attention for ONE head of ONE sequence; the module vmaps it.

Kept as a plain function so tests can compare the vmapped module with an
explicit loop over heads, and so the math reads without batch bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from primal_jax.feature_maps import softmax_kernel_normalizer
from primal_jax.scores import causal_running_mean, data_dependent_weights, primal_scores


def head_features(
  q: jax.Array,
  k: jax.Array,
  valid: jax.Array | None = None,
  *,
  feature_map: Callable[[jax.Array], jax.Array],
  running_mean: bool = False,
  normalize: bool = False,
  causal_normalizer: bool = False,
  key_sum_offset: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
  """phi_q, phi_k [N, m] of one head, and Remark 4.1's D^-1/2 [N] (None without `normalize`).

  The scale multiplies position i's e and r scores, so it belongs to both
  phi_q(x_i) and phi_k(x_i) in the kernel those scores come from (Theorem 3.2).

  Args:
    q, k: [N, p] projected queries and keys of this head.
    valid: optional [N] 0/1 weights of real positions (padding-aware mode).
    feature_map: phi, [..., p] -> [..., m].
    running_mean: replace q_i, k_i by their means over j <= i (causal variant).
    normalize: apply Remark 4.1's D^-1/2 (softmax-kernel feature map).
    causal_normalizer: D sums keys j <= i only.
    key_sum_offset: [m] sum of phi_k over earlier decoded tokens (decoding).
  """
  if running_mean:
    q, k = causal_running_mean(q, valid), causal_running_mean(k, valid)
  phi_q, phi_k = feature_map(q), feature_map(k)
  if not normalize:
    return phi_q, phi_k, None
  # Mask padded keys BEFORE folding in the offset: the offset (earlier tokens' key features,
  # already masked) must survive a chunk whose first token is padding.
  k_for_sum = phi_k if valid is None else phi_k * valid[:, None].astype(phi_k.dtype)
  if key_sum_offset is not None:
    # Fold earlier tokens' key features into the first row of the running sum.
    k_for_sum = k_for_sum.at[0].add(key_sum_offset.astype(k_for_sum.dtype))
  d = softmax_kernel_normalizer(phi_q, k_for_sum, None, causal_normalizer)
  return phi_q, phi_k, jax.lax.rsqrt(d)


def primal_head(
  q: jax.Array,
  k: jax.Array,
  we: jax.Array,
  wr: jax.Array,
  rows: jax.Array | None = None,
  valid: jax.Array | None = None,
  **feature_options,
):
  """Scores of one head (paper eq. 9, SPEC sections 1-4).

  Args:
    q, k: [N, p] projected queries and keys of this head.
    we, wr: [a, s] parameters; a = n (data-dependent) or p (data-independent).
    rows: [n, p] sampled rows of the block input F_X, or None (data-independent).
    valid: optional [N] 0/1 weights of real positions (padding-aware mode).
    feature_options: `head_features`' keywords (feature_map, running_mean, normalize,
      causal_normalizer, key_sum_offset).
  Returns:
    escore, rscore [N, s]; we_x, wr_x [p, s] the weights that produced them.
  """
  phi_q, phi_k, scale = head_features(q, k, valid, **feature_options)
  if rows is None:
    we_x, wr_x = we, wr
  else:
    we_x, wr_x = data_dependent_weights(rows, we), data_dependent_weights(rows, wr)
  escore, rscore = primal_scores(phi_q, phi_k, we_x, wr_x)
  if scale is not None:
    scale = scale[:, None].astype(escore.dtype)
    escore, rscore = escore * scale, rscore * scale
  return escore, rscore, we_x, wr_x


def vmap_over_heads_and_batch(fn, *, has_rows: bool, has_valid: bool, has_offset: bool, token_major: bool = False):
  """Lifts a per-head function of (q, k, we, wr, rows, valid, key_sum_offset).

  Shapes after lifting: q, k [B, H, N, p]; we, wr [H, a, s]; rows [B, H, n, p];
  valid [B, N]; key_sum_offset [B, H, m]. Outputs: escore, rscore [B, H, N, s];
  we_x, wr_x [B, H, p, s]. Absent optional arguments are passed as None.
  `token_major`: q, k [B, N, H, p], rows [B, n, H, p] and escore, rscore [B, N, H, s]
  instead (the layout of the projections, so no transpose is needed around the heads).
  """
  t = 1 if token_major else 0  # the head axis of q, k, rows and the scores once the batch axis is mapped
  head_axes = (t, t, 0, 0, t if has_rows else None, None, 0 if has_offset else None)
  batch_axes = (0, 0, None, None, 0 if has_rows else None, 0 if has_valid else None, 0 if has_offset else None)
  inner = jax.vmap(fn, in_axes=head_axes, out_axes=(t, t, 0, 0))
  return jax.vmap(inner, in_axes=batch_axes)
