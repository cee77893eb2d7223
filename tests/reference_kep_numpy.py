"""Float64 NumPy reference of KEP-SVGP attention in the paper form (the intended computation), written from the
equations (docs/kep_svgp.md), not from primal_jax: loops over heads and output dims, explicit matrices.

Per head h and output dim d: q(u_d) = N(m_d, S_d), S_d = M_d M_d^T with M_d lower-triangular (diagonal
exp(log_ssqrt[h, d]), strict lower part s_sqrt_low_triangle[h, d]); prior N(0, P), P = diag(lam^-4); a row with
features z gives f_d = v . u_d, v = lam^2 z, sampled as v . m_d + v^T M_d eps_d with independent eps_d.
"""

from __future__ import annotations

import numpy as np


def release_rows(length: int, n: int) -> np.ndarray:
  """torch.linspace(0, N-1, n, dtype=int64) (the README's rule, two-sided, float64)."""
  if n == 1:
    return np.zeros(1, int)
  step = (length - 1) / (n - 1)
  return np.array([int(i * step) if i < n // 2 else int((length - 1) - step * (n - 1 - i)) for i in range(n)])


def factor(s_sqrt: np.ndarray, log_ssqrt: np.ndarray, h: int, d: int) -> np.ndarray:
  """M_d of head h: [s, s] lower-triangular."""
  m = np.tril(np.asarray(s_sqrt[h, d], np.float64), -1)
  m[np.diag_indices_from(m)] = np.exp(np.asarray(log_ssqrt[h, d], np.float64))
  return m


def normalize(v: np.ndarray) -> np.ndarray:
  return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)


def kep_paper_forward(x, wq, wk, params, eps, concat=False):
  """[B, N, D] head outputs merged head-major (before any output projection) and the KL, float64.

  x [B, N, D]; wq, wk [D, D] (x @ wq); params: We, Wr [H, n, s], log_lambda [H, s], m_u [H, s, s],
  s_sqrt_low_triangle [H, s, s, s], log_ssqrt [H, s, s], final_kernel [s, p], final_bias [p] (+ row_mix_kernel
  [2N, N], row_mix_bias [N] with concat); eps [B, H, R, s, s] (R = N or 2N) standard normal, or None (mean).
  """
  f64 = {k: np.asarray(v, np.float64) for k, v in params.items()}
  x = np.asarray(x, np.float64)
  batch, length, width = x.shape
  heads, n, s = f64["We"].shape
  p = width // heads
  idx = release_rows(length, n)
  out = np.zeros((batch, length, width))
  for b in range(batch):
    q, k = x[b] @ np.asarray(wq, np.float64), x[b] @ np.asarray(wk, np.float64)
    for h in range(heads):
      cols = slice(h * p, (h + 1) * p)
      xs = x[b][idx][:, cols]  # [n, p]
      e = normalize(q[:, cols]) @ (xs.T @ f64["We"][h])
      r = normalize(k[:, cols]) @ (xs.T @ f64["Wr"][h])
      z = np.concatenate([e, r], 0) if concat else e + r
      v = np.exp(2 * f64["log_lambda"][h]) * z  # [R, s], one row per output row
      f = v @ f64["m_u"][h]  # [R, s]: f[row, d] = v_row . m_d
      if eps is not None:
        for d in range(s):  # + v_row^T M_d eps_(row, d)
          m_d = factor(f64["s_sqrt_low_triangle"], f64["log_ssqrt"], h, d)
          f[:, d] += np.sum((v @ m_d) * np.asarray(eps[b, h, :, d], np.float64), axis=1)
      o = f @ f64["final_kernel"] + f64["final_bias"]
      if concat:
        o = f64["row_mix_kernel"].T @ o + f64["row_mix_bias"][:, None]
      out[b, :, cols] = o
  return out, kl_closed_form(params)


def gaussian_kl(mean, cov, prior_var) -> float:
  """KL(N(mean, cov) || N(0, diag(prior_var))) by the textbook formula (slogdet)."""
  s = mean.size
  sign, logdet = np.linalg.slogdet(cov)
  if sign <= 0:
    return np.inf
  return 0.5 * (np.sum(np.diag(cov) / prior_var) + np.sum(mean**2 / prior_var) - s + np.sum(np.log(prior_var)) - logdet)


def kl_closed_form(params) -> float:
  """sum over heads and output dims of KL(q(u_d) || p(u_d)) for the Gaussians the paper form samples."""
  f64 = {k: np.asarray(v, np.float64) for k, v in params.items()}
  heads, s = f64["log_lambda"].shape
  total = 0.0
  for h in range(heads):
    prior_var = np.exp(-4 * f64["log_lambda"][h])
    for d in range(s):
      m = factor(f64["s_sqrt_low_triangle"], f64["log_ssqrt"], h, d)
      total += gaussian_kl(f64["m_u"][h][:, d], m @ m.T, prior_var)
  return total


def kep_release_forward(x, wqk, params, eps):
  """The release's forward (README steps 1-11, sum variant) in float64: [B, N, D] outputs and the release's KL.

  wqk: torch `qk.weight` [2D, D]; params as `kep_paper_forward` (torch parameter shapes without the leading 1);
  eps [B, H, N, s] (one noise vector per row, shared by the s output dims); factor of output d: L[h, i, j, d].
  """
  f64 = {k: np.asarray(v, np.float64) for k, v in params.items()}
  x = np.asarray(x, np.float64)
  batch, length, width = x.shape
  heads, n, s = f64["We"].shape
  p = width // heads
  qk = x @ np.asarray(wqk, np.float64).T
  idx = release_rows(length, n) if n < length else np.arange(length)
  lam = np.exp(f64["log_lambda"])
  big_l = np.exp(f64["log_ssqrt"])[..., None] * np.eye(s) + np.tril(f64["s_sqrt_low_triangle"], -1)  # [H, s, s, s]
  out = np.zeros((batch, length, width))
  for b in range(batch):
    for h in range(heads):
      cols = slice(h * p, (h + 1) * p)
      xs = x[b][idx][:, cols].T  # [p, n]
      z = normalize(qk[b][:, cols]) @ (xs @ f64["We"][h]) + normalize(qk[b][:, width:][:, cols]) @ (xs @ f64["Wr"][h])
      v1 = z * lam[h] ** 2
      v2 = np.einsum("ri,ijd->drj", v1, big_l[h])
      samples = v1 @ f64["m_u"][h] + np.einsum("drj,rj->rd", v2, np.asarray(eps[b, h], np.float64))
      out[b, :, cols] = samples @ f64["final_kernel"] + f64["final_bias"]
  kl = (
    0.5 * np.sum((lam[:, :, None, None] ** 2 * big_l) ** 2)
    + 0.5 * np.sum(f64["m_u"] ** 2 * lam[:, :, None] ** 4)
    - np.sum(f64["log_ssqrt"])
    - 0.5 * 4 * s * np.sum(f64["log_lambda"])
    - 0.5 * s * s * heads
  )
  return out, kl
