"""`AttentionShell`: what every attention mechanism of the library shares, written once.

The shell owns the call signature of `flax.linen.MultiHeadDotProductAttention`
(`inputs_q`, `inputs_k`, `inputs_v`, the `inputs_kv` alias, `mask`,
`deterministic`, `dropout_rng`, `sow_weights`), the dtype rule, the per-head
query/key/value projections, the dropout module and the output projection,
with one parameter tree (`query`, `key`, `value`, `out`, all `DenseGeneral`
over heads with the logical axes "embed", "heads", "kv"), so a checkpoint's
projections carry over between mechanisms. A mechanism subclasses it and
supplies only its core, `attend`, plus its own attributes (its options) and
`validate`. Analysis code reads what a layer sows (`SPECTRUM_COLLECTION`)
instead of re-implementing the layer.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import linen as nn

from primal_jax.dropout import Dropout
from primal_jax.initializers import linear_inits
from primal_jax.masks import padding_from_mask
from primal_jax.validation import check_divisible, check_finite, check_positive, check_rank, check_same_shape

# Collection into which a layer sows its attention matrix (softmax probabilities, or Primal-Attention's
# induced kernel of Theorem 3.2) when, and only when, the caller makes it mutable: the matrix is
# N x N, so nothing is computed otherwise.
SPECTRUM_COLLECTION = "spectrum"


def resolve_inputs(
  inputs_q: jax.Array,
  inputs_k: jax.Array | None,
  inputs_v: jax.Array | None,
  inputs_kv: jax.Array | None,
  *,
  debug_checks: bool = False,
) -> tuple[jax.Array, jax.Array]:
  """(keys input, values input) with Flax's defaults: keys = queries, values = keys.

  `inputs_kv` is Flax's alias for both. Raises ValueError for a wrong rank, keys
  and values of different shapes or batch sizes, and (with `debug_checks`)
  NaN/inf inputs.
  """
  if inputs_kv is not None:
    if inputs_k is not None or inputs_v is not None:
      raise ValueError("pass either inputs_k/inputs_v or inputs_kv, not both")
    inputs_k = inputs_v = inputs_kv
  inputs_k = inputs_q if inputs_k is None else inputs_k
  inputs_v = inputs_k if inputs_v is None else inputs_v
  check_rank(inputs_q, 3, "inputs_q", "[batch, length, features]")
  check_rank(inputs_k, 3, "inputs_k", "[batch, length, features]")
  check_same_shape(inputs_k, inputs_v, "inputs_k", "inputs_v")
  if inputs_k.shape[0] != inputs_q.shape[0]:
    raise ValueError(f"inputs_k must have batch size {inputs_q.shape[0]} (that of inputs_q), got {inputs_k.shape}")
  if debug_checks:
    for name, value in (("inputs_q", inputs_q), ("inputs_k", inputs_k), ("inputs_v", inputs_v)):
      check_finite(value, name)
  return inputs_k, inputs_v


class AttentionShell(nn.Module):
  """Projections, dropout and output around a mechanism's core.

  out = Linear_out(attend(query(x_q), key(x_k), value(x_v))), heads merged. The attributes not listed
  below mirror `nn.MultiHeadDotProductAttention`.

  Attributes:
    num_heads: H.
    causal: causal attention (a mechanism without a causal form refuses it).
    init_style: "flax", "torch" or "gpt2" (see `primal_jax.initializers`).
    debug_checks: raise ValueError on NaN/inf inputs (costs a host sync).
    dropout_impl: mask generator, "threefry" (= nn.Dropout) or "hash"
      (`primal_jax.dropout`); where the dropout acts is the mechanism's choice.
    decode: incremental causal decoding from the `cache` collection; only
      mechanisms that keep a decoding state accept it.

  Class attributes a mechanism sets: `projections`, which of "query", "key", "value" it has
  (Primal-Attention has no value projection); `supports_causal` and `supports_decode`, whether `causal` /
  `decode` may be True; `self_attention_only`, whether the keys input must have the queries input's shape.
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
  dropout_impl: str = "threefry"
  deterministic: bool | None = None
  precision: Any = None
  kernel_init: Any = None
  bias_init: Any = None
  use_bias: bool = True
  decode: bool = False

  projections: ClassVar[tuple[str, ...]] = ("query", "key", "value")
  supports_causal: ClassVar[bool] = True
  supports_decode: ClassVar[bool] = False
  self_attention_only: ClassVar[bool] = False

  def validate(self) -> None:
    """Checks of the mechanism's own attributes; subclasses extend it (called on every call)."""

  def rng_streams(self) -> tuple[str, ...]:
    """RNG streams, besides "dropout", that a call of this layer (with these options) draws keys from; the NNX
    layer (`primal_jax.nnx`) passes them on. None by default (Reformer's rotations="per_call": "redraw")."""
    return ()

  def attend(
    self,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array | None,
    *,
    inputs_k: jax.Array,
    mask: jax.Array | None,
    deterministic: bool | None,
    dropout_rng: jax.Array | None,
    sow_weights: bool,
  ) -> jax.Array:
    """The mechanism's core: q [B, N, H, p], k/v [B, M, H, p] (None without that projection) -> [B, N, H, p].

    `inputs_k` is the raw keys input [B, M, D] (Primal-Attention samples its rows).
    """
    raise NotImplementedError

  def apply_dropout(
    self, x: jax.Array, deterministic: bool | None, rng: jax.Array | None, broadcast_dims: tuple[int, ...] = ()
  ) -> jax.Array:
    """Dropout at rate `dropout_rate` on whatever tensor the core chooses (weights or head outputs)."""
    if self.dropout_rate <= 0.0:
      return x
    deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
    return Dropout(self.dropout_rate, broadcast_dims=broadcast_dims, impl=self.dropout_impl, name="dropout")(
      x, deterministic=deterministic, rng=rng
    )

  def sow_matrix(self, kind: str, matrix_fn, mask: jax.Array | None, batch: int, length: int) -> None:
    """Sows {"matrix": matrix_fn() [B, H, N, M], "padding": [B, N]} if the spectrum collection is mutable.

    `padding` holds the real positions as the layer saw them (`padding_from_mask`; all when no mask).
    """
    if self.is_initializing() or not self.is_mutable_collection(SPECTRUM_COLLECTION):
      return
    if self.decode:
      raise ValueError("attention matrices need a full-sequence call; decode=True layers see one chunk at a time")
    padding = padding_from_mask(mask, batch, length)
    padding = jnp.ones((batch, length), bool) if padding is None else padding
    self.sow(SPECTRUM_COLLECTION, kind, {"matrix": matrix_fn(), "padding": padding})

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
      inputs_v: [B, M, D] values input (default `inputs_k`; ignored without a value projection).
      inputs_kv: alias setting both `inputs_k` and `inputs_v` (Flax compatibility).
      mask: [B, M] key padding (True = real) or a Flax attention mask [B, 1|H, N, M]; each mechanism
        documents what it does with it.
      deterministic: disables dropout; merged with the attribute.
      dropout_rng: optional explicit dropout key.
      sow_weights: sow the attention weights in `intermediates` where the mechanism forms them.
    Returns:
      [B, N, out_features].
    """
    name = type(self).__name__
    check_positive(self.num_heads, "num_heads")
    if self.causal and not self.supports_causal:
      raise ValueError(f"causal=True is not supported by {name} (non-causal only)")
    if self.decode and not self.supports_decode:
      raise ValueError(f"decode=True is not supported by {name} (it keeps no decoding cache)")
    if self.decode and not self.causal:
      raise ValueError(f"decode=True needs causal=True ({name} decodes causally only)")
    self.validate()
    inputs_k, inputs_v = resolve_inputs(inputs_q, inputs_k, inputs_v, inputs_kv, debug_checks=self.debug_checks)
    if self.self_attention_only:
      check_same_shape(inputs_q, inputs_k, "inputs_q", "inputs_k")
    width = inputs_q.shape[-1]
    features = self.qkv_features or width
    check_divisible(features, self.num_heads, "qkv_features", "num_heads")
    p = features // self.num_heads
    dtype = self.dtype or jnp.result_type(inputs_q.dtype, jnp.float32)

    kernel_init, bias_init = linear_inits(self.init_style, width, self.kernel_init, self.bias_init)
    project = functools.partial(
      nn.DenseGeneral,
      features=(self.num_heads, p),
      dtype=dtype,
      param_dtype=self.param_dtype,
      precision=self.precision,
      use_bias=self.use_bias,
      kernel_init=nn.with_logical_partitioning(kernel_init, ("embed", "heads", "kv")),
      bias_init=nn.with_logical_partitioning(bias_init, ("heads", "kv")),
    )
    sources = {"query": inputs_q, "key": inputs_k, "value": inputs_v}
    projected = {name: project(name=name)(sources[name]) for name in self.projections}  # [B, N|M, H, p]
    heads_out = self.attend(
      projected["query"],
      projected.get("key"),
      projected.get("value"),
      inputs_k=inputs_k,
      mask=mask,
      deterministic=deterministic,
      dropout_rng=dropout_rng,
      sow_weights=sow_weights,
    )  # [B, N, H, p]
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
    )(heads_out.astype(dtype))
