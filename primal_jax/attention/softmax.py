"""`SoftmaxAttention`: the canonical multi-head attention baseline.

Same calling convention and parameter layout as `PrimalAttention` (query/key/
value/out DenseGeneral over heads), and the release's masking: scores minus
1e6 at masked keys, so the two are interchangeable by name in one block.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from primal_jax.attention.inputs import resolve_qkv
from primal_jax.dropout import Dropout
from primal_jax.initializers import linear_inits
from primal_jax.masks import attention_bias_mask
from primal_jax.validation import check_divisible, check_positive

# The release subtracts 1e6 from masked scores rather than using -inf, so a row
# with every key masked stays finite (in float32 it stays close to the unmasked
# softmax, since s - 1e6 keeps s to ~1/16); such rows are zeroed by the models.
MASK_PENALTY = 1e6


class SoftmaxAttention(nn.Module):
  """A = softmax(Q K^T / sqrt(p) - 1e6 * (1 - mask)); out = Linear(merge_heads(A V)).

  Attributes:
    num_heads: H.
    causal: mask keys j > i.
    init_style: "flax", "torch" or "gpt2" (see `primal_jax.initializers`).
    debug_checks: raise ValueError on NaN/inf inputs.
    decode: incremental decoding with a key/value cache sized by the first
      (initialising) call's length.
    The rest mirror `nn.MultiHeadDotProductAttention`.
  """

  num_heads: int
  causal: bool = False
  init_style: str = "flax"
  debug_checks: bool = False
  dtype: Any = None
  param_dtype: Any = jnp.float32
  qkv_features: int | None = None
  out_features: int | None = None
  broadcast_dropout: bool = True
  dropout_rate: float = 0.0
  dropout_impl: str = "threefry"  # mask generator: "threefry" (nn.Dropout) | "hash" (primal_jax.dropout)
  deterministic: bool | None = None
  precision: Any = None
  kernel_init: Any = None
  bias_init: Any = None
  use_bias: bool = True
  decode: bool = False

  @nn.compact
  def __call__(
    self,
    inputs_q: jax.Array,
    inputs_k: jax.Array | None = None,
    inputs_v: jax.Array | None = None,
    *,
    inputs_kv: jax.Array | None = None,
    mask: jax.Array | None = None,
    deterministic: bool | None = None,
    dropout_rng: jax.Array | None = None,
    sow_weights: bool = False,
  ) -> jax.Array:
    """inputs_q [B, N, D], inputs_k/inputs_v [B, M, D] (default inputs_q) -> [B, N, D_out].

    mask: [B, M] key padding (True = real) or [B, 1|H, N, M] attention mask.
    """
    check_positive(self.num_heads, "num_heads")
    if self.decode and not self.causal:
      raise ValueError("decode=True needs causal=True (the key/value cache only serves causal decoding)")
    inputs_k, inputs_v = resolve_qkv(inputs_q, inputs_k, inputs_v, inputs_kv, debug_checks=self.debug_checks)
    batch, length, width = inputs_q.shape
    heads = self.num_heads
    features = self.qkv_features or width
    check_divisible(features, heads, "qkv_features", "num_heads")
    p = features // heads
    dtype = self.dtype or jnp.result_type(inputs_q.dtype, jnp.float32)
    kernel_init, bias_init = linear_inits(self.init_style, width, self.kernel_init, self.bias_init)
    project = functools.partial(
      nn.DenseGeneral,
      features=(heads, p),
      dtype=dtype,
      param_dtype=self.param_dtype,
      precision=self.precision,
      use_bias=self.use_bias,
      kernel_init=nn.with_logical_partitioning(kernel_init, ("embed", "heads", "kv")),
      bias_init=nn.with_logical_partitioning(bias_init, ("heads", "kv")),
    )
    q = project(name="query")(inputs_q)  # [B, N, H, p]
    k = project(name="key")(inputs_k)  # [B, M, H, p]
    v = project(name="value")(inputs_v)  # [B, M, H, p]

    if self.decode:
      if mask is not None:
        raise ValueError("SoftmaxAttention decode takes no mask: the cache is causal; pad prompts on the right")
      k, v, allowed = self._decode_cache(k, v)
    else:
      allowed = attention_bias_mask(mask, batch, length, k.shape[1], self.causal)
    scores = jnp.einsum("bnhd,bmhd->bhnm", q, k) / jnp.sqrt(jnp.asarray(p, dtype))
    if allowed is not None:
      scores = scores - MASK_PENALTY * (1.0 - allowed.astype(scores.dtype))
    weights = jax.nn.softmax(scores.astype(jnp.promote_types(dtype, jnp.float32)), axis=-1).astype(dtype)
    if sow_weights:
      self.sow("intermediates", "attention_weights", weights)
    if self.dropout_rate > 0.0:
      deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
      broadcast = (1,) if self.broadcast_dropout else ()
      weights = Dropout(self.dropout_rate, broadcast_dims=broadcast, impl=self.dropout_impl, name="dropout")(
        weights, deterministic=deterministic, rng=dropout_rng
      )
    heads_out = jnp.einsum("bhnm,bmhd->bnhd", weights, v)  # [B, N, H, p]
    out_kernel, out_bias = linear_inits(self.init_style, features, self.kernel_init, self.bias_init)
    return nn.DenseGeneral(
      features=self.out_features or width,
      axis=(-2, -1),
      dtype=dtype,
      param_dtype=self.param_dtype,
      precision=self.precision,
      use_bias=self.use_bias,
      kernel_init=nn.with_logical_partitioning(out_kernel, ("heads", "kv", "embed")),
      bias_init=nn.with_logical_partitioning(out_bias, ("embed",)),
      name="out",
    )(heads_out)

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
