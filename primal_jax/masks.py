"""Masks in the forms users pass them, reduced to what each attention needs.

Primal-Attention has no N x N score matrix, so it needs a per-position padding
vector. It accepts either that vector ([B, N]) or the Flax attention mask
([B, 1 or H, N, N], as built by `nn.make_attention_mask`), from which a position
counts as real iff it may attend to itself (the diagonal). That rule holds for
padding masks and for padding combined with a causal mask.

A mask is more than padding when it forbids pairs of real positions (a causal,
block-diagonal or per-head mask). A layer that cannot honour such a mask must
not silently reduce it to padding: `mask_honoured` tells which sequences' masks
allow every pair the layer uses, `mask_values_ok` refuses additive float masks
(0 / -inf, which a cast to bool would invert), and `refuse_unhonoured` turns a
failed check into a ValueError (concrete masks, or a host callback under `jit`
with `debug_checks`) or NaN outputs for the offending sequences (traced masks:
a host check on every call would cost a device-to-host sync and could not be
exported).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

PAIR_PATTERNS = ("self", "causal", "all")


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


def mask_values_ok(mask: jax.Array, batch: int) -> jax.Array:
  """[B] bool: True where the (non-boolean) mask holds only 0 and 1, Flax's multiplicative masks.

  An additive mask (0 = attend, -inf or -1e9 = do not) fails: cast to bool it would invert.
  """
  if mask.dtype == jnp.bool_:
    return jnp.ones((batch,), bool)
  binary = (mask == 0) | (mask == 1)
  ok = jnp.all(binary.reshape(binary.shape[0], -1), axis=-1)
  return jnp.broadcast_to(ok, (batch,))


def mask_honoured(mask: jax.Array, padding: jax.Array, pairs: str) -> jax.Array:
  """[B] bool: True where `mask` allows every (query i, key j) pair of real positions that a layer uses.

  Args:
    mask: [B, N] padding vector (always honoured: it says nothing beyond padding) or a Flax
      attention mask [B|1, 1|H, N, N] (nonzero = may attend).
    padding: [B, N] bool, the real positions the layer sees (`padding_from_mask`).
    pairs: which pairs the layer mixes: "self" (i with itself only), "causal" (j <= i) or
      "all" (every pair).
  """
  if pairs not in PAIR_PATTERNS:
    raise ValueError(f"pairs must be one of {PAIR_PATTERNS}, got {pairs!r}")
  batch, length = padding.shape
  if mask.ndim == 2 or pairs == "self":  # the diagonal defines `padding`, so "self" always holds
    return jnp.ones((batch,), bool)
  used = padding[:, :, None] & padding[:, None, :]  # [B, N, N]
  if pairs == "causal":
    used = used & jnp.tril(jnp.ones((length, length), bool))
  allowed = mask.astype(bool)  # [B|1, 1|H, N, N]
  return jnp.broadcast_to(jnp.all(allowed | ~used[:, None], axis=(1, 2, 3)), (batch,))


def _raise_unless(ok, message: str) -> None:
  if not bool(ok):
    raise ValueError(message)


def refuse_unhonoured(out: jax.Array, ok: jax.Array, message: str, debug_checks: bool = False) -> jax.Array:
  """`out` [B, ...] unchanged where `ok` [B]; else ValueError(message) or NaN rows.

  A concrete `ok` (eager call, mask known at trace time) raises here. A traced one
  cannot raise without a host round trip, so the failing sequences' outputs become
  NaN (loud downstream: a non-finite loss); `debug_checks` adds a host callback
  that raises `message` when the computation runs.
  """
  if not isinstance(ok, jax.core.Tracer):
    _raise_unless(jnp.all(ok), message)
    return out
  if debug_checks:
    jax.debug.callback(_raise_unless, jnp.all(ok), message)
  keep = ok.reshape((-1,) + (1,) * (out.ndim - 1))
  return jnp.where(keep, out, jnp.asarray(jnp.nan, out.dtype))
