"""Independent float64 NumPy implementations of the Primal-Attention math (SPEC sections 1-5).

Written from SPEC.md and the paper, never by calling `primal_jax`: the tests
compare the library against these. Loops over batch, heads and positions are
deliberate; they keep each formula literal at the small shapes the tests use.
"""

from __future__ import annotations

import numpy as np

F64 = np.float64
COSINE_EPS = 1e-12
MASK_PENALTY = 1e6


def rel_err(actual, expected) -> float:
  """max|actual - expected| / max|expected| (the README's metric)."""
  actual = np.asarray(actual, F64)
  expected = np.asarray(expected, F64)
  scale = np.max(np.abs(expected))
  return float(np.max(np.abs(actual - expected)) / (scale if scale > 0 else 1.0))


def assert_rel_close(actual, expected, tol=1e-5, what=""):
  """Asserts the README metric is below `tol` (shapes must match exactly)."""
  actual = np.asarray(actual)
  expected = np.asarray(expected)
  assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
  assert np.all(np.isfinite(actual)), f"{what}: non-finite values"
  err = rel_err(actual, expected)
  assert err < tol, f"{what}: relative error {err:.3e} >= {tol:.1e}"


# ----------------------------------------------------------------------------- feature maps


def cosine(z):
  """PyTorch F.normalize: z / max(||z||_2, 1e-12) over the last axis."""
  z = np.asarray(z, F64)
  norm = np.sqrt(np.sum(z * z, axis=-1, keepdims=True))
  return z / np.maximum(norm, COSINE_EPS)


def softmax_features(z, w):
  """Remark 4.1: g(z) = exp(w_i^T z - ||z||^2 / 2) / sqrt(m), w: [m, d]."""
  z = np.asarray(z, F64)
  w = np.asarray(w, F64)
  m = w.shape[0]
  out = np.empty(z.shape[:-1] + (m,), F64)
  for idx in np.ndindex(*z.shape[:-1]):
    v = z[idx]
    out[idx] = np.array([np.exp(w[i] @ v - 0.5 * (v @ v)) for i in range(m)]) / np.sqrt(m)
  return out


def softmax_normalizer(phi_q, phi_k, valid=None, causal=False):
  """D_ii = phi_q(x_i)^T sum_j phi_k(x_j) over real keys j (j <= i if causal); 1 if there is none."""
  phi_q = np.asarray(phi_q, F64)
  phi_k = np.asarray(phi_k, F64)
  n = phi_q.shape[0]
  w = np.ones(n) if valid is None else np.asarray(valid, F64)
  d = np.empty(n, F64)
  for i in range(n):
    stop = i + 1 if causal else n
    key_sum = sum(w[j] * phi_k[j] for j in range(stop))
    d[i] = phi_q[i] @ key_sum
    if d[i] == 0:  # no real key yet (leading padding): the library's convention D = 1
      d[i] = 1.0
  return d


# ----------------------------------------------------------------------------- sampling


def torch_int_linspace(length: int, num: int) -> np.ndarray:
  """torch.linspace(0, length-1, num, dtype=int64), scalar path of ATen's CPU kernel.

  step = (end - start) / (num - 1) in double; idx < num // 2: start + step*idx,
  else end - step*(num - idx - 1); cast to int64 truncates toward zero.
  """
  if num == 1:
    return np.zeros(1, np.int64)
  end = float(length - 1)
  step = end / float(num - 1)
  halfway = num // 2
  out = []
  for idx in range(num):
    value = step * idx if idx < halfway else end - step * (num - idx - 1)
    out.append(int(value))  # Python int() of a float truncates toward zero
  return np.array(out, np.int64)


