"""KEP-SVGP's posterior math as small pure functions (Chen, Tao, Tonin, Suykens, ICML 2024; arXiv 2402.01476).

Per head h the e/r projection scores z (the kernel-eigen features of Primal-Attention's KSVD) feed a sparse
variational GP with s output dimensions d: the inducing variables u_d in R^s have the prior N(0, Lambda^2),
Lambda = diag(lam^-2) (lam = exp(log_lambda), the release's `lambda_sqrt_inv_diag`, i.e. Lambda^(-1/2)), and the
variational posterior q(u_d) = N(m_d, M_d M_d^T). A row r with features z_r gives the output
f[r, d] = v1_r . u_d, v1_r = z_r * lam^2 (= Lambda^-1 z_r), sampled by reparameterisation:

    f[r, d] = v1_r . m_d + v1_r^T M_d eps_(r, d).

Two forms (see docs/kep_svgp.md):

* "release" reproduces the authors' code (`CIFAR/model/kep_svgp.py`): the factor tensor L [H, s, s, s] is
  lower-triangular over its LAST two axes, but output d uses M_d[i, j] = L[h, i, j, d] (rank s - d), and one noise
  vector eps_r in R^s is shared by all s output dims; the KL assumes a full-rank triangular factor (its log-det
  term is -sum(log_ssqrt) while the factor actually used is singular for d >= 1).
* "paper" (the default of the layer) samples what that KL describes: M_d = L[h, d] (lower-triangular, diagonal
  exp(log_ssqrt[h, d]), so -log|M_d| = -sum_j log_ssqrt[h, d, j]), and independent noise eps_(r, d) in R^s per output
  dim, so the outputs of a row are independent across d as q(u) = prod_d q(u_d) states; the KL is the closed-form
  KL between the Gaussians sampled.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from primal_jax.validation import check_choice

FORMS = ("paper", "release")


def lambda_from_log(log_lambda: jax.Array) -> jax.Array:
  """lam = exp(log_lambda) [H, s] (the release's `lambda_sqrt_inv_diag`, Lambda^(-1/2))."""
  return jnp.exp(log_lambda)


def factor_tensor(s_sqrt_low_triangle: jax.Array, log_ssqrt: jax.Array) -> jax.Array:
  """L[h, i, j, k] = exp(log_ssqrt[h, i, j]) [j == k] + s_sqrt_low_triangle[h, i, j, k] [k < j]  [H, s, s, s]."""
  s = log_ssqrt.shape[-1]
  strict = jnp.tril(jnp.ones((s, s), bool), -1)
  diag = jnp.exp(log_ssqrt)[..., None] * jnp.eye(s, dtype=log_ssqrt.dtype)
  return diag + jnp.where(strict, s_sqrt_low_triangle, 0)


def posterior_factors(s_sqrt_low_triangle: jax.Array, log_ssqrt: jax.Array, form: str) -> jax.Array:
  """M [H, d, i, j]: the covariance factor of output dim d, S_d = M_d M_d^T (i multiplies v1).

  "paper": M_d = L[h, d] (lower-triangular, full rank); "release": M_d[i, j] = L[h, i, j, d] (the release's axes).
  """
  check_choice(form, FORMS, "form")
  lower = factor_tensor(s_sqrt_low_triangle, log_ssqrt)
  return lower if form == "paper" else jnp.transpose(lower, (0, 3, 1, 2))


def noise_shape(batch: int, heads: int, rows: int, rank: int, form: str) -> tuple[int, ...]:
  """Standard-normal noise of one forward: [B, H, R, s] ("release": one vector per row) or [B, H, R, s, s]
  ("paper": one vector per row and output dim)."""
  check_choice(form, FORMS, "form")
  return (batch, heads, rows, rank) if form == "release" else (batch, heads, rows, rank, rank)


def posterior_sample(
  z: jax.Array, lam: jax.Array, m_u: jax.Array, factors: jax.Array, eps: jax.Array | None, form: str
) -> tuple[jax.Array, jax.Array]:
  """(samples, mean) [B, H, R, s]: f[r, d] = v1_r . m_d + v1_r^T M_d eps, v1 = z lam^2.

  Args:
    z: [B, H, R, s] features (e + r, or [e; r] over rows).
    lam: [H, s]; m_u: [H, s, s] (m_d = m_u[h, :, d]); factors: [H, d, i, j] from `posterior_factors`.
    eps: `noise_shape(...)` standard normal, or None for the posterior mean.
    form: "paper" or "release" (which noise shape `eps` has).
  """
  v1 = z * jnp.square(lam)[None, :, None, :]  # [B, H, R, s]
  mean = jnp.einsum("bhri,hid->bhrd", v1, m_u)
  if eps is None:
    return mean, mean
  v2 = jnp.einsum("bhri,hdij->bhrdj", v1, factors)  # [B, H, R, d, j]
  if form == "release":
    noise = jnp.einsum("bhrdj,bhrj->bhrd", v2, eps)
  else:
    noise = jnp.einsum("bhrdj,bhrdj->bhrd", v2, eps)
  return mean + noise, mean


def kl_terms(
  lam: jax.Array, log_lambda: jax.Array, m_u: jax.Array, factors: jax.Array, log_ssqrt: jax.Array
) -> dict[str, jax.Array]:
  """The five terms of sum_{h, d} KL(N(m_d, M_d M_d^T) || N(0, diag(lam^-4))), in the release's names and order.

  trace = 1/2 sum lam_i^4 (M_d M_d^T)_ii, mean = 1/2 sum lam_i^4 m_(i,d)^2, logdet_s = -sum log_ssqrt (= -1/2 log|S_d|
  summed, for a triangular M_d with diagonal exp(log_ssqrt[h, d]); the release keeps this term with its singular
  factors), logdet_lambda = 1/2 s log|Lambda^2| summed over heads = -2 s sum log_lambda, const = -s^2 H / 2.
  """
  lam4 = jnp.square(jnp.square(lam))  # [H, s]
  heads, s = lam.shape
  return {
    "trace": 0.5 * jnp.sum(lam4[:, None, :, None] * jnp.square(factors)),
    "mean": 0.5 * jnp.sum(jnp.square(m_u) * lam4[:, :, None]),
    "logdet_s": -jnp.sum(log_ssqrt),
    "logdet_lambda": -0.5 * 4 * s * jnp.sum(log_lambda),
    "const": jnp.asarray(-0.5 * s * s * heads, lam.dtype),
  }


def kl_divergence(lam, log_lambda, m_u, factors, log_ssqrt) -> jax.Array:
  """Sum of `kl_terms` (accumulated in the release's order)."""
  t = kl_terms(lam, log_lambda, m_u, factors, log_ssqrt)
  return t["trace"] + t["mean"] + t["logdet_s"] + t["logdet_lambda"] + t["const"]
