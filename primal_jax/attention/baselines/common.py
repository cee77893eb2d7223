"""What every baseline attention shares: inputs, masks, projections, head dropout, output.

`BaselineAttention` is the thin Linen shell: query/key/value `DenseGeneral`
over heads and the output `DenseGeneral`, with the parameter tree and logical
axis names of `SoftmaxAttention` (so a checkpoint's projections carry over).
Subclasses only implement `attend`, which calls a pure function on
[B, H, N, p] arrays. None of these mechanisms has an N x M weight matrix that a
general attention mask could edit, so a mask is reduced to key (and query)
padding; causality comes from the `causal` attribute alone.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import linen as nn

from primal_jax.attention.inputs import resolve_qkv
from primal_jax.dropout import Dropout
from primal_jax.initializers import linear_inits
from primal_jax.validation import check_divisible, check_positive


def compute_dtype(dtype) -> Any:
  """Feature maps, sums and normalisers run in at least float32, also for bf16 inputs."""
  return jnp.promote_types(dtype, jnp.float32)


def padding_masks(
  mask: jax.Array | None, batch: int, q_len: int, k_len: int
) -> tuple[jax.Array | None, jax.Array | None]:
  """(query_valid [B, N] | None, key_valid [B, M] | None), True = real position.

  Args:
    mask: None, a [B, M] key padding vector, or a Flax attention mask
      [B|1, 1|H, N, M] ("query i may attend key j").
    batch, q_len, k_len: B, N, M.
  Returns:
    From a [B, M] vector: the keys' padding, which is also the queries' when
    N == M (self-attention), else None. From a 4-D mask: a key is real iff
    some query may attend to it, a query is real iff it may attend to some key
    (for `nn.make_attention_mask(pad, pad)`, with or without a causal mask
    combined, both give `pad` back).
  """
  if mask is None:
    return None, None
  shape = tuple(mask.shape)
  if shape == (batch, k_len):
    key_valid = mask.astype(bool)
    return (key_valid if q_len == k_len else None), key_valid
  if len(shape) == 4 and shape[0] in (1, batch) and shape[2:] == (q_len, k_len):
    allowed = mask.astype(bool)
    query_valid = jnp.broadcast_to(jnp.any(allowed, axis=(1, 3)), (batch, q_len))
    key_valid = jnp.broadcast_to(jnp.any(allowed, axis=(1, 2)), (batch, k_len))
    return query_valid, key_valid
  raise ValueError(
    f"mask must have shape [batch, keys] = {(batch, k_len)} or "
    f"[batch, 1 or heads, queries, keys] = {(batch, '1|H', q_len, k_len)}, got {shape}"
  )


def zero_padded(x: jax.Array, valid: jax.Array | None) -> jax.Array:
  """x [B, H, L, f] with the rows of padded positions (valid [B, L] False) set to 0.

  `where`, not a product: a padded row holding inf/NaN must not leak NaN.
  """
  if valid is None:
    return x
  return jnp.where(valid[:, None, :, None], x, jnp.zeros((), x.dtype))


class BaselineAttention(nn.Module):
  """Shell of the baseline attentions: out = Linear(merge_heads(attend(Q, K, V))).

  Attributes:
    num_heads: H.
    causal: causal attention; only mechanisms with `supports_causal` accept it.
    init_style: "flax", "torch" or "gpt2" (see `primal_jax.initializers`).
    debug_checks: raise ValueError on NaN/inf inputs.
    dropout_rate: dropout on the heads' outputs [B, H, N, p] before the output
      projection (there is no attention-weight matrix to drop; the
      Nystromformer LRA code that the paper's baselines come from applies none).
    decode: accepted for the block interface; True is an error (no cache).
    The rest mirror `nn.MultiHeadDotProductAttention` (`broadcast_dropout` is
    accepted and ignored, as in `PrimalAttention`).
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

  supports_causal: ClassVar[bool] = False

  def validate(self) -> None:
    """Checks of the mechanism's own attributes (subclasses extend it)."""

  def attend(
    self,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    query_valid: jax.Array | None,
    key_valid: jax.Array | None,
  ) -> jax.Array:
    """q [B, H, N, p], k/v [B, H, M, p], paddings [B, N] / [B, M] bool or None -> [B, H, N, p]."""
    raise NotImplementedError

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
    """Applies the attention.

    Args:
      inputs_q: [B, N, D] queries input.
      inputs_k: [B, M, D] keys input (default `inputs_q`).
      inputs_v: [B, M, D] values input (default `inputs_k`).
      inputs_kv: alias setting both `inputs_k` and `inputs_v` (Flax compatibility).
      mask: [B, M] key padding (True = real) or a Flax attention mask
        [B, 1|H, N, M], reduced to padding (see `padding_masks`).
      deterministic: disables dropout; merged with the attribute.
      dropout_rng: optional explicit dropout key.
      sow_weights: ignored (no N x M weight matrix is formed).
    Returns:
      [B, N, out_features]; rows of padded queries are not zeroed (as `SoftmaxAttention`).
    """
    del sow_weights
    name = type(self).__name__
    check_positive(self.num_heads, "num_heads")
    if self.decode:
      raise ValueError(f"decode=True is not supported by {name} (it keeps no decoding cache)")
    if self.causal and not self.supports_causal:
      raise ValueError(f"causal=True is not supported by {name} (non-causal only)")
    self.validate()
    inputs_k, inputs_v = resolve_qkv(inputs_q, inputs_k, inputs_v, inputs_kv, debug_checks=self.debug_checks)
    if inputs_k.shape[0] != inputs_q.shape[0]:
      raise ValueError(f"inputs_k must have batch size {inputs_q.shape[0]} (that of inputs_q), got {inputs_k.shape}")
    if self.causal and inputs_k.shape[1] != inputs_q.shape[1]:
      raise ValueError(
        f"causal attention needs as many queries as keys, got {inputs_q.shape[1]} and {inputs_k.shape[1]}"
      )
    batch, length, width = inputs_q.shape
    heads = self.num_heads
    features = self.qkv_features or width
    check_divisible(features, heads, "qkv_features", "num_heads")
    p = features // heads
    dtype = self.dtype or jnp.result_type(inputs_q.dtype, jnp.float32)
    query_valid, key_valid = padding_masks(mask, batch, length, inputs_k.shape[1])

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
    q = jnp.swapaxes(project(name="query")(inputs_q), 1, 2)  # [B, H, N, p]
    k = jnp.swapaxes(project(name="key")(inputs_k), 1, 2)  # [B, H, M, p]
    v = jnp.swapaxes(project(name="value")(inputs_v), 1, 2)  # [B, H, M, p]
    heads_out = self.attend(q, k, v, query_valid, key_valid).astype(dtype)  # [B, H, N, p]

    if self.dropout_rate > 0.0:
      deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
      heads_out = Dropout(self.dropout_rate, broadcast_dims=(), impl=self.dropout_impl, name="dropout")(
        heads_out, deterministic=deterministic, rng=dropout_rng
      )
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
    )(jnp.swapaxes(heads_out, 1, 2))  # [B, N, H, p] -> [B, N, D_out]
