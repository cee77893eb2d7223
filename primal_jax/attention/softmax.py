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
      `sow_weights`) or "dot_product_attention" (`jax.nn.dot_product_attention`,
      XLA's fused attention where the platform has one, e.g. cuDNN on GPU). The fused
      form masks keys with the dtype's most negative value instead of -1e6 (a row with
      every key masked differs) and has no hook for dropout on the weights, so it
      refuses `dropout_rate > 0` and `sow_weights`. Both decode.
    decode: incremental decoding with a key/value cache sized by the first
      (initialising) call's length, laid out [B * H, p, max_len] for the decode
      contraction (`_decode_attend`).
    The rest: see `AttentionShell`.
  """

  impl: str = "einsum"

  supports_decode: ClassVar[bool] = True

  def validate(self) -> None:
    check_choice(self.impl, IMPLS, "impl")
    if self.impl == "dot_product_attention" and self.dropout_rate > 0.0:
      raise ValueError(
        "impl='dot_product_attention' does not support dropout_rate > 0 (no hook for dropout on the fused "
        f"weights); got dropout_rate={self.dropout_rate}"
      )

  def attend(self, q, k, v, *, inputs_k, mask, deterministic, dropout_rng, sow_weights):
    """q [B, N, H, p], k/v [B, M, H, p] -> [B, N, H, p]; mask [B, M] key padding or [B, 1|H, N, M]."""
    del inputs_k
    batch, length, _, p = q.shape
    if self.decode:
      if mask is not None:
        raise ValueError("SoftmaxAttention decode takes no mask: the cache is causal; pad prompts on the right")
      return self._decode_attend(q, k, v, deterministic, dropout_rng, sow_weights)
    allowed = attention_bias_mask(mask, batch, length, k.shape[1], self.causal)
    if self.impl == "dot_product_attention":
      self._refuse_sowing(sow_weights)
      return jax.nn.dot_product_attention(q, k, v, mask=allowed)  # [B, N, H, p]
    weights = self._weights(jnp.einsum("bnhd,bmhd->bhnm", q, k), allowed, p, q.dtype)
    if sow_weights:
      self.sow("intermediates", "attention_weights", weights)
    self.sow_matrix("softmax", lambda: self._exact_weights(q, k, allowed), mask, batch, length)
    weights = self.apply_dropout(weights, deterministic, dropout_rng, (1,) if self.broadcast_dropout else ())
    return jnp.einsum("bhnm,bmhd->bnhd", weights, v)  # [B, N, H, p]

  def _refuse_sowing(self, sow_weights: bool) -> None:
    if sow_weights or (not self.is_initializing() and self.is_mutable_collection(SPECTRUM_COLLECTION)):
      raise ValueError("impl='dot_product_attention' forms no weights to sow; use impl='einsum'")

  @staticmethod
  def _weights(scores, allowed, p: int, dtype) -> jax.Array:
    """softmax(scores / sqrt(p) - 1e6 * (1 - allowed)) over the last axis, in at least float32, cast to `dtype`."""
    scores = scores / jnp.sqrt(jnp.asarray(p, scores.dtype))
    if allowed is not None:
      scores = scores - MASK_PENALTY * (1.0 - allowed.astype(scores.dtype))
    return jax.nn.softmax(scores.astype(jnp.promote_types(dtype, jnp.float32)), axis=-1).astype(dtype)

  @staticmethod
  def _exact_weights(q, k, allowed) -> jax.Array:
    """[B, H, N, M] the weights in float32 with exact products (for spectra, not the TF32 passes of accelerators)."""
    q, k = q.astype(jnp.float32), k.astype(jnp.float32)
    scores = jnp.einsum("bnhd,bmhd->bhnm", q, k, precision=jax.lax.Precision.HIGHEST) / jnp.sqrt(q.shape[-1] * 1.0)
    if allowed is not None:
      scores = scores - MASK_PENALTY * (1.0 - allowed.astype(scores.dtype))
    return jax.nn.softmax(scores, axis=-1)

  def _decode_attend(self, q, k, v, deterministic, dropout_rng, sow_weights):
    """A chunk of T queries [B, T, H, p] against the cache, after writing the chunk's keys and values into it.

    The cache is laid out for the decode contraction (`_decode_cache`): keys and values [B * H, p, max_len], so
    q K^T and p V are batched matrix-vector products whose long axis is the cache's contiguous minor one, with
    the one batch axis XLA's dot takes: each reads the cache once, in place. (A [B, max_len, H, p] cache made XLA
    transpose every layer's keys and values at every token; [B, H, ...] made it fuse the cache update into the
    reshape its dot needs and copy the whole cache; positions-major values made XLA:CPU's p V run at a tenth of
    the memory bandwidth.) The unfilled tail is masked on the [B, H, T, max_len] scores only. Under `jit` with
    the cache donated, the chunk's write (`dynamic_update_slice`) is in place.
    """
    batch, chunk, heads, p = q.shape
    cached_k, cached_v, allowed = self._decode_cache(k, v)  # [BH, p, L] x 2, [T, L]
    if self.impl == "dot_product_attention":
      self._refuse_sowing(sow_weights)
      # The layout jax.nn.dot_product_attention takes ([B, L, H, p]), as a transposed view of the cache.
      view = lambda c: jnp.transpose(c.reshape(batch, heads, p, -1), (0, 3, 1, 2))  # noqa: E731
      return jax.nn.dot_product_attention(q, view(cached_k), view(cached_v), mask=allowed[None, None])
    q3 = jnp.swapaxes(q, 1, 2).reshape(batch * heads, chunk, p)
    weights = self._weights(jnp.einsum("gtd,gdl->gtl", q3, cached_k), allowed, p, q.dtype)  # [BH, T, L]
    weights = weights.reshape(batch, heads, chunk, -1)
    if sow_weights:
      self.sow("intermediates", "attention_weights", weights)
    weights = self.apply_dropout(weights, deterministic, dropout_rng, (1,) if self.broadcast_dropout else ())
    out = jnp.einsum("gtl,gdl->gtd", weights.reshape(batch * heads, chunk, -1), cached_v)  # [BH, T, p]
    return jnp.swapaxes(out.reshape(batch, heads, chunk, p), 1, 2)  # [B, T, H, p]

  def _decode_cache(self, k, v):
    """Writes a chunk of T keys/values [B, T, H, p] at the cache index; returns the cache and the [T, L] mask.

    The cache ([B * H, p, max_len] keys and values, sequence-and-head major, positions contiguous) and its
    length are fixed by the initialising call, whose own chunk is the maximum length.
    """
    batch, chunk, heads, p = k.shape
    k, v = (jnp.transpose(x, (0, 2, 3, 1)).reshape(batch * heads, p, chunk) for x in (k, v))  # [BH, p, T]
    initialized = self.has_variable("cache", "cached_key")
    cached_k = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
    cached_v = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
    index = self.variable("cache", "index", lambda: jnp.array(0, jnp.int32))
    max_len = cached_k.value.shape[2]
    if not initialized:  # the initialising call attends over its own chunk; the cache it creates stays zero
      return k, v, jnp.tril(jnp.ones((chunk, chunk), bool))
    start = index.value
    cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k.astype(cached_k.value.dtype), (0, 0, start))
    cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v.astype(cached_v.value.dtype), (0, 0, start))
    index.value = start + chunk
    allowed = jnp.arange(max_len)[None, :] <= (start + jnp.arange(chunk))[:, None]  # [T, L]
    return cached_k.value, cached_v.value, allowed
