"""`GPT2Attention`: softmax attention with GPT-2's masking arithmetic (transformers 4.5.1 `Attention._attn`).

`SoftmaxAttention` subtracts 1e6 wherever a key is not allowed (causal or padding), the LRA release's
rule. GPT-2, and so the Decision Transformer of the RL release, instead REPLACES future scores by
-1e4 and then ADDS (1 - m_j) * -1e4 for padded keys. For a query with at least one real key at or
before it both give the same weights (exp(-1e4) is 0 in float32). They differ for a padded query
with no real key before it (left padding): GPT-2 then spreads it over its padded past AND its
future real keys. Those rows are garbage either way, but the release's causal Primal layer averages
every position into its running means (it ignores the mask), so they reach real outputs and the
KSVD loss; parity with the release needs the exact arithmetic, which this class reproduces. The
parameters are `SoftmaxAttention`'s (query/key/value/out), so checkpoints move between the two.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from primal_jax.attention.softmax import SoftmaxAttention

GPT2_MASK_VALUE = -1e4  # GPT-2's `masked_bias` and the additive key-mask value alike


class GPT2Attention(SoftmaxAttention):
  """w = q k^T / sqrt(p); w[i, j > i] = mask_value (causal); w += (1 - m_j) * mask_value; A = softmax(w).

  `mask` is a [B, M] key mask (1/True = real), as GPT-2's `attention_mask`, or a Flax attention mask
  [B, 1|H, N, M] whose zeros get the additive `mask_value`. Decoding and `impl="dot_product_attention"`
  take `SoftmaxAttention`'s path (no padding there, where both rules agree).

  Attributes:
    mask_value: the score written at future keys and added at padded keys (-1e4 in GPT-2).
  """

  mask_value: float = GPT2_MASK_VALUE

  def attend(self, q, k, v, *, inputs_k, mask, deterministic, dropout_rng, sow_weights):
    """q [B, N, H, p], k/v [B, M, H, p] -> [B, N, H, p]."""
    if self.decode or self.impl != "einsum" or self.flax_core:
      return super().attend(
        q, k, v, inputs_k=inputs_k, mask=mask, deterministic=deterministic, dropout_rng=dropout_rng,
        sow_weights=sow_weights,
      )  # fmt: skip
    k, v = self.repeat_kv(k), self.repeat_kv(v)
    batch, length, _, p = q.shape
    keys = k.shape[1]
    dtype = jnp.promote_types(q.dtype, jnp.float32)
    scores = jnp.einsum("bnhd,bmhd->bhnm", q, k).astype(dtype) / jnp.sqrt(jnp.asarray(p, dtype))  # [B, H, N, M]
    if self.causal:
      if length != keys:
        raise ValueError(f"causal attention needs as many queries as keys, got {length} and {keys}")
      scores = jnp.where(jnp.tril(jnp.ones((length, keys), bool)), scores, jnp.asarray(self.mask_value, dtype))
    if mask is not None:
      scores = scores + self._additive_mask(mask, batch, length, keys, dtype)
    weights = jax.nn.softmax(scores, axis=-1)
    if sow_weights:
      self.sow("intermediates", "attention_weights", weights)
    self.sow_matrix("softmax", lambda: weights, mask, batch, length)
    broadcast = (1,) if self.broadcast_dropout else ()
    weights = self.apply_dropout(weights.astype(q.dtype), deterministic, dropout_rng, broadcast)
    return jnp.einsum("bhnm,bmhd->bnhd", weights, v).astype(q.dtype)  # [B, N, H, p]

  def _additive_mask(self, mask, batch, length, keys, dtype) -> jax.Array:
    """(1 - m) * mask_value broadcastable to [B, H, N, M]."""
    shape = tuple(mask.shape)
    if shape == (batch, keys):
      m = mask.astype(dtype)[:, None, None, :]
    elif len(shape) == 4 and shape[0] in (1, batch) and shape[-2:] == (length, keys):
      m = mask.astype(bool).astype(dtype)
    else:
      raise ValueError(
        f"mask must have shape [batch, keys] = {(batch, keys)} or "
        f"[batch, 1 or heads, queries, keys] = {(batch, '1|H', length, keys)}, got {shape}"
      )
    return (1.0 - m) * jnp.asarray(self.mask_value, dtype)
