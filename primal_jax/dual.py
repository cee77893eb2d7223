"""Explicit dual (kernel) forms, for tests and the spectrum analysis.

Primal-Attention never builds K; these functions do, so that the primal-dual
identities of Theorem 3.2 / Remark 3.3 can be checked and Figure 1 drawn.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def induced_kernel(phi_q: jax.Array, phi_k: jax.Array, sampled_rows: jax.Array | None = None) -> jax.Array:
  """K_ij = phi_q(x_i)^T F_X^T F_X phi_k(x_j) (Theorem 3.2).

  Args:
    phi_q, phi_k: [..., N, p] feature maps of one head.
    sampled_rows: [..., n, p] F_X, the sampled rows of the block input; None
      means F_X = identity (data-independent weights), K = Phi_q Phi_k^T.
  Returns:
    [..., N, N] the asymmetric kernel matrix.
  """
  if sampled_rows is None:
    return phi_q @ jnp.swapaxes(phi_k, -1, -2)
  fq = phi_q @ jnp.swapaxes(sampled_rows, -1, -2)  # [..., N, n]
  fk = phi_k @ jnp.swapaxes(sampled_rows, -1, -2)
  return fq @ jnp.swapaxes(fk, -1, -2)


def dual_scores(kernel: jax.Array, h_e: jax.Array, h_r: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Dual representation (Remark 3.3): E = K H_r, R = K^T H_e.

  Args:
    kernel: [..., N, N]; h_e, h_r: [..., N, s] dual variables.
  Returns:
    E, R: [..., N, s].
  """
  return kernel @ h_r, jnp.swapaxes(kernel, -1, -2) @ h_e


def primal_weights_from_dual(phi_q, phi_k, h_e, h_r, sampled_rows=None):
  """Primal parameters whose scores equal the dual form (KKT conditions).

  Data-independent: W_e = Phi_k^T H_r, W_r = Phi_q^T H_e ([p, s]).
  Data-dependent: W_e = F_X Phi_k^T H_r, W_r = F_X Phi_q^T H_e ([n, s]), so
  that W_e|X = F_X^T W_e reproduces E = K H_r with the induced kernel.
  """
  we = jnp.swapaxes(phi_k, -1, -2) @ h_r
  wr = jnp.swapaxes(phi_q, -1, -2) @ h_e
  if sampled_rows is not None:
    we, wr = sampled_rows @ we, sampled_rows @ wr
  return we, wr


def singular_value_spectrum(kernel: jax.Array) -> jax.Array:
  """Singular values (descending) of [..., N, N] kernels, for Figure 1."""
  return jnp.linalg.svd(kernel, compute_uv=False)


def cumulative_explained_variance(singular_values: jax.Array) -> jax.Array:
  """Cumulative share of sum sigma_i^2 captured by the top-k singular values, k = 1..N."""
  energy = jnp.square(singular_values)
  return jnp.cumsum(energy, -1) / jnp.sum(energy, -1, keepdims=True)
