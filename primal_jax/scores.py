"""e/r projection scores of one head and one sequence (paper eq. 9, Algorithm 1).

The Flax module vmaps these over heads and batch; tests call them directly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def data_dependent_weights(sampled_rows: jax.Array, w: jax.Array) -> jax.Array:
  """W_{.|X} = F_X^T W (paper section 3): [n, p] sampled rows, [n, s] parameter -> [p, s]."""
  return sampled_rows.T @ w


def primal_scores(phi_q: jax.Array, phi_k: jax.Array, we_x: jax.Array, wr_x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """e_i = W_e|X^T phi_q(x_i), r_i = W_r|X^T phi_k(x_i).

  Args:
    phi_q, phi_k: [N, p] feature-mapped queries and keys.
    we_x, wr_x: [p, s] projection weights.
  Returns:
    escore, rscore: [N, s] each.
  """
  return phi_q @ we_x, phi_k @ wr_x


def causal_running_mean(z: jax.Array, valid: jax.Array | None = None, axis: int = -2) -> jax.Array:
  """Replaces z_i by the mean of z_j over j <= i (appendix B, causal variant).

  Because the cosine feature map ignores scale, this equals normalising the
  running sums, which is what makes O(1)-memory decoding possible.

  Args:
    z: [..., N, p] queries or keys.
    valid: optional [..., N] 0/1 weights: padded positions neither contribute
      nor count (padding-aware mode). None: plain cumsum / (i + 1), the release.
    axis: the sequence axis of `z`.
  Returns:
    [..., N, p] running means, dtype of `z`.
  """
  axis = axis % z.ndim
  if valid is None:
    count_shape = [1] * z.ndim
    count_shape[axis] = z.shape[axis]
    counts = jnp.arange(1, z.shape[axis] + 1, dtype=z.dtype).reshape(count_shape)
    return jnp.cumsum(z, axis=axis) / counts
  w = jnp.expand_dims(valid.astype(z.dtype), -1)
  counts = jnp.cumsum(w, axis=axis)
  return jnp.cumsum(z * w, axis=axis) / jnp.maximum(counts, 1)
