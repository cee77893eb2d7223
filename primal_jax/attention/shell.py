"""`AttentionShell`: what every attention mechanism of the library shares, written once.

The shell owns the constructor and call of `flax.linen.MultiHeadDotProductAttention` (every argument
of flax 0.12.8's class: inputs of shape [batch_sizes..., length, features], Flax's input defaults and
errors, masks broadcast as Flax broadcasts them, the dtype rule, `normalize_qk`, the `*_dot_general`
hooks of the projections, the output initialisers, the decode flag), the per-head query/key/value
projections, the dropout module and the output projection, with one parameter tree (`query`, `key`,
`value`, `out`, all `DenseGeneral` over heads), so a checkpoint's projections carry over between
mechanisms. A mechanism subclasses it and supplies only its core, `attend`, on one folded batch axis,
plus its own attributes (its options) and `validate`. Analysis code reads what a layer sows
(`SPECTRUM_COLLECTION`) instead of re-implementing the layer.

Parameters are plain arrays unless the caller's initialisers carry partitioning metadata
(`nn.with_logical_partitioning`, as the project's models pass them: `primal_jax.initializers.
partitioned_attention_inits`); then every parameter of the layer is boxed with its logical axes
("embed", "heads", "kv", ...) and a boxed initialiser is used as given, never boxed twice.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import linen as nn

from primal_jax.attention.contract import (
  check_batch_and_length,
  compute_dtype,
  flat_batch,
  flat_mask,
  is_boxed_init,
  plain_init,
  resolve_inputs,
)
from primal_jax.dropout import Dropout
from primal_jax.initializers import linear_inits
from primal_jax.masks import padding_from_mask
from primal_jax.validation import check_divisible, check_positive

# Collection into which a layer sows its attention matrix (softmax probabilities, or Primal-Attention's
# induced kernel of Theorem 3.2) when, and only when, the caller makes it mutable: the matrix is
# N x N, so nothing is computed otherwise.
SPECTRUM_COLLECTION = "spectrum"
# Attributes of Flax's class that only the softmax core can honour (a mechanism sets `softmax_hooks`).
SOFTMAX_HOOKS = ("attention_fn", "qk_attn_weights_einsum_cls", "attn_weights_value_einsum_cls")

__all__ = ["SPECTRUM_COLLECTION", "AttentionShell", "resolve_inputs"]


class AttentionShell(nn.Module):
  """Projections, dropout and output around a mechanism's core.

  out = Linear_out(attend(query(x_q), key(x_k), value(x_v))), heads merged. The attributes not listed
  below are those of `nn.MultiHeadDotProductAttention` and mean what they mean there.

  Attributes:
    num_heads: H.
    num_kv_heads: key/value heads (grouped-query attention; None = `num_heads`): each key/value head is shared
      by `num_heads / num_kv_heads` query heads, the layer equal to one whose key/value kernels repeat their
      heads; only mechanisms with `supports_kv_groups` accept fewer (the others have no key heads to share).
    causal: causal attention (a mechanism without a causal form refuses it).
    init_style: "flax", "torch" or "gpt2" (see `primal_jax.initializers`).
    debug_checks: raise ValueError on NaN/inf inputs (costs a host sync).
    dropout_impl: mask generator, "threefry" (= nn.Dropout) or "hash"
      (`primal_jax.dropout`); where the dropout acts is the mechanism's choice.
    decode: incremental decoding from the `cache` collection; only mechanisms that keep a decoding
      state accept it (softmax decodes as Flax does, masking to the cache index; the others decode
      their causal form).
    normalize_qk: LayerNorm (no bias) of the projected queries and keys, as Flax ("query_ln", "key_ln").
    attention_fn, qk_attn_weights_einsum_cls, attn_weights_value_einsum_cls: the softmax core's hooks
      (None = the mechanism's own core); a mechanism without `softmax_hooks` refuses them.
    partition_params: box every parameter with its logical axes even with plain initialisers (the NNX
      layer sets it; Linen layers follow Flax: boxed only when an initialiser is).
    force_fp32_for_softmax: softmax weights in float32 (a mechanism without a softmax computes its
      features in at least float32 already, so accepts and ignores it).

  Class attributes a mechanism sets: `projections`, which of "query", "key", "value" it has
  (Primal-Attention has no value projection); `supports_causal` and `supports_decode`, whether `causal` /
  `decode` may be True; `self_attention_only`, whether the keys input must have the queries input's shape;
  `softmax_hooks`, whether `attention_fn` and the einsum hooks drive its core; `supports_kv_groups`,
  whether `num_kv_heads < num_heads` is defined for it (`kv_groups_refusal` says why not), and
  `native_kv_groups`, whether its `attend` takes the H_kv key/value heads itself (else the shell repeats them
  to H before `attend`; a decoding state of keys and values only is then kept per key/value head,
  `kv_state`); `decode_needs_causal`, whether `decode=True` asks
  for `causal=True` (softmax's cache masks to its own index, as Flax's does, so it does not).
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
  out_kernel_init: Any = None
  bias_init: Any = None
  out_bias_init: Any = None
  use_bias: bool = True
  attention_fn: Any = None
  decode: bool = False
  normalize_qk: bool = False
  force_fp32_for_softmax: bool = False
  qkv_dot_general: Any = None
  out_dot_general: Any = None
  qkv_dot_general_cls: Any = None
  out_dot_general_cls: Any = None
  qk_attn_weights_einsum_cls: Any = None
  attn_weights_value_einsum_cls: Any = None
  num_kv_heads: int | None = None
  partition_params: bool = False

  projections: ClassVar[tuple[str, ...]] = ("query", "key", "value")
  supports_causal: ClassVar[bool] = True
  supports_decode: ClassVar[bool] = False
  self_attention_only: ClassVar[bool] = False
  softmax_hooks: ClassVar[bool] = False
  supports_kv_groups: ClassVar[bool] = False
  native_kv_groups: ClassVar[bool] = False
  kv_groups_refusal: ClassVar[str] = "grouped key/value heads are not defined for it"
  decode_needs_causal: ClassVar[bool] = True

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
    """The mechanism's core: q [B, N, H, p], k/v [B, M, H_kv, p] (None without that projection) -> [B, N, H, p].

    B is the caller's batch axes folded into one; `inputs_k` is the raw keys input [B, M, D] (Primal-Attention
    samples its rows); `mask` is None, [B, M] key padding or [B|1, 1|H, N, M] "may attend".
    """
    raise NotImplementedError

  # ---- parameters -------------------------------------------------------------------------------------

  @property
  def partitioned(self) -> bool:
    """Whether the caller's initialisers carry partitioning metadata: then every parameter is boxed."""
    inits = (self.kernel_init, self.bias_init, self.out_kernel_init, self.out_bias_init)
    return self.partition_params or any(is_boxed_init(init) for init in inits)

  def logical(self, init, names: tuple[str | None, ...]):
    """`init` boxed with the logical axis `names` when the layer is partitioned and `init` is not boxed yet."""
    if self.partitioned and not is_boxed_init(init):
      return nn.with_logical_partitioning(init, names)
    return init

  def linear_inits(self, fan_in: int, kernel_names, bias_names):
    """(kernel_init, bias_init) of a mechanism's own Linear (`init_style`, the caller's initialisers unboxed)."""
    kernel, bias = linear_inits(self.init_style, fan_in, plain_init(self.kernel_init), plain_init(self.bias_init))
    return self.logical(kernel, kernel_names), self.logical(bias, bias_names)

  def _projection_inits(self, fan_in: int, kernel_init, bias_init, kernel_names, bias_names):
    kernel, bias = linear_inits(self.init_style, fan_in, kernel_init, bias_init)
    return self.logical(kernel, kernel_names), self.logical(bias, bias_names)

  # ---- shared pieces of the cores -------------------------------------------------------------------------

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

  def repeat_kv(self, x: jax.Array | None, axis: int = -2) -> jax.Array | None:
    """[B, M, H_kv, p] -> [B, M, H, p] (heads on `axis`), each key/value head shared by its group of query heads."""
    if x is None or x.shape[axis] == self.num_heads:
      return x
    return jnp.repeat(x, self.num_heads // x.shape[axis], axis=axis)

  def kv_state(self, name: str, zeros: jax.Array):
    """A decoding-state variable `name` of the `cache` collection whose zeros are [B, H, ...] (heads on axis 1):
    (its value [B, H, ...], `store(new)`), kept as [B, H_kv, ...] with grouped key/value heads.

    Only for a state computed from keys and values alone: the query heads of a group then hold equal states, so
    one per key/value head is kept (the cache shrinks by H / H_kv) and repeated on reading. `store` is a no-op in
    the initialising call (its state stays zero).
    """
    kv_heads = self.num_kv_heads or self.num_heads
    group = self.num_heads // kv_heads
    initialized = self.has_variable("cache", name)
    shrink = lambda x: x.reshape(x.shape[0], kv_heads, group, *x.shape[2:])[:, :, 0]  # noqa: E731
    variable = self.variable("cache", name, lambda: shrink(zeros) if zeros.ndim > 1 else zeros)

    def store(new: jax.Array) -> None:
      if initialized:
        variable.value = (shrink(new) if new.ndim > 1 else new).astype(variable.value.dtype)

    value = variable.value
    return (self.repeat_kv(value, axis=1) if value.ndim > 1 else value), store

  # ---- the call ----------------------------------------------------------------------------------------

  def _check_fields(self) -> None:
    name = type(self).__name__
    check_positive(self.num_heads, "num_heads")
    if self.causal and not self.supports_causal:
      raise ValueError(f"causal=True is not supported by {name} (non-causal only)")
    if self.decode and not self.supports_decode:
      raise ValueError(f"decode=True is not supported by {name} (it keeps no decoding cache)")
    if self.decode and not self.causal and self.decode_needs_causal:
      raise ValueError(f"decode=True needs causal=True ({name} decodes its causal form only)")
    if not self.softmax_hooks:
      for hook in SOFTMAX_HOOKS:
        if getattr(self, hook) is not None:
          raise ValueError(f"{hook} is not supported by {name}: it replaces a softmax core, which {name} has not")
    if self.num_kv_heads is not None:
      check_positive(self.num_kv_heads, "num_kv_heads")
      check_divisible(self.num_heads, self.num_kv_heads, "num_heads", "num_kv_heads")
      if self.num_kv_heads != self.num_heads and not self.supports_kv_groups:
        raise ValueError(
          f"num_kv_heads={self.num_kv_heads} (< num_heads={self.num_heads}) is not supported by {name}: "
          f"{self.kv_groups_refusal}"
        )
    self.validate()

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
      inputs_q: [batch_sizes..., N, D] queries input (any number of batch axes, none included).
      inputs_k: [batch_sizes..., M, D_k] keys input (default `inputs_q`).
      inputs_v: [batch_sizes..., M, D_v] values input (default `inputs_k`; ignored without a value
        projection); given without `inputs_k` it is refused, as in Flax.
      inputs_kv: Flax's deprecated alias setting both `inputs_k` and `inputs_v`.
      mask: [batch_sizes..., M] key padding (True = real) or a Flax attention mask broadcasting to
        [batch_sizes..., H, N, M]; each mechanism documents what it does with it.
      deterministic: disables dropout; merged with the attribute.
      dropout_rng: optional explicit dropout key.
      sow_weights: sow the attention weights in `intermediates` where the mechanism forms them.
    Returns:
      [batch_sizes..., N, out_features].
    """
    self._check_fields()
    inputs_k, inputs_v = resolve_inputs(inputs_q, inputs_k, inputs_v, inputs_kv, debug_checks=self.debug_checks)
    if self.self_attention_only and inputs_k.shape != inputs_q.shape:
      raise ValueError(
        f"inputs_k must have the shape of inputs_q {inputs_q.shape} ({type(self).__name__} is self-attention "
        f"only), got {inputs_k.shape}"
      )
    width = inputs_q.shape[-1]
    features = self.qkv_features or width
    check_divisible(features, self.num_heads, "qkv_features", "num_heads")
    p = features // self.num_heads
    kv_heads = self.num_kv_heads or self.num_heads
    sources = {"query": inputs_q, "key": inputs_k, "value": inputs_v}
    used = [sources[name] for name in self.projections]
    dtype = compute_dtype(self.dtype, *used, self.param_dtype)

    kernel_init, bias_init = self._projection_inits(
      width, self.kernel_init, self.bias_init, ("embed", "heads", "kv"), ("heads", "kv")
    )
    project = functools.partial(
      nn.DenseGeneral,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      precision=self.precision,
      use_bias=self.use_bias,
      kernel_init=kernel_init,
      bias_init=bias_init,
      dot_general=self.qkv_dot_general,
      dot_general_cls=self.qkv_dot_general_cls,
    )
    projected = {
      name: project(features=(self.num_heads if name == "query" else kv_heads, p), name=name)(sources[name])
      for name in self.projections
    }  # [batch_sizes..., N|M, H|H_kv, p]
    if self.normalize_qk:
      ln = functools.partial(nn.LayerNorm, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype)
      ln = functools.partial(ln, scale_init=self.logical(nn.initializers.ones, ("kv",)))
      for name in ("query", "key"):
        if name in projected:
          projected[name] = ln(name=f"{name}_ln")(projected[name])
    check_batch_and_length(inputs_q, projected)
    batch = tuple(inputs_q.shape[:-2])
    q_len, k_len = inputs_q.shape[-2], inputs_k.shape[-2]
    projected = {name: flat_batch(x, 3).astype(dtype) for name, x in projected.items()}  # [B, N|M, H, p]
    if not self.native_kv_groups:  # grouped key/value heads shared by repetition: [B, M, H_kv, p] -> [B, M, H, p]
      projected.update({name: self.repeat_kv(projected[name]) for name in ("key", "value") if name in projected})
    heads_out = self.attend(
      projected["query"],
      projected.get("key"),
      projected.get("value"),
      inputs_k=flat_batch(inputs_k, 2),
      mask=flat_mask(mask, batch, q_len, k_len),
      deterministic=deterministic,
      dropout_rng=dropout_rng,
      sow_weights=sow_weights,
    )  # [B, N, H, p]
    if sow_weights and len(batch) != 1:
      self._unfold_sown(batch)
    heads_out = heads_out.reshape((*batch, *heads_out.shape[1:]))
    out_kernel, out_bias = self._projection_inits(
      features,
      self.out_kernel_init or self.kernel_init,
      self.out_bias_init or self.bias_init,
      ("heads", "kv", "embed"),
      ("embed",),
    )
    return nn.DenseGeneral(
      features=self.out_features or width,
      axis=(-2, -1),
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      precision=self.precision,
      use_bias=self.use_bias,
      kernel_init=out_kernel,
      bias_init=out_bias,
      dot_general=self.out_dot_general,
      dot_general_cls=self.out_dot_general_cls,
      name="out",
    )(heads_out.astype(dtype))

  def _unfold_sown(self, batch: tuple[int, ...]) -> None:
    """The attention weights a core sowed on the folded batch, [B, ...] -> [batch_sizes..., ...], as Flax's."""
    if not self.has_variable("intermediates", "attention_weights"):
      return
    sown = self.get_variable("intermediates", "attention_weights")
    last = sown[-1].reshape((*batch, *sown[-1].shape[1:]))
    self.put_variable("intermediates", "attention_weights", (*sown[:-1], last))
