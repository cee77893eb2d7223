"""cosFormer attention (Qin et al., 2022): ReLU features with a cos re-weighting.

  s_ij = <relu(q_i), relu(k_j)> cos(pi/2 (i - j) / M),  out_i = sum_j s_ij v_j / sum_j s_ij,

with 0-based positions and M = max(N, M_keys) (the official code's
`get_index`: angles pi/2 (i + 1) / M). Since cos(a - b) = cos a cos b + sin a sin b,
s_ij = <[q_i sin a_i, q_i cos a_i], [k_j sin a_j, k_j cos a_j]>, a kernel of
2p-dimensional features, so the attention is linear in N.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from primal_jax.attention.baselines.common import check_form, compute_dtype
from primal_jax.attention.baselines.linear import DENOMINATOR_EPS, KernelizedAttention, kernelized_attention
from primal_jax.feature_maps import cosine_feature_map
from primal_jax.masks import refuse_unhonoured
from primal_jax.validation import check_positive


def cosformer_features(x: jax.Array, horizon: int, offset: int | jax.Array = 0) -> jax.Array:
  """[relu(x_i) sin a_i, relu(x_i) cos a_i] with a_i = pi/2 (offset + i + 1) / horizon.

  Args:
    x: [B, H, L, p] queries or keys (before the ReLU).
    horizon: M >= L, the re-weighting's length scale.
    offset: position of x's first row (decoding continues a sequence).
  Returns:
    [B, H, L, 2p] in the compute dtype.
  """
  dt = compute_dtype(x.dtype)
  relu = jax.nn.relu(x.astype(dt))
  angle = (math.pi / 2) * (offset + jnp.arange(1, x.shape[2] + 1)).astype(dt) / horizon  # [L]
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


def release_cos_features(x: jax.Array) -> jax.Array:
  """The release's "cos" features: F.normalize(x) (x / max(||x||_2, 1e-12)), in the compute dtype."""
  return cosine_feature_map(x.astype(compute_dtype(x.dtype)))


class CosformerAttention(KernelizedAttention):
  """ "cosformer": ReLU features with the cos/sin re-weighting (Qin et al., 2022).

  Attributes:
    form: "paper" (default) or "release": the Primal-Attention release's `CosAttention` (attn_type "cos"),
      which is L2-normalised linear attention, F.normalize(Q) (F.normalize(K)^T V) / sqrt(N), with no
      position re-weighting, no ReLU and no normaliser (non-causal only).
    eps: lower clamp of the normaliser.
    horizon: M of the re-weighting; None (default, the official code) = the sequence length. Decoding
      needs a fixed horizon (the outputs at i depend on M), e.g. the model's max_len.
    The rest: see `BaselineAttention`; causal=True (prefix sums) and decode=True are supported.
  """

  form: str = "paper"
  eps: float = DENOMINATOR_EPS
  horizon: int | None = None

  def validate(self):
    check_form(self.form, self.causal, "CosformerAttention")
    if self.horizon is not None:
      check_positive(self.horizon, "horizon")
    if self.decode and self.horizon is None:
      raise ValueError("CosformerAttention: decode=True needs a fixed horizon (e.g. the model's max_len), got None")

  def num_features_of(self, head_dim):
    return 2 * head_dim

  def features(self, q, k, offset):
    """Past the horizon the angle passes pi/2 and the cos weights turn negative (outputs reach 1e4 and more), so
    a full call longer than `horizon` is refused (static shapes), and a decoding step past it is refused when
    its position is concrete, else its outputs (and the running sums after it) are NaN (`refuse_unhonoured`;
    `debug_checks` adds a host-callback ValueError)."""
    if self.form == "release":
      return release_cos_features(q), release_cos_features(k)
    length = max(q.shape[2], k.shape[2])
    horizon = self.horizon or length
    if not self.decode and length > horizon:
      raise ValueError(
        f"CosformerAttention: sequence length {length} exceeds horizon={horizon} (the re-weighting needs "
        "horizon >= the length); set horizon >= the longest sequence, or None (the sequence length)"
      )
    phi_q, phi_k = cosformer_features(q, horizon, offset), cosformer_features(k, horizon, offset)
    if self.decode:
      ok = jnp.broadcast_to(offset + q.shape[2] <= horizon, q.shape[:1])
      message = (
        f"CosformerAttention: decoding past horizon={horizon} (positions >= the horizon are not defined); "
        "start a new cache or build the layer with a larger horizon"
      )
      phi_q, phi_k = (refuse_unhonoured(phi, ok, message, self.debug_checks) for phi in (phi_q, phi_k))
    return phi_q, phi_k
