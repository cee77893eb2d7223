"""Nystromformer attention (Xiong et al., 2021): softmax attention from m landmarks.

With q, k scaled by p^-1/4 each and landmarks q~, k~ (means of m contiguous
segments), softmax(Q K^T) V ~ F~ A~^+ B~ V, where

  F~ = softmax(Q K~^T) [N, m],  A~ = softmax(Q~ K~^T) [m, m],  B~ = softmax(Q~ K^T) [m, M].

The Nystrom identity: if the landmarks are the points themselves (m = N = M)
then F~ = A~ = the full softmax matrix S and F~ A~^+ B~ = S S^+ B~ = B~, i.e.
exact softmax attention (when S is invertible). A~^+ comes from the iterative
Moore-Penrose method (6 iterations in the paper) or, for tests, `jnp.linalg.pinv`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from primal_jax.attention.baselines.common import BaselineAttention, check_form, compute_dtype, zero_padded
from primal_jax.initializers import linear_inits
from primal_jax.validation import check_choice, check_positive

PINV_METHODS = ("iterative", "exact")
PINV_SCALES = ("matrix", "batch", "release")
# The Nystromformer LRA code's penalty at padded keys (SoftmaxAttention uses 1e6).
NYSTROM_MASK_PENALTY = 1e9


def segment_means(x: jax.Array, num_segments: int) -> jax.Array:
  """Means of m contiguous segments along axis -2: [..., L, p] -> [..., m, p].

  Position i belongs to segment floor(i m / L); with L divisible by m these are
  the release's segments of L / m positions. Every segment is non-empty for m <= L.
  """
  length = x.shape[-2]
  if num_segments > length:
    raise ValueError(f"num_landmarks ({num_segments}) must be <= the sequence length ({length})")
  segment = (jnp.arange(length) * num_segments) // length  # [L]
  onehot = (segment[None, :] == jnp.arange(num_segments)[:, None]).astype(x.dtype)  # [m, L]
  weights = onehot / jnp.sum(onehot, axis=-1, keepdims=True)
  return jnp.einsum("ml,...lp->...mp", weights, x)


def iterative_pinv(a: jax.Array, iterations: int = 6, scale: str = "matrix") -> jax.Array:
  """Moore-Penrose pseudo-inverse of [..., m, m] by the Nystromformer iteration.

  Z_0 = A^T / (||A||_1 ||A||_inf); Z_{t+1} = Z_t (13 I - A Z_t (15 I - A Z_t (7 I - A Z_t))) / 4,
  which converges to A^+ (third order). For a row-stochastic A, ||A||_inf = 1.

  Args:
    a: [..., m, m].
    iterations: number of updates (the paper: 6).
    scale: "matrix" takes the norms per matrix; "batch" takes their maxima over
      all leading axes; "release" is the release's init, Z_0 = A^T / max(column sums)
      with ONE max over all leading axes and no row-sum factor (it couples the
      sequences of a batch; for a row-stochastic A it equals "batch" up to rounding).
  Returns:
    [..., m, m].
  """
  check_choice(scale, PINV_SCALES, "scale")
  m = a.shape[-1]
  eye = jnp.eye(m, dtype=a.dtype)
  col = jnp.max(jnp.sum(jnp.abs(a), axis=-2), axis=-1)  # ||A||_1 = max column sum, [...]
  row = jnp.max(jnp.sum(jnp.abs(a), axis=-1), axis=-1)  # ||A||_inf = max row sum, [...]
  if scale == "batch":
    col, row = jnp.max(col), jnp.max(row)
  if scale == "release":
    col, row = jnp.max(jnp.sum(a, axis=-2)), jnp.ones((), a.dtype)
  z = jnp.swapaxes(a, -1, -2) / (col * row)[..., None, None]
  for _ in range(iterations):
    az = a @ z
    z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
  return z


def nystrom_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  query_valid: jax.Array | None = None,
  key_valid: jax.Array | None = None,
  *,
  num_landmarks: int,
  pinv: str = "iterative",
  pinv_iterations: int = 6,
  pinv_scale: str = "matrix",
) -> jax.Array:
  """F~ A~^+ (B~ V), the Nystrom approximation of softmax(q k^T / sqrt(p)) v.

  Padding (the release's): padded queries and keys are zeroed before the
  landmark means (so they count as zeros there) and padded keys get -1e9 in B~.

  Args:
    q: [B, H, N, p]; k, v: [B, H, M, p].
    query_valid: [B, N] bool or None; key_valid: [B, M] bool or None.
    num_landmarks: m <= min(N, M).
    pinv: "iterative" (when m == N == M it returns the exact masked softmax
      attention, as the release short-cuts) or "exact" (`jnp.linalg.pinv`,
      always through the Nystrom formula).
    pinv_iterations, pinv_scale: see `iterative_pinv`.
  Returns:
    [B, H, N, p] in the compute dtype.
  """
  check_choice(pinv, PINV_METHODS, "pinv")
  check_positive(num_landmarks, "num_landmarks")
  dt = compute_dtype(q.dtype)
  scale = jnp.asarray(q.shape[-1] ** -0.25, dt)  # p^-1/4 on each side: q k^T / sqrt(p)
  q = zero_padded(q.astype(dt) * scale, query_valid)
  k = zero_padded(k.astype(dt) * scale, key_valid)
  v = v.astype(dt)
  penalty = 0.0 if key_valid is None else NYSTROM_MASK_PENALTY * (1.0 - key_valid[:, None, None, :].astype(dt))
  n_q, n_k = q.shape[2], k.shape[2]
  if pinv == "iterative" and num_landmarks == n_q == n_k:
    weights = jax.nn.softmax(jnp.einsum("bhnp,bhmp->bhnm", q, k) - penalty, axis=-1)
    return jnp.einsum("bhnm,bhmp->bhnp", weights, v)
  if num_landmarks > min(n_q, n_k):
    raise ValueError(f"num_landmarks ({num_landmarks}) must be <= the query and key lengths ({n_q}, {n_k})")
  q_land, k_land = segment_means(q, num_landmarks), segment_means(k, num_landmarks)  # [B, H, m, p]
  kernel_1 = jax.nn.softmax(jnp.einsum("bhnp,bhmp->bhnm", q, k_land), axis=-1)  # F~ [B, H, N, m]
  kernel_2 = jax.nn.softmax(jnp.einsum("bhlp,bhmp->bhlm", q_land, k_land), axis=-1)  # A~ [B, H, m, m]
  kernel_3 = jax.nn.softmax(jnp.einsum("bhlp,bhmp->bhlm", q_land, k) - penalty, axis=-1)  # B~ [B, H, m, M]
  if pinv == "exact":
    inverse = jnp.linalg.pinv(kernel_2)
  else:
    inverse = iterative_pinv(kernel_2, pinv_iterations, pinv_scale)
  return (kernel_1 @ inverse) @ (kernel_3 @ v)


def depthwise_sequence_conv(v: jax.Array, kernel: jax.Array) -> jax.Array:
  """Per-head convolution along the sequence, the same taps for all p channels of a head.

  PyTorch's Conv2d(H, H, (K, 1), padding=(K // 2, 0), groups=H, bias=False) on
  [B, H, L, p] (a cross-correlation with zero padding).

  Args:
    v: [B, H, L, p].
    kernel: [K, H] taps, K odd.
  Returns:
    [B, H, L, p].
  """
  size, heads = kernel.shape
  b, _, length, p = v.shape
  # As a 1-D depthwise conv with the heads as channels and the p channels of a head as batch: the same sums
  # as the [B, H, L, p] NCHW form (bit-identical on XLA:CPU), which XLA:CPU runs far slower: the LRA step went
  # from 0.56x softmax's to 0.26x at N = 2,048 (docs/benchmarks.md, "Nystromformer's convolution").
  x = jnp.transpose(v, (0, 3, 2, 1)).reshape(b * p, length, heads)  # [B p, L, H] (NWC)
  y = jax.lax.conv_general_dilated(
    x,
    kernel[:, None, :].astype(v.dtype),  # [K, 1, H] (WIO)
    window_strides=(1,),
    padding=((size // 2, size // 2),),
    dimension_numbers=("NWC", "WIO", "NWC"),
    feature_group_count=heads,
  )
  return jnp.transpose(y.reshape(b, p, length, heads), (0, 3, 2, 1))


class NystromAttention(BaselineAttention):
  """ "nystromformer": Nystrom landmarks with an iterative pseudo-inverse, plus a conv residual on values.

  Attributes:
    num_landmarks: m, landmarks by segment means (the release runs nystrom-32/64/128/256;
      its time/memory benchmark uses 64).
    conv_kernel_size: K of the depthwise conv residual on the (padding-zeroed)
      values, one K-tap kernel per head; 0 = off. The release uses 35. Odd.
    pinv: "iterative" (the paper) or "exact" (`jnp.linalg.pinv`; tests).
    pinv_iterations: iterations of the pseudo-inverse (the paper: 6).
    pinv_scale: "matrix" (default; ||A||_1 per sequence and head), "batch" (the maxima of both norms
      over the whole batch) or "release" (see `iterative_pinv`).
    form: "paper" (default) or "release": the Primal-Attention release's `NystromAttention`: the pinv
      init from one max of column sums over the whole batch (pinv_scale="release" implied; the other
      sequences of the batch change a sequence's output, ~1e-4), pinv="iterative", and the sequence
      length a multiple of num_landmarks (its segment reshape). The first kernel is unmasked and the
      padded queries and keys are zeroed in both forms, as the release does.
    The rest: see `BaselineAttention` (non-causal only).

  Parameter "conv" is [K, H] with logical axes (None, "heads").
  """

  num_landmarks: int = 64
  conv_kernel_size: int = 35
  pinv: str = "iterative"
  pinv_iterations: int = 6
  pinv_scale: str = "matrix"
  form: str = "paper"

  def validate(self):
    check_form(self.form, self.causal, "NystromAttention")
    if self.form == "release" and (self.pinv != "iterative" or self.pinv_scale not in ("matrix", "release")):
      raise ValueError(
        f"NystromAttention(form='release') uses the release's iterative pinv and its init; got pinv={self.pinv!r}, "
        f"pinv_scale={self.pinv_scale!r}"
      )
    check_positive(self.num_landmarks, "num_landmarks")
    check_positive(self.pinv_iterations, "pinv_iterations")
    check_choice(self.pinv, PINV_METHODS, "pinv")
    check_choice(self.pinv_scale, PINV_SCALES, "pinv_scale")
    size = self.conv_kernel_size
    if not isinstance(size, int) or isinstance(size, bool) or size < 0 or (size > 0 and size % 2 == 0):
      raise ValueError(f"conv_kernel_size must be 0 (off) or an odd integer >= 1, got {size!r}")

  def attend_heads(self, q, k, v, query_valid, key_valid):
    release = self.form == "release"
    if release and (q.shape[2] % self.num_landmarks or k.shape[2] != q.shape[2]):
      raise ValueError(
        f"NystromAttention(form='release') needs self-attention over a length divisible by num_landmarks "
        f"({self.num_landmarks}), got {q.shape[2]} queries and {k.shape[2]} keys"
      )
    out = nystrom_attention(
      q,
      k,
      v,
      query_valid,
      key_valid,
      num_landmarks=self.num_landmarks,
      pinv=self.pinv,
      pinv_iterations=self.pinv_iterations,
      pinv_scale="release" if release else self.pinv_scale,
    )
    if self.conv_kernel_size == 0:
      return out
    if q.shape[2] != k.shape[2]:
      raise ValueError(
        f"the conv residual (conv_kernel_size={self.conv_kernel_size}) needs as many queries as keys, "
        f"got {q.shape[2]} and {k.shape[2]}; set conv_kernel_size=0 for cross-attention"
      )
    # Fan-in of each tap kernel is K (one input channel per group), as PyTorch's Conv2d init.
    init, _ = linear_inits(self.init_style, self.conv_kernel_size)
    kernel = self.param(
      "conv",
      self.logical(init, (None, "heads")),
      (self.conv_kernel_size, self.num_heads),
      self.param_dtype,
    )
    values = zero_padded(v.astype(out.dtype), key_valid)
    return out + depthwise_sequence_conv(values, kernel.astype(out.dtype))
