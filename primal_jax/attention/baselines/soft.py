"""SOFT (Lu et al., 2021, "Softmax-free Transformer with Linear Complexity"): a Gaussian kernel, low rank.

SOFT replaces softmax(q k^T) by the Gaussian kernel exp(-norm(q_i - k_j)^2 / 2) with keys = queries (one
projection, scaled by p^-1/4), which is symmetric positive semi-definite, and approximates it by Nystrom
through m landmarks l (fudan-zvg/SOFT, `models/softmax_free_transformer.py` `SoftmaxFreeAttentionKernel`
and `SOFT/kernel/inverse.py`):

  A = exp(-norm(q_i - l_a)^2 / 2) [N, m],   S = exp(-norm(l_a - l_b)^2 / 2) [m, m],   out = A S^+ (A^T V),

with S^+ from Newton's iteration V <- 2 V - V P V on P = S + 0.01 I from V_0 = 0.9 * 2 / max_a(sum_b S_ab)^2 P,
and the upstream's backward through it, -V^T G V^T (as if V were the exact inverse of S). Landmarks: the
upstream's are a strided conv of the query grid followed by LayerNorm and GELU; here (1-D sequences) they
are by default the means of m contiguous segments (average pooling, i.e. that conv with the averaging
kernel, at linear cost for a fixed m) or, with `landmarks="conv"`, upstream's learned map of each block of
positions, each followed by the same LayerNorm and GELU (`landmark_norm=False` drops them).
"""

from __future__ import annotations

import functools
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import linen as nn

from primal_jax.attention.baselines.common import BaselineAttention, compute_dtype, zero_padded
from primal_jax.attention.baselines.nystromformer import segment_means
from primal_jax.initializers import linear_inits
from primal_jax.validation import check_choice, check_positive

# Upstream's Newton iteration: V_0 = NEWTON_INIT * 2 / max row sum^2 * P, P = S + NEWTON_RIDGE * I.
NEWTON_INIT = 0.9
NEWTON_RIDGE = 0.01
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default
LANDMARK_OPS = ("pool", "conv")


def gaussian_kernel(x: jax.Array, y: jax.Array) -> jax.Array:
  """exp(-norm(x_i - y_j)^2 / 2), computed as upstream: x^2 + y^2 - 2 x . y; [..., n, p], [..., m, p] -> [..., n, m]."""
  sq = jnp.sum(x * x, axis=-1)[..., :, None] + jnp.sum(y * y, axis=-1)[..., None, :]
  return jnp.exp(-(sq - 2.0 * jnp.einsum("...np,...mp->...nm", x, y)) / 2.0)


def _newton_iterate(mat: jax.Array, iterations: int) -> jax.Array:
  eye = jnp.eye(mat.shape[-1], dtype=mat.dtype)
  alpha = NEWTON_INIT * 2.0 / jnp.max(jnp.sum(mat, axis=-1), axis=-1) ** 2  # [...]
  p = mat + NEWTON_RIDGE * eye
  v = alpha[..., None, None] * p
  for _ in range(iterations):
    v = 2.0 * v - v @ p @ v
  return v


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def newton_inverse(mat: jax.Array, iterations: int = 20) -> jax.Array:
  """Upstream's `newton_inv` of [..., m, m] (converges to (S + 0.01 I)^-1), with its backward -V^T G V^T."""
  return _newton_iterate(mat, iterations)


def _newton_fwd(mat, iterations):
  inverse = _newton_iterate(mat, iterations)
  return inverse, inverse


def _newton_bwd(iterations, inverse, grad):
  del iterations
  t = jnp.swapaxes(inverse, -1, -2)
  return (-(t @ grad @ t),)


newton_inverse.defvjp(_newton_fwd, _newton_bwd)


def soft_attention(
  q: jax.Array,
  landmarks: jax.Array,
  v: jax.Array,
  key_valid: jax.Array | None = None,
  *,
  iterations: int = 20,
) -> jax.Array:
  """A S^+ (A^T V) with A = K(q, l), S = K(l, l), K the Gaussian kernel (q already scaled by p^-1/4).

  Args:
    q: [B, H, N, p] scaled queries (= keys).
    landmarks: [B, H, m, p].
    v: [B, H, N, p].
    key_valid: [B, N] bool or None; padded positions are no key (their values are zeroed).
    iterations: Newton iterations (upstream: 20).
  Returns:
    [B, H, N, p].
  """
  a = gaussian_kernel(q, landmarks)  # [B, H, N, m]
  s = gaussian_kernel(landmarks, landmarks)  # [B, H, m, m]
  summary = jnp.einsum("bhnm,bhnp->bhmp", a, zero_padded(v, key_valid))  # A^T V [B, H, m, p]
  return (a @ newton_inverse(s, iterations)) @ summary


