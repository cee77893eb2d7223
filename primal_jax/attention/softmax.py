"""`SoftmaxAttention`: the canonical multi-head attention baseline, on the shared attention shell.

Same parameter layout as `PrimalAttention` (query/key/value/out DenseGeneral
over heads), and the release's masking: scores minus 1e6 at masked keys, so the
two are interchangeable by name in one block.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp

from primal_jax.attention.shell import SPECTRUM_COLLECTION, AttentionShell
from primal_jax.masks import attention_bias_mask
from primal_jax.validation import check_choice

# The release subtracts 1e6 from masked scores rather than using -inf, so a row with every key
# masked stays finite (in float32 it stays close to the unmasked softmax, since s - 1e6 keeps s to
# ~1/16); such rows are zeroed by the models.
MASK_PENALTY = 1e6
IMPLS = ("einsum", "dot_product_attention")


class SoftmaxAttention(AttentionShell):
  """A = softmax(Q K^T / sqrt(p) - 1e6 * (1 - mask)); out = Linear(merge_heads(A V)).

  Attributes:
    impl: "einsum" (the N x M weights formed explicitly: dropout on them,
      `sow_weights`, decoding) or "dot_product_attention" (`jax.nn.dot_product_attention`,
      XLA's fused attention where the platform has one). The fused form masks keys
      with the dtype's most negative value instead of -1e6 (a row with every key
      masked differs) and has no hook for dropout on the weights, so it refuses
      `dropout_rate > 0`, `sow_weights` and `decode`.
    decode: incremental decoding with a key/value cache sized by the first
      (initialising) call's length.
    The rest: see `AttentionShell`.
  """

  impl: str = "einsum"

  supports_decode: ClassVar[bool] = True

  def validate(self) -> None:
    check_choice(self.impl, IMPLS, "impl")
    if self.impl == "dot_product_attention" and (self.decode or self.dropout_rate > 0.0):
      raise ValueError(
        "impl='dot_product_attention' supports neither decode nor dropout_rate > 0 (no hook for dropout on "
        f"the fused weights); got decode={self.decode}, dropout_rate={self.dropout_rate}"
      )

  def attend(self, q, k, v, *, inputs_k, mask, deterministic, dropout_rng, sow_weights):
    """q [B, N, H, p], k/v [B, M, H, p] -> [B, N, H, p]; mask [B, M] key padding or [B, 1|H, N, M]."""
    del inputs_k
    batch, length, _, p = q.shape
    dtype = q.dtype
    if self.decode:
      if mask is not None:
        raise ValueError("SoftmaxAttention decode takes no mask: the cache is causal; pad prompts on the right")
      k, v, allowed = self._decode_cache(k, v)
    else:
      allowed = attention_bias_mask(mask, batch, length, k.shape[1], self.causal)
    if self.impl == "dot_product_attention":
      if sow_weights or (not self.is_initializing() and self.is_mutable_collection(SPECTRUM_COLLECTION)):
        raise ValueError("impl='dot_product_attention' forms no weights to sow; use impl='einsum'")
      return jax.nn.dot_product_attention(q, k, v, mask=allowed)  # [B, N, H, p]
    scores = jnp.einsum("bnhd,bmhd->bhnm", q, k) / jnp.sqrt(jnp.asarray(p, dtype))
    if allowed is not None:
      scores = scores - MASK_PENALTY * (1.0 - allowed.astype(scores.dtype))
    weights = jax.nn.softmax(scores.astype(jnp.promote_types(dtype, jnp.float32)), axis=-1).astype(dtype)
    if sow_weights:
      self.sow("intermediates", "attention_weights", weights)
    self.sow_matrix("softmax", lambda: self._exact_weights(q, k, allowed), mask, batch, length)
    weights = self.apply_dropout(weights, deterministic, dropout_rng, (1,) if self.broadcast_dropout else ())
    return jnp.einsum("bhnm,bmhd->bnhd", weights, v)  # [B, N, H, p]

  @staticmethod
  def _exact_weights(q, k, allowed) -> jax.Array:
    """[B, H, N, M] the weights in float32 with exact products (for spectra, not the TF32 passes of accelerators)."""
    q, k = q.astype(jnp.float32), k.astype(jnp.float32)
    scores = jnp.einsum("bnhd,bmhd->bhnm", q, k, precision=jax.lax.Precision.HIGHEST) / jnp.sqrt(q.shape[-1] * 1.0)
    if allowed is not None:
      scores = scores - MASK_PENALTY * (1.0 - allowed.astype(scores.dtype))
    return jax.nn.softmax(scores, axis=-1)

  def _decode_cache(self, k, v):
    """Writes a chunk of T keys/values at the cache index; returns the full cache and its mask.

    The cache length is fixed by the initialising call ([B, max_len, H, p]).
    """
    initialized = self.has_variable("cache", "cached_key")
    cached_k = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
    cached_v = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
    index = self.variable("cache", "index", lambda: jnp.array(0, jnp.int32))
    if not initialized:
      return k, v, attention_bias_mask(None, k.shape[0], k.shape[1], k.shape[1], causal=True)
    batch, chunk = k.shape[:2]
    max_len = cached_k.value.shape[1]
    start = index.value
    cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k, (0, start, 0, 0))
    cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v, (0, start, 0, 0))
    index.value = start + chunk
    query_pos = start + jnp.arange(chunk)  # [T]
    allowed = jnp.arange(max_len)[None, :] <= query_pos[:, None]  # [T, max_len]
    allowed = jnp.broadcast_to(allowed[None, None], (batch, 1, chunk, max_len))
    return cached_k.value, cached_v.value, allowed
