"""`SoftmaxAttention`: the canonical multi-head attention baseline, on the shared attention shell.

Same parameter layout as `PrimalAttention` (query/key/value/out DenseGeneral
over heads), and the release's masking: scores minus 1e6 at masked keys, so the
two are interchangeable by name in one block.
"""

from __future__ import annotations

import inspect
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import linen as nn

from primal_jax.attention.shell import SOFTMAX_HOOKS, SPECTRUM_COLLECTION, AttentionShell
from primal_jax.masks import attention_bias_mask, refuse_unhonoured
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
    attention_fn, qk_attn_weights_einsum_cls, attn_weights_value_einsum_cls: given, the core is Flax's:
      `attention_fn` (default `nn.dot_product_attention`) called as `nn.MultiHeadDotProductAttention` calls it.
    num_kv_heads: grouped-query attention: H_kv key/value heads, each shared by H / H_kv query heads.
    decode: incremental decoding as Flax's: a key/value cache sized by the first (initialising) call's
      length, each call's chunk written at the cache index and attending to the cache up to itself. The
      cache, named as Flax's, holds `cached_key` and `cached_value` [B, H_kv, p, max_len] (batch-leading;
      positions last for the decode contraction, `_decode_attend`) and the scalar `cache_index`; a chunk of
      another batch, or past the cache's end, is refused.
    The rest: see `AttentionShell`.
  """

  impl: str = "einsum"

  supports_decode: ClassVar[bool] = True
  softmax_hooks: ClassVar[bool] = True
  supports_kv_groups: ClassVar[bool] = True
  native_kv_groups: ClassVar[bool] = True
  decode_needs_causal: ClassVar[bool] = False

  def validate(self) -> None:
    check_choice(self.impl, IMPLS, "impl")
    if self.impl == "dot_product_attention" and self.dropout_rate > 0.0:
      raise ValueError(
        "impl='dot_product_attention' does not support dropout_rate > 0 (no hook for dropout on the fused "
        f"weights); got dropout_rate={self.dropout_rate}"
      )

  @property
  def flax_core(self) -> bool:
    """Whether a Flax hook replaces the core (`attention_fn` or the einsum classes)."""
    return any(getattr(self, hook) is not None for hook in SOFTMAX_HOOKS)

  def attend(self, q, k, v, *, inputs_k, mask, deterministic, dropout_rng, sow_weights):
    """q [B, N, H, p], k/v [B, M, H_kv, p] -> [B, N, H, p]; mask [B, M] key padding or [B, 1|H, N, M]."""
    del inputs_k
    batch, length, _, p = q.shape
    if self.decode:
      if mask is not None:
        raise ValueError("SoftmaxAttention decode takes no mask: the cache is causal; pad prompts on the right")
      return self._decode_attend(q, k, v, deterministic, dropout_rng, sow_weights)
    allowed = attention_bias_mask(mask, batch, length, k.shape[1], self.causal)
    k, v = self.repeat_kv(k), self.repeat_kv(v)
    if self.flax_core:
      return self._flax_attend(q, k, v, allowed, deterministic, dropout_rng, sow_weights)
    if self.impl == "dot_product_attention":
      self._refuse_sowing(sow_weights)
      return jax.nn.dot_product_attention(q, k, v, mask=allowed)  # [B, N, H, p]
    weights = self._weights(jnp.einsum("bnhd,bmhd->bhnm", q, k), allowed, p, q.dtype)
    if sow_weights:
      self.sow("intermediates", "attention_weights", weights)
    self.sow_matrix("softmax", lambda: self._exact_weights(q, k, allowed), mask, batch, length)
    weights = self.apply_dropout(weights, deterministic, dropout_rng, (1,) if self.broadcast_dropout else ())
    return jnp.einsum("bhnm,bmhd->bnhd", weights, v).astype(q.dtype)  # [B, N, H, p]

  def _flax_attend(self, q, k, v, allowed, deterministic, dropout_rng, sow_weights):
    """The core as `nn.MultiHeadDotProductAttention` runs it: `attention_fn` with the keywords it declares."""
    if self.dropout_rate > 0.0:
      deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
      if not deterministic and dropout_rng is None:
        dropout_rng = self.make_rng("dropout")
    else:
      deterministic = True
    fn = self.attention_fn or nn.dot_product_attention
    make = lambda cls: cls() if cls is not None else None  # noqa: E731
    kwargs = dict(
      mask=allowed,
      dropout_rng=dropout_rng,
      dropout_rate=self.dropout_rate,
      broadcast_dropout=self.broadcast_dropout,
      deterministic=deterministic,
      dtype=self.dtype,
      precision=self.precision,
      force_fp32_for_softmax=self.force_fp32_for_softmax,
      qk_attn_weights_einsum=make(self.qk_attn_weights_einsum_cls),
      attn_weights_value_einsum=make(self.attn_weights_value_einsum_cls),
    )
    accepted = inspect.signature(fn).parameters
    kwargs = {key: value for key, value in kwargs.items() if key in accepted}
    if sow_weights:
      return fn(q, k, v, **kwargs, module=self)
    return fn(q, k, v, **kwargs)

  def _refuse_sowing(self, sow_weights: bool) -> None:
    if sow_weights or (not self.is_initializing() and self.is_mutable_collection(SPECTRUM_COLLECTION)):
      raise ValueError("impl='dot_product_attention' forms no weights to sow; use impl='einsum'")

  def _weights(self, scores, allowed, p: int, dtype) -> jax.Array:
    """softmax(scores / sqrt(p) - 1e6 * (1 - allowed)) over the last axis, in at least float32, cast to `dtype`
    (kept in float32 with `force_fp32_for_softmax`, as Flax keeps them)."""
    scores = scores / jnp.sqrt(jnp.asarray(p, scores.dtype))
    if allowed is not None:
      scores = scores - MASK_PENALTY * (1.0 - allowed.astype(scores.dtype))
    weights = jax.nn.softmax(scores.astype(jnp.promote_types(dtype, jnp.float32)), axis=-1)
    return weights if self.force_fp32_for_softmax else weights.astype(dtype)

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

    The cache is batch-leading, as Flax's (a beam search gathers every leaf along axis 0), and laid out for the
    decode contraction (`_decode_cache`): keys and values [B, H_kv, p, max_len], so q K^T and p V are batched
    matrix-vector products (batch axes B and H_kv; a group's G = H / H_kv query heads and the chunk's T positions
    stacked as rows) whose long axis is the cache's contiguous minor one: each reads the cache once, in place.
    (Flax's [B, max_len, H, p] made XLA transpose every layer's keys and values at every token; positions-major
    values made XLA:CPU's p V run at a tenth of the memory bandwidth.) The unfilled tail is masked on the scores
    only. Under `jit` with the cache donated, the chunk's write is in place.
    """
    batch, chunk, heads, p = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    cached_k, cached_v, allowed, ok = self._decode_cache(k, v)  # [B, Hkv, p, L] x 2, [T, L], [B]
    message = f"SoftmaxAttention decode: the chunk runs past the cache's {cached_k.shape[-1]} positions"
    if self.flax_core or self.impl == "dot_product_attention":
      # The layout Flax's and jax.nn's attention take ([B, L, H, p]), as a transposed view of the cache.
      view = lambda c: self.repeat_kv(jnp.transpose(c, (0, 3, 1, 2)))  # noqa: E731
      if self.flax_core:
        keys, values = view(cached_k), view(cached_v)
        out = self._flax_attend(q, keys, values, allowed[None, None], deterministic, None, sow_weights)
      else:
        self._refuse_sowing(sow_weights)
        out = jax.nn.dot_product_attention(q, view(cached_k), view(cached_v), mask=allowed[None, None])
      return refuse_unhonoured(out, ok, message, self.debug_checks)
    # [B, T, H, p] -> [B, Hkv, G T, p]: a group's query heads and the chunk's positions as rows.
    rows = jnp.transpose(q.reshape(batch, chunk, kv_heads, group, p), (0, 2, 3, 1, 4))
    scores = jnp.einsum("bkrd,bkdl->bkrl", rows.reshape(batch, kv_heads, group * chunk, p), cached_k)
    weights = self._weights(scores, jnp.tile(allowed, (group, 1)), p, q.dtype)  # [B, Hkv, G T, L]
    full = weights.reshape(batch, heads, chunk, -1)  # [B, H, T, L]
    if sow_weights:
      self.sow("intermediates", "attention_weights", full)
    full = self.apply_dropout(full, deterministic, dropout_rng, (1,) if self.broadcast_dropout else ())
    rows = full.reshape(batch, kv_heads, group * chunk, -1)
    out = jnp.einsum("bkrl,bkdl->bkrd", rows, cached_v)  # [B, Hkv, G T, p]
    out = jnp.transpose(out.reshape(batch, kv_heads, group, chunk, p), (0, 3, 1, 2, 4)).reshape(q.shape)
    return refuse_unhonoured(out.astype(q.dtype), ok, message, self.debug_checks)

  def _decode_cache(self, k, v):
    """Writes a chunk of T keys/values [B, T, H_kv, p] at the cache index; returns the cache, the [T, L] mask and
    [B] ok (False where the chunk would run past the cache: its outputs are refused, never silently wrong).

    The cache, named as Flax's (`cached_key`, `cached_value` [B, H_kv, p, max_len], batch-leading with positions
    contiguous, and the scalar `cache_index`), and its length are fixed by the initialising call, whose own chunk
    is the maximum length. A chunk of another batch than the cache's, or one past its end (when the index is
    concrete), raises ValueError; under `jit` the outputs of a chunk past the end are NaN.
    """
    batch, chunk, kv_heads, p = k.shape
    k, v = (jnp.transpose(x, (0, 2, 3, 1)) for x in (k, v))  # [B, Hkv, p, T]
    initialized = self.has_variable("cache", "cached_key")
    cached_k = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
    cached_v = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    max_len = cached_k.value.shape[-1]
    if not initialized:  # the initialising call attends over its own chunk; the cache it creates stays zero
      return k, v, jnp.tril(jnp.ones((chunk, chunk), bool)), jnp.ones((batch,), bool)
    if cached_k.value.shape[:3] != k.shape[:3]:
      raise ValueError(
        f"SoftmaxAttention decode: inputs of batch {batch} against a cache of batch {cached_k.value.shape[0]} "
        "(decode the batch the cache was initialised with)"
      )
    start = index.value
    end = start + chunk
    if not isinstance(end, jax.core.Tracer) and int(end) > max_len:
      raise ValueError(
        f"SoftmaxAttention decode: positions {int(start)}..{int(end) - 1} run past the cache's {max_len} "
        "positions (set by the initialising call's length)"
      )
    fits = end <= max_len
    zero = jnp.zeros((), start.dtype)  # one index dtype, also under jax_enable_x64
    write = lambda cache, x: jax.lax.dynamic_update_slice(cache, x.astype(cache.dtype), (zero, zero, zero, start))  # noqa: E731
    if batch == 1:
      # The write sits in a conditional (taken whenever the chunk fits; past the end it writes nothing): XLA:CPU
      # would otherwise fuse it into the reshape its batched dot makes of a batch-1 cache (the size-1 axis dropped)
      # and copy the whole cache at every token (tests/test_decoding.py's in-place test). A larger batch needs no
      # reshape, so no conditional (and its fixed cost); past the end XLA clamps that write, the outputs are NaN.
      cached_k.value, cached_v.value = jax.lax.cond(
        fits, lambda kv: (write(kv[0], k), write(kv[1], v)), lambda kv: kv, (cached_k.value, cached_v.value)
      )
    else:
      cached_k.value, cached_v.value = write(cached_k.value, k), write(cached_v.value, v)
    index.value = end
    allowed = jnp.arange(max_len)[None, :] <= (start + jnp.arange(chunk))[:, None]  # [T, L]
    return cached_k.value, cached_v.value, allowed, jnp.broadcast_to(fits, (batch,))