class SoftAttention(BaselineAttention):
  """ "soft": softmax-free Gaussian-kernel attention with Nystrom landmarks and a Newton pseudo-inverse.

  Attributes:
    landmarks: how landmarks are made from the (scaled, padding-zeroed) queries: "pool" (default), the
      means of `num_landmarks` contiguous segments (Nystromformer's segments: any N >= m, linear cost);
      "conv", upstream's learned operator in 1-D: each block of `conv_block` consecutive positions mapped
      by a learned [conv_block, p, p] kernel (parameter "landmark_conv", shared by the heads, no bias), so
      m = N / conv_block (N must be a multiple).
    num_landmarks: m of "pool".
    conv_block: positions per landmark of "conv" (upstream's strided Conv2d of ratio r on an H x W grid is
      this with conv_block = r^2 on the grid in block-major order).
    landmark_norm: LayerNorm(p) then GELU on the landmarks, as upstream applies after its conv
      (parameters "landmark_norm" scale/bias [p], shared by the heads); False = none.
    newton_iterations: iterations of the pseudo-inverse (upstream's `max_iter`, 20).
    The rest: see `BaselineAttention` (non-causal only).

  Keys are the queries (upstream's K = Q): there is no key projection. Self-attention only. Masks:
  upstream has none; a padding mask is honoured here (padded queries are zeroed before the landmark
  means, as Nystromformer's LRA code does, and padded keys add nothing to A^T V); other masks are refused.
  """

  landmarks: str = "pool"
  num_landmarks: int = 64
  conv_block: int = 4
  landmark_norm: bool = True
  newton_iterations: int = 20

  projections: ClassVar[tuple[str, ...]] = ("query", "value")
  self_attention_only: ClassVar[bool] = True
  supports_kv_groups: ClassVar[bool] = False
  kv_groups_refusal: ClassVar[str] = (
    "its keys are its queries (the Gaussian kernel of one projection), so it has one key head per query head"
  )

  def validate(self) -> None:
    check_choice(self.landmarks, LANDMARK_OPS, "landmarks")
    check_positive(self.num_landmarks, "num_landmarks")
    check_positive(self.conv_block, "conv_block")
    check_positive(self.newton_iterations, "newton_iterations")
    if not isinstance(self.landmark_norm, bool):
      raise ValueError(f"landmark_norm must be a bool, got {self.landmark_norm!r}")

  def attend(self, q, k, v, **kwargs):
    """Keys are the queries (k is None: no key projection)."""
    del k
    return super().attend(q, q, v, **kwargs)

  def attend_heads(self, q, k, v, query_valid, key_valid):
    del k, query_valid  # keys = queries; self-attention: the key padding is the query padding
    dt = compute_dtype(q.dtype)
    q = zero_padded(q.astype(dt) * jnp.asarray(q.shape[-1] ** -0.25, dt), key_valid)
    landmarks = self._conv_landmarks(q) if self.landmarks == "conv" else self._pooled_landmarks(q)  # [B, H, m, p]
    if self.landmark_norm:
      norm = nn.LayerNorm(
        epsilon=LAYER_NORM_EPS, dtype=dt, param_dtype=self.param_dtype, name="landmark_norm",
        scale_init=self.logical(nn.initializers.ones, ("kv",)),
        bias_init=self.logical(nn.initializers.zeros, ("kv",)),
      )  # fmt: skip
      landmarks = jax.nn.gelu(norm(landmarks), approximate=False)
    return soft_attention(q, landmarks, v.astype(dt), key_valid, iterations=self.newton_iterations)

  def _pooled_landmarks(self, q):
    length = q.shape[2]
    if self.num_landmarks > length:
      raise ValueError(f"num_landmarks ({self.num_landmarks}) must be <= the sequence length ({length})")
    return segment_means(q, self.num_landmarks)

  def _conv_landmarks(self, q):
    batch, heads, length, p = q.shape
    r = self.conv_block
    if length % r:
      raise ValueError(f"landmarks='conv' needs a sequence length divisible by conv_block={r}, got {length}")
    init, _ = linear_inits(self.init_style, r * p)  # Conv2d's fan-in: p channels x its r x r window
    kernel = self.param("landmark_conv", self.logical(init, (None, "kv", "kv")), (r, p, p), self.param_dtype).astype(
      q.dtype
    )
    return jnp.einsum("bhmtp,tpo->bhmo", q.reshape(batch, heads, length // r, r, p), kernel)
