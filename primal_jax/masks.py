"""Masks in the forms users pass them, reduced to what each attention needs.

Primal-Attention has no N x N score matrix, so it needs a per-position padding
vector. It accepts either that vector ([B, N]) or the Flax attention mask
([B, 1 or H, N, N], as built by `nn.make_attention_mask`), from which a position
counts as real iff it may attend to itself (the diagonal). That rule holds for
padding masks and for padding combined with a causal mask.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def padding_from_mask(mask: jax.Array | None, batch: int, length: int) -> jax.Array | None:
  """[B, N] bool (True = real position) from a padding or attention mask, or None."""
  if mask is None:
    return None
  shape = tuple(mask.shape)
  if shape == (batch, length):
    return mask.astype(bool)
  if len(shape) == 4 and shape[0] in (1, batch) and shape[2:] == (length, length):
    diag = jnp.diagonal(mask.astype(bool), axis1=-2, axis2=-1)  # [B|1, H|1, N]
    return jnp.broadcast_to(jnp.all(diag, axis=1), (batch, length))
  raise ValueError(
    f"mask must have shape [batch, length] = {(batch, length)} or "
    f"[batch, 1 or heads, length, length] = {(batch, '1|H', length, length)}, got {shape}"
  )


def attention_bias_mask(mask: jax.Array | None, batch: int, q_len: int, k_len: int, causal: bool) -> jax.Array | None:
  """[B|1, 1|H, N, M] bool "may attend" mask for softmax attention, or None.

  A [B, M] padding vector masks keys only (the release: padded queries still
  attend; their rows are zeroed later by the model).
  """
  full = None
  if mask is not None:
    shape = tuple(mask.shape)
    if shape == (batch, k_len):
      full = mask.astype(bool)[:, None, None, :]
    elif len(shape) == 4 and shape[0] in (1, batch) and shape[-2:] == (q_len, k_len):
      full = mask.astype(bool)
    else:
      raise ValueError(
        f"mask must have shape [batch, keys] = {(batch, k_len)} or "
        f"[batch, 1 or heads, queries, keys] = {(batch, '1|H', q_len, k_len)}, got {shape}"
      )
  if causal:
    if q_len != k_len:
      raise ValueError(f"causal attention needs as many queries as keys, got {q_len} and {k_len}")
    tri = jnp.tril(jnp.ones((q_len, k_len), bool))[None, None]
    full = tri if full is None else jnp.logical_and(full, tri)
  return full
