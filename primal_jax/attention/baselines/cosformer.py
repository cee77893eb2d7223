"""cosFormer attention (Qin et al., 2022): ReLU features with a cos re-weighting.

  s_ij = <relu(q_i), relu(k_j)> cos(pi/2 (i - j) / M),  out_i = sum_j s_ij v_j / sum_j s_ij,

with 0-based positions and M = max(N, M_keys) (the official code's
`get_index`: angles pi/2 (i + 1) / M). Since cos(a - b) = cos a cos b + sin a sin b,
s_ij = <[q_i sin a_i, q_i cos a_i], [k_j sin a_j, k_j cos a_j]>, a kernel of
2p-dimensional features, so the attention is linear in N.
"""

from __future__ import annotations

import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from primal_jax.attention.baselines.common import BaselineAttention, compute_dtype
from primal_jax.attention.baselines.linear import DENOMINATOR_EPS, kernelized_attention


def cosformer_features(x: jax.Array, horizon: int) -> jax.Array:
  """[relu(x_i) sin a_i, relu(x_i) cos a_i] with a_i = pi/2 (i + 1) / horizon.

  Args:
    x: [B, H, L, p] queries or keys (before the ReLU).
    horizon: M >= L, the re-weighting's length scale.
  Returns:
    [B, H, L, 2p] in the compute dtype.
  """
  dt = compute_dtype(x.dtype)
  relu = jax.nn.relu(x.astype(dt))
  angle = (math.pi / 2) * jnp.arange(1, x.shape[2] + 1, dtype=dt) / horizon  # [L]
  return jnp.concatenate([relu * jnp.sin(angle)[:, None], relu * jnp.cos(angle)[:, None]], axis=-1)


def cosformer_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  key_valid: jax.Array | None = None,
  *,
  causal: bool = False,
  eps: float = DENOMINATOR_EPS,
) -> jax.Array:
  """cosFormer attention; the normaliser is clamped below at eps (official clamp_min 1e-6).

  Args:
    q: [B, H, N, p]; k, v: [B, H, M, p]; key_valid: [B, M] bool or None
      (padded keys get zero features; they still count in the horizon M).
    causal: sum over j <= i (the official causal form); needs N == M.
    eps: lower clamp of the normaliser.
  Returns:
    [B, H, N, p].
  """
  horizon = max(q.shape[2], k.shape[2])
  phi_q, phi_k = cosformer_features(q, horizon), cosformer_features(k, horizon)
  return kernelized_attention(phi_q, phi_k, v, key_valid, causal=causal, eps=eps)


class CosformerAttention(BaselineAttention):
  """ "cosformer": ReLU features with the cos/sin re-weighting (Qin et al., 2022).

  Attributes:
    eps: lower clamp of the normaliser.
    The rest: see `BaselineAttention`; causal=True is supported (prefix sums).
  """

  eps: float = DENOMINATOR_EPS

  supports_causal: ClassVar[bool] = True

  def attend_heads(self, q, k, v, query_valid, key_valid):
    del query_valid
    return cosformer_attention(q, k, v, key_valid, causal=self.causal, eps=self.eps)
