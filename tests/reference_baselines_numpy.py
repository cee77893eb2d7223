"""Float64 NumPy references of Longformer, YOSO-E and SOFT (forward and backward), written from the formulas
of the upstream code (see tools/upstream_baselines.py for the files), never by calling `primal_jax`.

Every function works on one sequence and one head: q, k, v [N, p] (or [M, p]). Backward functions return the
vector-Jacobian product of sum(out * G) with the upstream's own backward rules (YOSO-E's surrogate derivative
of the collision probability, SOFT's -V^T G V^T through the Newton inverse).
"""

from __future__ import annotations

import math

import numpy as np

F64 = np.float64


# ============================================================================ Longformer


def longformer_allowed(n, valid, window, num_global, causal):
  """[N, N] bool: query i may attend key j (the dense form of the sliding window with global tokens)."""
  c, g = window // 2, min(num_global, n)
  i, j = np.arange(n)[:, None], np.arange(n)[None, :]
  real_key = valid[None, :].astype(bool)
  local = (np.abs(i - j) <= c) & (j >= g) | (j < g)
  allowed = np.where(i < g, True, local) & real_key
  if causal:
    allowed &= j <= i
  return allowed


def masked_softmax(scores, allowed):
  s = np.where(allowed, scores, -np.inf)
  top = np.max(s, axis=-1, keepdims=True)
  top = np.where(np.isfinite(top), top, 0.0)
  e = np.where(allowed, np.exp(s - top), 0.0)
  total = e.sum(-1, keepdims=True)
  return e / np.where(total > 0, total, 1.0)


def longformer_forward(q, k, v, valid, *, window, num_global, causal=False):
  """out [N, p]: softmax(q k^T / sqrt(p)) v over the allowed keys; padded queries output 0."""
  allowed = longformer_allowed(q.shape[0], valid, window, num_global, causal)
  weights = masked_softmax(q @ k.T / np.sqrt(q.shape[1]), allowed)
  return (weights @ v) * valid[:, None]


def longformer_backward(q, k, v, valid, grad, *, window, num_global, causal=False):
  """(dq, dk, dv) of sum(out * grad)."""
  scale = 1.0 / np.sqrt(q.shape[1])
  allowed = longformer_allowed(q.shape[0], valid, window, num_global, causal)
  weights = masked_softmax(q @ k.T * scale, allowed)
  grad = grad * valid[:, None]
  g_w = grad @ v.T
  g_s = weights * (g_w - np.sum(g_w * weights, axis=-1, keepdims=True))
  return g_s @ k * scale, g_s.T @ q * scale, weights.T @ grad


# ============================================================================ YOSO-E


def _unit(x, eps=1e-12):
  norm = np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)
  return x / norm, norm


def _unit_backward(x, grad, eps=1e-12):
  """VJP of x / max(|x|, eps)."""
  u, norm = _unit(x, eps)
  return (grad - u * np.sum(u * grad, axis=-1, keepdims=True)) / norm


def yoso_forward(q, k, v, q_valid, k_valid, *, tau):
  """normalize(E v), E_ij = (1 - arccos(q^_i . k^_j) / pi)^tau m_i m_j."""
  expectation = _yoso_expectation(q, k, q_valid, k_valid, tau)
  return _unit(expectation @ v)[0]


def _yoso_expectation(q, k, q_valid, k_valid, tau):
  cos = np.clip(_unit(q)[0] @ _unit(k)[0].T, -1.0, 1.0)
  return (1.0 - np.arccos(cos) / math.pi) ** tau * q_valid[:, None] * k_valid[None, :]


def yoso_backward(q, k, v, q_valid, k_valid, grad, *, tau):
  """(dq, dk, dv) with upstream's Cumulation.backward: dE/d(q^.k^) taken as tau / 2 E."""
  q_hat, k_hat = _unit(q)[0], _unit(k)[0]
  expectation = _yoso_expectation(q, k, q_valid, k_valid, tau)
  g_x = _unit_backward(expectation @ v, grad)
  weighted = (g_x @ v.T) * expectation
  g_qhat = weighted @ (tau / 2 * k_hat)
  g_khat = weighted.T @ (tau / 2 * q_hat)
  return _unit_backward(q, g_qhat), _unit_backward(k, g_khat), expectation.T @ g_x


# ============================================================================ SOFT


def gaussian(x, y):
  d2 = np.sum(x * x, -1)[:, None] + np.sum(y * y, -1)[None, :] - 2.0 * x @ y.T
  return np.exp(-d2 / 2.0)


def newton_inverse(s, iterations):
  """Upstream's newton_inv: V_0 = 0.9 * 2 / max row sum^2 * P, P = S + 0.01 I, V <- 2 V - V P V."""
  p = s + 0.01 * np.eye(s.shape[0])
  v = 0.9 * 2.0 / np.max(s.sum(-1)) ** 2 * p
  for _ in range(iterations):
    v = 2.0 * v - v @ p @ v
  return v


def segment_means(x, m):
  seg = np.arange(x.shape[0]) * m // x.shape[0]
  return np.stack([x[seg == a].mean(0) for a in range(m)])


def layer_norm_gelu(x, scale, bias, eps=1e-5):
  from math import erf

  mu = x.mean(-1, keepdims=True)
  y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * scale + bias
  return 0.5 * y * (1.0 + np.vectorize(erf)(y / np.sqrt(2.0)))


def soft_core(q, landmarks, v, iterations):
  """A Z (A^T v), A = K(q, l), Z = newton(K(l, l)); q already scaled, padded rows of v already zero."""
  a = gaussian(q, landmarks)
  return a @ newton_inverse(gaussian(landmarks, landmarks), iterations) @ (a.T @ v)


def soft_forward(q, v, valid, *, num_landmarks, iterations, norm=None, conv=None):
  """SOFT on raw queries q [N, p] (= keys): scale p^-1/4, zero padded rows, landmarks, core.

  Landmarks: segment means, or with `conv` [r, p, p] the sum over each block of r positions of q_t @ conv[t].
  """
  qs = q * q.shape[1] ** -0.25 * valid[:, None]
  if conv is None:
    landmarks = segment_means(qs, num_landmarks)
  else:
    r = conv.shape[0]
    landmarks = np.stack([sum(qs[a * r + t] @ conv[t] for t in range(r)) for a in range(qs.shape[0] // r)])
  if norm is not None:
    landmarks = layer_norm_gelu(landmarks, *norm)
  return soft_core(qs, landmarks, v * valid[:, None], iterations)


def soft_core_backward(q, landmarks, v, grad, iterations):
  """(dq, dlandmarks, dv) of sum(soft_core * grad) with upstream's Newton backward."""
  a = gaussian(q, landmarks)
  s = gaussian(landmarks, landmarks)
  z = newton_inverse(s, iterations)
  t = a.T @ v  # [m, p]
  g_a = grad @ (z @ t).T
  g_z = a.T @ grad @ t.T
  g_t = z.T @ a.T @ grad
  g_a = g_a + v @ g_t.T
  g_v = a @ g_t
  g_s = -(z.T @ g_z @ z.T)
  w_a = g_a * a  # d/dq_i of A_ia = A_ia (l_a - q_i)
  g_q = w_a @ landmarks - w_a.sum(1, keepdims=True) * q
  g_l = w_a.T @ q - w_a.sum(0)[:, None] * landmarks
  w_s = g_s * s
  w_sym = w_s + w_s.T  # S_ab depends on l_a and l_b alike
  g_l = g_l + w_sym @ landmarks - w_sym.sum(1, keepdims=True) * landmarks
  return g_q, g_l, g_v
