"""Linformer attention (Wang et al., 2020): keys and values projected along the sequence axis.

  out = softmax(Q (E K)^T / sqrt(p)) (F V),  E, F: [k, L_max] learned per head,

so the score matrix is N x k. E and F have one column per position up to a
fixed maximum length; a sequence of M <= L_max positions uses the first M
columns, which is the same as zero-padding it to L_max.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from primal_jax.attention.baselines.common import BaselineAttention, check_form, compute_dtype, zero_padded
from primal_jax.validation import check_positive

# The Nystromformer LRA code's init of its projection: N(0, 0.02^2).
PROJECTION_STDDEV = 0.02


def linformer_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  key_projection: jax.Array,
  value_projection: jax.Array,
  key_valid: jax.Array | None = None,
) -> jax.Array:
  """softmax(Q (E K)^T / sqrt(p)) (F V) per head.

  Args:
    q: [B, H, N, p]; k, v: [B, H, M, p].
    key_projection: E [H, r, M]; value_projection: F [H, r, M] (r = linformer k).
    key_valid: [B, M] bool or None; padded keys and values are zeroed before
      the projection (the release's masking), so they add nothing to E K, F V.
  Returns:
    [B, H, N, p] in the compute dtype.
  """
  dt = compute_dtype(q.dtype)
  q, k, v = q.astype(dt), k.astype(dt), v.astype(dt)
  k, v = zero_padded(k, key_valid), zero_padded(v, key_valid)
  k_proj = jnp.einsum("hrm,bhmp->bhrp", key_projection.astype(dt), k)  # [B, H, r, p]
  v_proj = jnp.einsum("hrm,bhmp->bhrp", value_projection.astype(dt), v)  # [B, H, r, p]
  scores = jnp.einsum("bhnp,bhrp->bhnr", q, k_proj) / jnp.sqrt(jnp.asarray(q.shape[-1], dt))
  return jnp.einsum("bhnr,bhrp->bhnp", jax.nn.softmax(scores, axis=-1), v_proj)


class LinformerAttention(BaselineAttention):
  """ "linformer": learned sequence projections E (keys) and F (values) to `linformer_k` rows.

  Attributes:
    max_len: L_max, the longest key sequence (columns of E, F); required.
    linformer_k: r, rows of E and F (the release's "linformer-256").
    share_kv: one projection for keys and values (F = E), as the Nystromformer
      LRA code does; False (default) learns E and F separately.
    form: "paper" (default) or "release": the Primal-Attention release's `LinformerAttention`: one E for
      keys and values (share_kv is implied) and sequences exactly max_len long (its E is not sliced).
      The release also shares E across LAYERS (a class attribute); here each layer owns its E, so a
      converted release checkpoint holds the same E in every layer, and training unties them.
    The rest: see `BaselineAttention` (non-causal only).

  Parameters "E" (and "F") are [H, r, L_max] with logical axes ("heads", None, None).
  """

  max_len: int | None = None
  linformer_k: int = 256
  share_kv: bool = False
  form: str = "paper"

  def validate(self):
    check_form(self.form, self.causal, "LinformerAttention")
    if self.max_len is None:
      raise ValueError("LinformerAttention needs max_len (the fixed maximum key length of its projections)")
    check_positive(self.max_len, "max_len")
    check_positive(self.linformer_k, "linformer_k")

  def attend_heads(self, q, k, v, query_valid, key_valid):
    del query_valid
    length = k.shape[2]
    if length > self.max_len:
      raise ValueError(
        f"key length {length} exceeds max_len={self.max_len}: Linformer's projections E, F are "
        f"[heads, linformer_k, max_len]; raise max_len"
      )
    if self.form == "release" and length != self.max_len:
      raise ValueError(
        f"LinformerAttention(form='release') needs key length == max_len ({self.max_len}), got {length}: the "
        "release pads every input to max_seq_len"
      )
    init = self.logical(nn.initializers.normal(PROJECTION_STDDEV), ("heads", None, None))
    shape = (self.num_heads, self.linformer_k, self.max_len)
    e = self.param("E", init, shape, self.param_dtype)
    f = e if self.share_kv or self.form == "release" else self.param("F", init, shape, self.param_dtype)
    return linformer_attention(q, k, v, e[:, :, :length], f[:, :, :length], key_valid)