def floor_linspace(length: int, num: int) -> np.ndarray:
  """floor(i * (N-1) / (n-1)) in exact integer arithmetic (NOT the release rule)."""
  if num == 1:
    return np.zeros(1, np.int64)
  return np.array([i * (length - 1) // (num - 1) for i in range(num)], np.int64)


def padding_aware(valid, num: int) -> np.ndarray:
  """Per sequence: the release rule applied to the list of real positions."""
  valid = np.asarray(valid, bool)
  out = np.zeros((valid.shape[0], num), np.int64)
  for b in range(valid.shape[0]):
    real = np.flatnonzero(valid[b])
    if len(real) == 0:
      continue  # documented fallback: position 0
    out[b] = real[torch_int_linspace(len(real), num)]
  return out


# ----------------------------------------------------------------------------- scores


def running_mean(z, valid=None):
  """z_i <- mean of z_j over j <= i (real j only if `valid`); [N, p] -> [N, p]."""
  z = np.asarray(z, F64)
  n = z.shape[0]
  w = np.ones(n) if valid is None else np.asarray(valid, F64)
  out = np.zeros_like(z)
  for i in range(n):
    total = sum((w[j] * z[j] for j in range(i + 1)), np.zeros(z.shape[1:]))
    count = sum(w[: i + 1])
    out[i] = total / max(count, 1.0)
  return out


# ----------------------------------------------------------------------------- KSVD objective


def layer_j(escore, rscore, lam, we, wr, we_x, wr_x, *, convention, trace, reduction, valid=None):
  """One layer's J in any (convention, trace, reduction): [B] per sample or a scalar for "batch".

  escore, rscore [B, H, N, s]; lam [H, s]; we, wr [H, a, s]; we_x, wr_x [B, H, p, s].
  """
  escore, rscore = np.asarray(escore, F64), np.asarray(rscore, F64)
  lam, we, wr = np.asarray(lam, F64), np.asarray(we, F64), np.asarray(wr, F64)
  we_x, wr_x = np.asarray(we_x, F64), np.asarray(wr_x, F64)
  b_size, h_size, n_pos, _ = escore.shape
  w = np.ones((b_size, n_pos)) if valid is None else np.asarray(valid, F64)
  trace_params = np.array([np.trace(we[h].T @ wr[h]) for h in range(h_size)])  # [H]
  trace_data = np.array([[np.trace(we_x[b, h].T @ wr_x[b, h]) for h in range(h_size)] for b in range(b_size)])

  def quad(x, b, h):  # sum over real positions of the convention's quadratic form
    if convention == "paper":
      return sum(w[b, i] * x[b, h, i] @ np.diag(lam[h]) @ x[b, h, i] for i in range(n_pos))
    return sum(w[b, i] * np.sum((x[b, h, i] * lam[h]) ** 2) for i in range(n_pos))

  if reduction == "per_sample":
    out = np.zeros(b_size)
    for b in range(b_size):
      per_head = []
      for h in range(h_size):
        qe, qr = quad(escore, b, h), quad(rscore, b, h)
        if convention == "release":
          qe, qr = qe / w[b].sum(), qr / w[b].sum()
        tr = trace_params[h] if trace == "params" else trace_data[b, h]
        per_head.append(0.5 * qe + 0.5 * qr - tr)
      out[b] = np.mean(per_head)
    return out
  # "batch": one J from means over the batch (LRA); quadratic terms per head.
  per_head = []
  for h in range(h_size):
    qe = sum(quad(escore, b, h) for b in range(b_size))
    qr = sum(quad(rscore, b, h) for b in range(b_size))
    if convention == "release":
      qe, qr = qe / w.sum(), qr / w.sum()  # mean over (b, i) of real positions
    else:
      qe, qr = qe / b_size, qr / b_size  # mean over b of the per-sequence sums
    tr = trace_params[h] if trace == "params" else np.mean(trace_data[:, h])
    per_head.append(0.5 * qe + 0.5 * qr - tr)
  return np.float64(np.mean(per_head))


# ----------------------------------------------------------------------------- full layers


def to_f64(tree):
  """A nested dict of arrays as float64 NumPy arrays."""
  return {k: to_f64(v) if isinstance(v, dict) else np.asarray(v, F64) for k, v in tree.items()}


def primal_layer(
  params,
  x,
  x_k=None,
  *,
  num_heads,
  low_rank,
  num_samples=None,
  causal=False,
  feature_map="cosine",
  projection=None,
  padding=None,
  sampling="release",
  mask_outputs=True,
):
  """Primal-Attention forward (SPEC 1-4) from a Flax-layout params dict of NumPy arrays.

  params: query/key {kernel [D, H, p], bias [H, p]}, We/Wr [H, a, s], Lambda [H, s],
  combine {kernel [2s, p], bias [p]}, out {kernel [H, p, D], bias [D]}.
  x_k (default x) feeds the keys and the sampled rows F_X.
  Returns out [B, N, D_out], escore/rscore [B, H, N, s], we_x/wr_x [B, H, p, s].
  """
  x = np.asarray(x, F64)
  x_k = x if x_k is None else np.asarray(x_k, F64)
  p64 = to_f64(params)
  b_size, n_pos, _ = x.shape
  h_size, s = num_heads, low_rank
  p = p64["query"]["kernel"].shape[-1]
  aware = sampling == "padding_aware" and padding is not None
  valid = np.asarray(padding, F64) if aware else None
  escore = np.zeros((b_size, h_size, n_pos, s))
  rscore = np.zeros((b_size, h_size, n_pos, s))
  we_x = np.zeros((b_size, h_size, p, s))
  wr_x = np.zeros((b_size, h_size, p, s))
  heads_out = np.zeros((b_size, n_pos, h_size, p))
  wc, bc = p64["combine"]["kernel"], p64["combine"]["bias"]
  for b in range(b_size):
    if num_samples is not None:
      idx = padding_aware(padding, num_samples)[b] if aware else torch_int_linspace(n_pos, num_samples)
    for h in range(h_size):
      q = x[b] @ p64["query"]["kernel"][:, h, :] + p64["query"]["bias"][h]  # [N, p]
      k = x_k[b] @ p64["key"]["kernel"][:, h, :] + p64["key"]["bias"][h]
      v_b = None if valid is None else valid[b]
      if causal:
        q, k = running_mean(q, v_b), running_mean(k, v_b)
      if feature_map == "cosine":
        phi_q, phi_k = cosine(q), cosine(k)
      else:
        phi_q, phi_k = softmax_features(q, projection), softmax_features(k, projection)
      if num_samples is None:
        w_e, w_r = p64["We"][h], p64["Wr"][h]
      else:
        rows = x_k[b, idx, h * p : (h + 1) * p]  # F_X: [n, p]
        w_e, w_r = rows.T @ p64["We"][h], rows.T @ p64["Wr"][h]
      e, r = phi_q @ w_e, phi_k @ w_r
      if feature_map == "softmax_kernel":
        d = softmax_normalizer(phi_q, phi_k, v_b, causal)
        e, r = e / np.sqrt(d)[:, None], r / np.sqrt(d)[:, None]
      escore[b, h], rscore[b, h], we_x[b, h], wr_x[b, h] = e, r, w_e, w_r
      o = np.concatenate([e, r], axis=-1) @ wc + bc  # [N, p]: escore feeds the first s inputs
      if padding is not None and mask_outputs:
        o = o * np.asarray(padding, F64)[b][:, None]
      heads_out[b, :, h] = o
  out = np.einsum("bnhp,hpd->bnd", heads_out, p64["out"]["kernel"]) + p64["out"]["bias"]
  return out, escore, rscore, we_x, wr_x


def softmax_attention(params, xq, xkv, *, num_heads, allowed=None):
  """A = softmax(Q K^T / sqrt(p) - 1e6 (1 - allowed)); out = merge(A V) W_o + b_o.

  allowed: [B, 1, N, M] bool or None.
  """
  xq, xkv = np.asarray(xq, F64), np.asarray(xkv, F64)
  p64 = to_f64(params)
  b_size, n_pos, _ = xq.shape
  p = p64["query"]["kernel"].shape[-1]
  heads_out = np.zeros((b_size, n_pos, num_heads, p))
  for b in range(b_size):
    for h in range(num_heads):
      q = xq[b] @ p64["query"]["kernel"][:, h] + p64["query"]["bias"][h]
      k = xkv[b] @ p64["key"]["kernel"][:, h] + p64["key"]["bias"][h]
      v = xkv[b] @ p64["value"]["kernel"][:, h] + p64["value"]["bias"][h]
      scores = q @ k.T / np.sqrt(p)
      if allowed is not None:
        scores = scores - MASK_PENALTY * (1.0 - np.asarray(allowed, F64)[b, 0])
      scores = scores - scores.max(axis=-1, keepdims=True)
      a = np.exp(scores)
      a = a / a.sum(axis=-1, keepdims=True)
      heads_out[b, :, h] = a @ v
  return np.einsum("bnhp,hpd->bnd", heads_out, p64["out"]["kernel"]) + p64["out"]["bias"]
