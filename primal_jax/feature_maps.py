"""Feature maps phi_q, phi_k of Primal-Attention (paper section 4, Remark 4.1).

The asymmetric attention kernel is K_ij = <phi_q(x_i), phi_k(x_j)>. The release
uses the cosine map for every experiment; the positive random features of
Remark 4.1 are the softmax-kernel alternative the paper names.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# PyTorch F.normalize's clamp: a zero vector maps to 0, never NaN.
COSINE_EPS = 1e-12


def _compute_dtype(dtype):
  # Norms and exponentials are computed in at least float32, also for bf16 inputs.
  return jnp.promote_types(dtype, jnp.float32)


def cosine_feature_map(z: jax.Array, eps: float = COSINE_EPS) -> jax.Array:
  """phi(z) = z / max(||z||_2, eps) over the last axis (PyTorch `F.normalize`).

  Args:
    z: [..., p] queries or keys of one head.
    eps: lower clamp of the norm.
  Returns:
    [..., p] unit vectors (zero where z is zero), dtype of `z`.
  """
  zc = z.astype(_compute_dtype(z.dtype))
  # sqrt(max(|z|^2, eps^2)) == max(|z|, eps), but its gradient at z = 0 is 0, not NaN.
  norm = jnp.sqrt(jnp.maximum(jnp.sum(zc * zc, axis=-1, keepdims=True), eps * eps))
  return (zc / norm).astype(z.dtype)


def random_feature_projection(key: jax.Array, num_features: int, dim: int) -> jax.Array:
  """w_1..w_m ~ N(0, I_dim) of Remark 4.1, as a [num_features, dim] matrix."""
  return jax.random.normal(key, (num_features, dim), jnp.float32)


def softmax_kernel_feature_map(z: jax.Array, projection: jax.Array) -> jax.Array:
  """Positive random features of the softmax kernel (Remark 4.1, Performer FAVOR+).

  g(z) = exp(-||z||^2 / 2) [exp(w_1^T z), ..., exp(w_m^T z)] / sqrt(m), so that
  E[g(x)^T g(y)] = exp(x^T y). The 1/sqrt(m) factor cancels in the D^-1/2
  normalised scores (see `softmax_kernel_normalizer`).

  Args:
    z: [..., d] queries or keys of one head.
    projection: [m, d] Gaussian directions.
  Returns:
    [..., m] positive features, dtype of `z`.
  """
  zc = z.astype(_compute_dtype(z.dtype))
  m = projection.shape[0]
  logits = zc @ projection.T.astype(zc.dtype) - 0.5 * jnp.sum(zc * zc, axis=-1, keepdims=True)
  return (jnp.exp(logits) / jnp.sqrt(jnp.asarray(m, zc.dtype))).astype(z.dtype)


def softmax_kernel_normalizer(
  phi_q: jax.Array, phi_k: jax.Array, valid: jax.Array | None = None, causal: bool = False
) -> jax.Array:
  """Diagonal of D = diag(phi_q(X) (phi_k(X)^T 1_N)) of Remark 4.1.

  Args:
    phi_q, phi_k: [N, m] positive features of one head and sequence.
    valid: optional [N] 0/1 weights; padded keys do not enter the row sums.
    causal: if True, row i sums keys j <= i only.
  Returns:
    [N] strictly positive normalisers (D_ii); 1 where no key enters the sum.
  """
  k = phi_k if valid is None else phi_k * valid[:, None].astype(phi_k.dtype)
  key_sums = jnp.cumsum(k, axis=0) if causal else jnp.sum(k, axis=0, keepdims=True)
  d = jnp.sum(phi_q * key_sums, axis=-1)
  # D = 0 only where no (real) key enters the sum (padding before the first real token). A tiny
  # floor there gives D^-1/2 ~ 1e19: its square overflows in the KSVD terms and its infinite
  # derivative turns the masked zero cotangents into NaN gradients. Those rows are masked anyway.
  return jnp.where(d > 0, d, jnp.ones_like(d))
