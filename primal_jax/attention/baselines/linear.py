"""Linear attention (Katharopoulos et al., 2020) and the kernelised-attention core it shares.

A feature map phi turns softmax(q^T k) into the kernel <phi(q), phi(k)>, so
attention factorises through an f x p summary of the keys and costs O(N f p):

  out_i = sum_j <phi(q_i), phi(k_j)> v_j / sum_j <phi(q_i), phi(k_j)>
        = phi(q_i)^T (sum_j phi(k_j) v_j^T) / phi(q_i)^T (sum_j phi(k_j)).
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp

from primal_jax.attention.baselines.common import BaselineAttention, compute_dtype, zero_padded

# Lower clamp of the normaliser (cosFormer's clamp_min; fast-transformers adds the same 1e-6 instead).
DENOMINATOR_EPS = 1e-6


def kernelized_attention(
  phi_q: jax.Array,
  phi_k: jax.Array,
  v: jax.Array,
  key_valid: jax.Array | None = None,
  *,
  causal: bool = False,
  normalize: bool = True,
  eps: float = DENOMINATOR_EPS,
) -> jax.Array:
  """out_i = sum_j w_j <phi_q_i, phi_k_j> v_j / max(sum_j w_j <phi_q_i, phi_k_j>, eps).

  Computed right to left (keys summarised first), never forming the N x M matrix.

  Args:
    phi_q: [B, H, N, f] query features.
    phi_k: [B, H, M, f] key features.
    v: [B, H, M, p] values.
    key_valid: [B, M] bool (True = real key) or None; padded keys get w_j = 0
      (their features and values are zeroed, so their content cannot leak).
    causal: sum over j <= i only (prefix sums; O(N f p) memory). Needs N == M.
    normalize: divide by the normaliser; False returns the numerator alone.
    eps: lower clamp of the normaliser (a row with no real key gives 0).
  Returns:
    [B, H, N, p] in the compute dtype (at least float32).
  """
  dt = compute_dtype(jnp.result_type(phi_q.dtype, phi_k.dtype, v.dtype))
  phi_q, phi_k, v = phi_q.astype(dt), phi_k.astype(dt), v.astype(dt)
  phi_k, v = zero_padded(phi_k, key_valid), zero_padded(v, key_valid)
  if causal:
    if phi_q.shape[2] != phi_k.shape[2]:
      raise ValueError(f"causal attention needs as many queries as keys, got {phi_q.shape[2]} and {phi_k.shape[2]}")
    kv = jnp.cumsum(jnp.einsum("bhmf,bhmp->bhmfp", phi_k, v), axis=2)  # [B, H, N, f, p] prefix sums
    num = jnp.einsum("bhnf,bhnfp->bhnp", phi_q, kv)
    den = jnp.einsum("bhnf,bhnf->bhn", phi_q, jnp.cumsum(phi_k, axis=2))
  else:
    kv = jnp.einsum("bhmf,bhmp->bhfp", phi_k, v)  # [B, H, f, p] = sum_j phi_k_j v_j^T
    num = jnp.einsum("bhnf,bhfp->bhnp", phi_q, kv)
    den = jnp.einsum("bhnf,bhf->bhn", phi_q, jnp.sum(phi_k, axis=2))
  if not normalize:
    return num
  return num / jnp.maximum(den, eps)[..., None]


def elu_feature_map(x: jax.Array) -> jax.Array:
  """phi(x) = elu(x) + 1 > 0 elementwise (Katharopoulos et al.)."""
  return jax.nn.elu(x) + 1.0


def linear_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  key_valid: jax.Array | None = None,
  *,
  causal: bool = False,
  normalize: bool = True,
  eps: float = DENOMINATOR_EPS,
) -> jax.Array:
  """Linear attention with phi = elu + 1.

  normalize=True is Katharopoulos et al.: phi(q_i)^T S / max(phi(q_i)^T z, eps)
  with S = sum_j phi(k_j) v_j^T, z = sum_j phi(k_j). normalize=False is the
  Nystromformer LRA code's `LinearAttention` (the paper's "Linear Trans."
  baseline): phi(q_i)^T S / sqrt(p), no normaliser (it scales q and k by p^-1/4 each).

  Args:
    q: [B, H, N, p]; k, v: [B, H, M, p]; key_valid: [B, M] bool or None.
    causal, normalize, eps: see `kernelized_attention`.
  Returns:
    [B, H, N, p].
  """
  dt = compute_dtype(q.dtype)
  phi_q, phi_k = elu_feature_map(q.astype(dt)), elu_feature_map(k.astype(dt))
  out = kernelized_attention(phi_q, phi_k, v, key_valid, causal=causal, normalize=normalize, eps=eps)
  if normalize:
    return out  # a scale of q or k cancels in the ratio
  return out / jnp.sqrt(jnp.asarray(q.shape[-1], out.dtype))


class LinearAttention(BaselineAttention):
  """ "linear": Katharopoulos et al. linear attention, phi(x) = elu(x) + 1.

  Attributes:
    normalize: True (default) divides by phi(q)^T sum_j phi(k_j)
      (Katharopoulos et al.); False reproduces the release's unnormalised
      variant (see `linear_attention`).
    eps: lower clamp of the normaliser.
    The rest: see `BaselineAttention`; causal=True is supported (prefix sums).
  """

  normalize: bool = True
  eps: float = DENOMINATOR_EPS

  supports_causal: ClassVar[bool] = True

  def attend_heads(self, q, k, v, query_valid, key_valid):
    del query_valid
    return linear_attention(q, k, v, key_valid, causal=self.causal, normalize=self.normalize, eps=self.eps)
