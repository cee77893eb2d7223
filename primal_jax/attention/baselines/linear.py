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

from primal_jax.attention.baselines.common import (
  BaselineAttention,
  causal_numerator,
  check_form,
  compute_dtype,
  decode_carry,
  zero_padded,
)

# Lower clamp of the normaliser (cosFormer's clamp_min; fast-transformers adds the same 1e-6 instead).
DENOMINATOR_EPS = 1e-6


def causal_kernelized(
  phi_q: jax.Array,
  phi_k: jax.Array,
  v: jax.Array,
  key_valid: jax.Array | None = None,
  carry: tuple[jax.Array, jax.Array] | None = None,
) -> tuple[jax.Array, jax.Array, tuple[jax.Array, jax.Array]]:
  """Prefix sums of causal kernelised attention, continuing from `carry` (decoding); the numerator chunked
  (`causal_numerator`).

  Args:
    phi_q: [B, H, T, f]; phi_k: [B, H, T, f]; v: [B, H, T, p] (compute dtype).
    key_valid: [B, T] bool or None (padded keys add nothing).
    carry: (S [B, H, f, p], z [B, H, f]) = sum_j phi_k_j v_j^T and sum_j phi_k_j over earlier positions.
  Returns:
    (numerator [B, H, T, p], normaliser [B, H, T], new carry) with the sums over j <= i.
  """
  phi_k, v = zero_padded(phi_k, key_valid), zero_padded(v, key_valid)
  num, kv = causal_numerator(phi_q, phi_k, v, None if carry is None else carry[0])  # chunked, [B, H, T, p]
  z = jnp.cumsum(phi_k, axis=2)  # [B, H, T, f]
  if carry is not None:
    z = z + carry[1][:, :, None]
  den = jnp.einsum("bhnf,bhnf->bhn", phi_q, z)
  return num, den, (kv, z[:, :, -1])


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
    causal: sum over j <= i only (chunked prefix sums, `causal_numerator`). Needs N == M.
    normalize: divide by the normaliser; False returns the numerator alone.
    eps: lower clamp of the normaliser (a row with no real key gives 0).
  Returns:
    [B, H, N, p] in the compute dtype (at least float32).
  """
  dt = compute_dtype(jnp.result_type(phi_q.dtype, phi_k.dtype, v.dtype))
  phi_q, phi_k, v = phi_q.astype(dt), phi_k.astype(dt), v.astype(dt)
  if causal:
    if phi_q.shape[2] != phi_k.shape[2]:
      raise ValueError(f"causal attention needs as many queries as keys, got {phi_q.shape[2]} and {phi_k.shape[2]}")
    num, den, _ = causal_kernelized(phi_q, phi_k, v, key_valid)
  else:
    phi_k, v = zero_padded(phi_k, key_valid), zero_padded(v, key_valid)
    kv = jnp.einsum("bhmf,bhmp->bhfp", phi_k, v)  # [B, H, f, p] = sum_j phi_k_j v_j^T
    num = jnp.einsum("bhnf,bhfp->bhnp", phi_q, kv)
    den = jnp.einsum("bhnf,bhf->bhn", phi_q, jnp.sum(phi_k, axis=2))
  if not normalize:
    return num
  return num / jnp.maximum(den, eps)[..., None]


def release_kernelized(phi_q: jax.Array, phi_k: jax.Array, v: jax.Array, key_valid: jax.Array | None) -> jax.Array:
  """The release's LRA `LinearAttention` / `CosAttention` core: Q' (K'^T V') / sqrt(N), no normaliser.

  The release scales Q' and K' by n^-1/4 each with n = Q.size(2), the (padded) sequence length N, not the
  head width; padded keys and values are zeroed (`K * mask`, `V * mask`); padded queries are not.
  """
  num = kernelized_attention(phi_q, phi_k, v, key_valid, normalize=False)
  return num / jnp.sqrt(jnp.asarray(phi_q.shape[2], num.dtype))


class KernelizedAttention(BaselineAttention):
  """Shared by the kernelised mechanisms with a prefix-sum causal form: `decode` from the running sums.

  Subclasses give `features(q, k, offset)` -> (phi_q, phi_k) (offset: the chunk's first position, for
  position-dependent features) and read `self.form`, `self.eps`.
  """

  supports_causal: ClassVar[bool] = True
  supports_decode: ClassVar[bool] = True
  kv_only_state: ClassVar[bool] = True  # sum_j phi(k_j) v_j^T and sum_j phi(k_j): per key/value head

  def features(self, q, k, offset):
    raise NotImplementedError

  def attend_heads(self, q, k, v, query_valid, key_valid):
    del query_valid
    if self.form == "release":
      phi_q, phi_k = self.features(q, k, 0)
      return release_kernelized(phi_q, phi_k, v, key_valid)
    if not self.decode:
      phi_q, phi_k = self.features(q, k, 0)
      return kernelized_attention(phi_q, phi_k, v, key_valid, causal=self.causal, eps=self.eps)
    dt = compute_dtype(q.dtype)
    b, h, _, p = q.shape
    f = self.num_features_of(p)
    state, store = decode_carry(
      self,
      {"kv": jnp.zeros((b, h, f, p), dt), "z": jnp.zeros((b, h, f), dt), "position": jnp.zeros((), jnp.int32)},
    )
    phi_q, phi_k = self.features(q, k, state["position"])
    num, den, (kv, z) = causal_kernelized(
      phi_q.astype(dt), phi_k.astype(dt), v.astype(dt), key_valid, (state["kv"], state["z"])
    )
    store({"kv": kv, "z": z, "position": state["position"] + q.shape[2]})
    return num / jnp.maximum(den, self.eps)[..., None]

  def num_features_of(self, head_dim: int) -> int:
    """f, the feature width for head width p."""
    return head_dim


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
  with S = sum_j phi(k_j) v_j^T, z = sum_j phi(k_j). normalize=False returns
  phi(q_i)^T S / sqrt(p), no normaliser. (The release's "linear" scales by
  1/sqrt(N) instead, N the sequence length: `LinearAttention(form="release")`.)

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


class LinearAttention(KernelizedAttention):
  """ "linear": Katharopoulos et al. linear attention, phi(x) = elu(x) + 1.

  Attributes:
    form: "paper" (default) or "release": the Primal-Attention release's LRA `LinearAttention`,
      phi(Q) (phi(K)^T V) / sqrt(N) with N the sequence length and no normaliser (non-causal only).
    normalize: paper form only: True (default) divides by phi(q)^T sum_j phi(k_j)
      (Katharopoulos et al.); False returns the numerator / sqrt(p).
    eps: lower clamp of the normaliser.
    The rest: see `BaselineAttention`; causal=True (prefix sums) and decode=True (the running sums
    sum_j phi(k_j) v_j^T and sum_j phi(k_j): constant-size state) are supported in the paper form.
  """

  form: str = "paper"
  normalize: bool = True
  eps: float = DENOMINATOR_EPS

  def validate(self):
    check_form(self.form, self.causal, "LinearAttention")
    if self.decode and not self.normalize:
      raise ValueError("LinearAttention: decode=True needs normalize=True")

  def features(self, q, k, offset):
    dt = compute_dtype(q.dtype)
    return elu_feature_map(q.astype(dt)), elu_feature_map(k.astype(dt))

  def attend_heads(self, q, k, v, query_valid, key_valid):
    if self.form == "paper" and not self.normalize:
      return linear_attention(q, k, v, key_valid, causal=self.causal, normalize=False, eps=self.eps)
    return super().attend_heads(q, k, v, query_valid, key_valid)
