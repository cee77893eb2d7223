"""`Attention`: the NNX shell of every registered attention, written once.

An NNX layer takes `nnx.MultiHeadAttention`'s constructor and call. Its math is the Linen layer's, run,
not copied: the layer keeps the registered Linen class and its options, holds that class's variables as
NNX Variables (`nnx.Param` with the Linen logical axis names as `out_sharding`, `nnx.Cache` for the
decoding state, `KSVDVariable` for the KSVD terms) under the Linen names, and each call applies the Linen
module to them (`Module.apply` with those variables) and writes the mutated collections back. So a
mechanism registered with `primal_jax.attention.register_attention` has an NNX layer with no NNX code,
the NNX and Linen layers agree to the last bit on the same weights, and a Linen checkpoint's attention
parameters are the NNX layer's state (`primal_jax.nnx.convert`).

NNX-only: the constructor (eager initialisation from `rngs`, with `in_features`), the per-call `is_causal`
and `decode`, `init_cache`, dropout keys from `nnx.Rngs`, and where the collections live. Random state a
mechanism replays (Performer's feature matrix, Reformer's rotations: the Linen `random_state` collection) is a
`RandomState` Variable (not an `nnx.Param`: never trained); keys a mechanism draws at every call (Reformer's
rotations="per_call": the "redraw" stream) come from `nnx.Rngs` like the dropout keys.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from primal_jax.attention.baselines.common import RANDOM_STATE_COLLECTION
from primal_jax.attention.shell import AttentionShell
from primal_jax.ksvd import KSVD_COLLECTION, collect_terms
from primal_jax.nnx.arguments import FLAX_DEFAULTS, forwarded_fields, has_stream, plain_init, variable_metadata
from primal_jax.nnx.decoding import past_cache_message, refuse_rows
from primal_jax.nnx.ksvd import EMPTY_TERMS, KSVDVariable
from primal_jax.nnx.trees import assign, flat_sown, to_tree, to_variables
from primal_jax.validation import check_rate

# Linen fields the NNX constructor sets from its own arguments (the rest are the mechanism's options).
SHELL_ARGS = frozenset(
  {"num_heads", "qkv_features", "out_features", "dtype", "param_dtype", "broadcast_dropout", "dropout_rate"}
  | {"deterministic", "precision", "kernel_init", "bias_init", "use_bias", "decode", "causal", "parent", "name"}
  | {"num_kv_heads", *FLAX_DEFAULTS}
)
PROJECTIONS = ("query", "key", "value")


class RandomState(nnx.Variable):
  """Random state a layer replays instead of drawing it (the Linen `random_state` collection): Performer's
  "projection" [m, p], Reformer's "rotations" [H, p, R, nb / 2]. Not a parameter: optimisers over `nnx.Param`
  leave it alone."""


def _first(*values, default=None):
  return next((v for v in values if v is not None), default)


class Attention(nnx.Module):
  """A registered attention mechanism as an NNX layer (subclasses set `linen_class`).

  `num_heads`, `in_features`, `qkv_features`, `out_features`, `in_kv_features`, `dtype`, `param_dtype`,
  `broadcast_dropout`, `dropout_rate`, `deterministic`, `precision`, `kernel_init`, `bias_init`, `use_bias`,
  `decode`, `rngs` and `keep_rngs` are those of `nnx.MultiHeadAttention` (`kernel_init` / `bias_init` None:
  the mechanism's `init_style` default, which for "flax" is nnx's lecun-normal / zeros). `num_kv_heads` may
  only be `num_heads` (no grouped-query form). `kernel_metadata`, `bias_metadata`, `out_kernel_metadata`
  and `out_bias_metadata` (and `nnx.with_partitioning` initialisers) give extra Variable metadata to the
  query/key/value and output projections, e.g. `{"out_sharding": (...)}` in place of the logical names
  ("embed", "heads", "kv") the Linen layer gives them.

  Args:
    causal: the default of the call's `is_causal` (for the causal layer of a decoder block that passes a
      causal mask, as `nnx.MultiHeadAttention` decoders do).
    random_state: the Linen `random_state` collection of the layer (e.g. `{"rotations": R}`), held as
      `RandomState` Variables and used at every call in place of the mechanism's own draw; `set_random_state`
      replaces it.
    init_length: the sequence length of the example input that initialises the parameters (default: the
      first of 1 and the layer's integer options that the mechanism accepts, e.g. Nystromformer's
      `num_landmarks`); no parameter depends on it.
    options: the mechanism's own options (the Linen class's attributes, e.g. `low_rank`, `init_style`).

  Raises:
    ValueError: an option the mechanism does not have, an nnx argument it cannot honour, or what the Linen
      layer refuses for these options (checked at construction on an example input).
  """

  linen_class: ClassVar[type[AttentionShell]]

  def __init__(
    self,
    num_heads: int,
    in_features: int,
    qkv_features: int | None = None,
    out_features: int | None = None,
    num_kv_heads: int | None = None,
    in_kv_features: int | None = None,
    *,
    dtype: Any = None,
    param_dtype: Any = jnp.float32,
    broadcast_dropout: bool = True,
    dropout_rate: float = 0.0,
    deterministic: bool | None = None,
    precision: Any = None,
    kernel_init: Any = None,
    out_kernel_init: Any = None,
    bias_init: Any = None,
    out_bias_init: Any = None,
    use_bias: bool = True,
    attention_fn: Any = FLAX_DEFAULTS["attention_fn"],
    decode: bool | None = None,
    normalize_qk: bool = False,
    qkv_promote_dtype: Any = FLAX_DEFAULTS["qkv_promote_dtype"],
    out_promote_dtype: Any = FLAX_DEFAULTS["out_promote_dtype"],
    ln_promote_dtype: Any = FLAX_DEFAULTS["ln_promote_dtype"],
    qkv_dot_general: Any = None,
    out_dot_general: Any = None,
    qkv_dot_general_cls: Any = None,
    out_dot_general_cls: Any = None,
    rngs: nnx.Rngs,
    keep_rngs: bool = True,
    kernel_metadata: Mapping[str, Any] = MappingProxyType({}),
    out_kernel_metadata: Mapping[str, Any] = MappingProxyType({}),
    bias_metadata: Mapping[str, Any] = MappingProxyType({}),
    out_bias_metadata: Mapping[str, Any] = MappingProxyType({}),
    query_ln_scale_metadata: Mapping[str, Any] = MappingProxyType({}),
    key_ln_scale_metadata: Mapping[str, Any] = MappingProxyType({}),
    causal: bool = False,
    random_state: Mapping[str, Any] | None = None,
    init_length: int | None = None,
    **options: Any,
  ):
    name = type(self).__name__
    check_rate(dropout_rate, "dropout_rate")
    accepted = sorted({f.name for f in dataclasses.fields(self.linen_class)} - SHELL_ARGS)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
      raise ValueError(f"{name}: {unknown[0]!r} is not an option of this attention; accepted: {', '.join(accepted)}")
    flax_args = dict(
      out_kernel_init=out_kernel_init,
      out_bias_init=out_bias_init,
      attention_fn=attention_fn,
      normalize_qk=normalize_qk,
      qkv_promote_dtype=qkv_promote_dtype,
      out_promote_dtype=out_promote_dtype,
      ln_promote_dtype=ln_promote_dtype,
      qkv_dot_general=qkv_dot_general,
      out_dot_general=out_dot_general,
      qkv_dot_general_cls=qkv_dot_general_cls,
      out_dot_general_cls=out_dot_general_cls,
    )
    forwarded = forwarded_fields(name, self.linen_class, num_heads, num_kv_heads, flax_args)
    self.num_heads, self.in_features = num_heads, in_features
    self.num_kv_heads = num_kv_heads if num_kv_heads is not None else num_heads
    self.in_kv_features = in_kv_features if in_kv_features is not None else in_features
    self.qkv_features = qkv_features if qkv_features is not None else in_features
    self.out_features = out_features if out_features is not None else in_features
    self.dtype, self.param_dtype, self.dropout_rate = dtype, param_dtype, dropout_rate
    self.deterministic, self.decode, self.causal = deterministic, decode, causal
    wrapped: dict[str, dict] = {}  # metadata that nnx.with_partitioning-style initialisers attach
    kernel_init, bias_init = plain_init(kernel_init, wrapped, "kernel"), plain_init(bias_init, wrapped, "bias")
    for key in ("out_kernel_init", "out_bias_init"):
      if key in forwarded:
        forwarded[key] = plain_init(forwarded[key], wrapped, key.removesuffix("_init"))
    fields = dict(
      num_heads=num_heads,
      qkv_features=qkv_features,
      out_features=out_features,
      dtype=dtype,
      param_dtype=param_dtype,
      broadcast_dropout=broadcast_dropout,
      dropout_rate=dropout_rate,
      precision=precision,
      kernel_init=kernel_init,
      bias_init=bias_init,
      use_bias=use_bias,
      **forwarded,
      **options,
    )
    if "partition_params" in {f.name for f in dataclasses.fields(self.linen_class)}:
      fields["partition_params"] = True  # the logical axis names, kept as the Params' out_sharding metadata
    self.linen_fields = tuple(sorted(fields.items()))  # static: the Linen layer is rebuilt from them per call
    self.linen_layer()  # the dataclass checks its fields
    variables, keeps_terms = self._init_variables(rngs.params(), init_length)
    ln_scale = {"query_ln": query_ln_scale_metadata, "key_ln": key_ln_scale_metadata}
    override = variable_metadata(
      wrapped, kernel_metadata, bias_metadata, out_kernel_metadata, out_bias_metadata, ln_scale
    )
    params = to_variables(variables["params"], nnx.Param, override)
    self.param_names = tuple(params.keys())
    for key in self.param_names:
      if hasattr(self, key):
        raise ValueError(f"{name}: the Linen parameter {key!r} clashes with an attribute of the NNX layer")
      setattr(self, key, params[key])
    self.rngs = rngs.dropout.fork() if keep_rngs and dropout_rate > 0 else None
    streams = self.linen_layer().rng_streams()
    self.stream_rngs = nnx.Dict({s: rngs[s].fork() for s in streams if has_stream(rngs, s)}) if keep_rngs else None
    self.cache: nnx.Dict | None = nnx.data(None)
    self.cache_batch: nnx.Cache | None = nnx.data(None)
    self.cache_position: nnx.Cache | None = nnx.data(None)
    self.cache_length = 0  # [batch...] zeros: the cache's batch axes, batch-leading
    self.random_state: nnx.Dict | None = nnx.data(None)
    if keeps_terms:  # a fresh layer holds every Variable a called one does (orbax restores into it)
      self.ksvd = KSVDVariable(EMPTY_TERMS)
    if random_state is not None:
      self.set_random_state(random_state)

  def set_random_state(self, tree: Mapping[str, Any] | None) -> None:
    """Replaces the layer's random state (a Linen `random_state` collection; None: the mechanism draws its own)."""
    self.random_state = None if tree is None else to_variables(tree, RandomState)

  def linen_layer(self, *, causal: bool = False, decode: bool = False) -> AttentionShell:
    """The (unbound) Linen layer this NNX layer applies: the same class, options and weights layout."""
    return self.linen_class(**dict(self.linen_fields), causal=causal, decode=decode)

  def _init_variables(self, key: jax.Array, init_length: int | None) -> tuple[dict, bool]:
    """(the Linen layer's initial variables, whether its full-sequence calls keep KSVD terms)."""
    lengths = [init_length] if init_length is not None else self._probe_lengths()
    errors = []
    for length in lengths:
      q = jnp.zeros((1, length, self.in_features), jnp.float32)
      k = None if self.in_kv_features == self.in_features else jnp.zeros((1, length, self.in_kv_features))
      try:
        layer = self.linen_layer(causal=self.causal)  # a causal-only form (the release's RL Flowformer) too
        variables = layer.init({"params": key, "dropout": key}, q, k, deterministic=True)
      except ValueError as err:
        errors.append(err)
        continue
      keys = {stream: key for stream in ("dropout", *layer.rng_streams())}
      apply = functools.partial(layer.apply, deterministic=True, rngs=keys, mutable=[KSVD_COLLECTION])
      _, found = jax.eval_shape(apply, variables, q, k)
      return variables, bool(collect_terms(found.get(KSVD_COLLECTION, {})))
    raise errors[0]

  def _probe_lengths(self) -> list[int]:
    ints = {v for _, v in self.linen_fields if isinstance(v, int) and not isinstance(v, bool) and 1 < v <= 1 << 16}
    return [1, *sorted(ints)]

  def params_tree(self) -> dict:
    """The Linen `params` collection of this layer (plain arrays)."""
    return {key: to_tree(getattr(self, key)) for key in self.param_names}

  def __call__(
    self,
    inputs_q: jax.Array,
    inputs_k: jax.Array | None = None,
    inputs_v: jax.Array | None = None,
    *,
    mask: jax.Array | None = None,
    deterministic: bool | None = None,
    rngs: nnx.Rngs | nnx.RngStream | None = None,
    sow_weights: bool = False,
    decode: bool | None = None,
    is_causal: bool | None = None,
    out_sharding: Any = None,
    qkv_sharding: Any = None,
  ) -> jax.Array:
    """Applies the attention, as `nnx.MultiHeadAttention.__call__`.

    Args:
      inputs_q: [B, N, in_features]; inputs_k, inputs_v: [B, M, in_kv_features] (default: inputs_q,
        then inputs_k; a mechanism without a value projection ignores inputs_v).
      mask: [B, M] key padding or [B, 1|H, N, M] attention mask (True = may attend); each mechanism
        honours it or refuses it with a ValueError, as its Linen layer does.
      deterministic: disables dropout (default: the attribute; required when dropout_rate > 0).
      rngs: dropout keys (an `nnx.Rngs`, whose `dropout` stream is used, or a stream); default the
        constructor's. The keys a mechanism draws at every call (`rng_streams`, e.g. "redraw") come from
        the `nnx.Rngs` stream of that name, else from the constructor's.
      sow_weights: sow what the Linen layer puts in `intermediates` (attention weights, Primal's e/r
        scores) as `nnx.Intermediate`s.
      decode: decode from the cache `init_cache` made (default: the attribute); the layer is causal then.
      is_causal: causal attention (default: the constructor's `causal`); refused by non-causal mechanisms.
      out_sharding, qkv_sharding: nnx's sharding of the output / projections under an explicit-axes mesh;
        only None (the Linen layer's projections take no sharding argument; reshard the output instead).
    Returns:
      [B, N, out_features]. A full-sequence call of a Primal layer also replaces `self.ksvd`.
    """
    name = type(self).__name__
    for key, value in (("out_sharding", out_sharding), ("qkv_sharding", qkv_sharding)):
      if value is not None:
        raise ValueError(f"{name}: {key}={value!r} is not supported (accepted: None; reshard the output instead)")
    if inputs_k is None and inputs_v is not None:
      raise ValueError(f"{name}: inputs_k cannot be None when inputs_v is given (pass inputs_k)")
    if inputs_q.shape[-1] != self.in_features:
      width = inputs_q.shape[-1]
      raise ValueError(f"{name}: inputs_q has {width} features, the layer's in_features is {self.in_features}")
    decode = bool(_first(decode, self.decode, default=False))
    deterministic, dropout_key = self._dropout_key(deterministic, rngs)
    causal = bool(_first(is_causal, default=self.causal)) or decode
    variables, mutable = {"params": self.params_tree()}, ["intermediates"] if sow_weights else []
    if self.random_state is not None:
      variables[RANDOM_STATE_COLLECTION] = to_tree(self.random_state)
    layer = self.linen_layer(causal=causal, decode=decode)
    keys = self._stream_keys(layer, rngs)
    if dropout_key is not None:
      keys["dropout"] = dropout_key
    if decode:
      if self.cache is None:
        raise ValueError(f"{name}: decode=True needs a cache: call init_cache(input_shape) first")
      if self.cache_batch is not None and tuple(inputs_q.shape[:-2]) != self.cache_batch.shape:
        raise ValueError(
          f"{name}: decode inputs have batch axes {tuple(inputs_q.shape[:-2])}, the cache holds "
          f"{self.cache_batch.shape} (decode that batch, or call init_cache for this one)"
        )
      variables["cache"] = to_tree(self.cache)
      ok = self._advance_position(inputs_q.shape[-2])
      mutable.append("cache")
    else:
      mutable.append(KSVD_COLLECTION)
    out, updates = layer.apply(
      variables,
      inputs_q,
      inputs_k,
      inputs_v,
      mask=mask,
      deterministic=deterministic,
      sow_weights=sow_weights,
      rngs=keys or None,
      mutable=mutable,
    )
    if decode:
      assign(self.cache, updates["cache"], f"{name} cache")
      out = refuse_rows(out, ok, past_cache_message(name, self.cache_length))
    terms = collect_terms(updates.get(KSVD_COLLECTION, {}))
    if terms:
      if isinstance(getattr(self, "ksvd", None), KSVDVariable):
        self.ksvd.set_value(terms[0])  # replaced, never appended
      else:
        self.ksvd = KSVDVariable(terms[0])
    for path, values in flat_sown(updates.get("intermediates", {})):
      for value in values:
        self.sow(nnx.Intermediate, "_".join(path), value)
    return out

  def _stream_keys(self, layer: AttentionShell, rngs) -> dict[str, jax.Array]:
    keys = {}
    for stream in layer.rng_streams():
      if isinstance(rngs, nnx.Rngs) and has_stream(rngs, stream):
        keys[stream] = rngs[stream]()
      elif self.stream_rngs is not None and stream in self.stream_rngs:
        keys[stream] = self.stream_rngs[stream]()
      elif self.random_state is None:  # given random state needs no key
        raise ValueError(
          f"{type(self).__name__}: these options draw from the {stream!r} RNG stream at every call: pass "
          f"rngs=nnx.Rngs({stream}=...) to the call or the constructor (keep_rngs=True)"
        )
    return keys

  def _dropout_key(self, deterministic, rngs) -> tuple[bool, jax.Array | None]:
    if self.dropout_rate <= 0.0:
      return True, None
    deterministic = _first(deterministic, self.deterministic)
    if deterministic is None:
      raise ValueError(
        f"{type(self).__name__}: dropout_rate > 0 needs deterministic, as a call argument or the attribute"
      )
    if deterministic:
      return True, None
    stream = rngs.dropout if isinstance(rngs, nnx.Rngs) else _first(rngs, self.rngs)
    if stream is None:
      raise ValueError(f"{type(self).__name__}: dropout needs rngs (a call argument, or keep_rngs=True)")
    return False, stream()

  def init_cache(self, input_shape: tuple[int, ...], dtype: Any = jnp.float32) -> None:
    """Creates the decoding state for inputs of `input_shape` = [batch_sizes..., max_length, in_features] in `dtype`.

    Decoding then takes inputs of exactly those batch axes (another batch is refused, as Flax refuses it).

    It is what the Linen layer keeps in its `cache` collection: a key/value cache for softmax layers,
    Primal-Attention's running sums (O(1) in max_length), ...; a mechanism without a decoding form, or
    options without a causal form, is refused with the Linen layer's ValueError.
    """
    layer = self.linen_layer(causal=True, decode=True)
    x = jnp.zeros(tuple(input_shape), dtype)
    _, created = layer.apply({"params": self.params_tree()}, x, deterministic=True, mutable=["cache"])
    self.cache = to_variables(created["cache"], nnx.Cache)
    # A batch-leading leaf (beam searches gather and tile it with the rest of the cache) whose shape is the batch.
    self.cache_batch = nnx.Cache(jnp.zeros(tuple(input_shape[:-2]), bool))
    self.cache_length, self.cache_position = int(input_shape[-2]), nnx.Cache(jnp.zeros((), jnp.int32))

  def _advance_position(self, chunk: int) -> jax.Array:
    """Moves the decode position by `chunk`; whether the chunk fits in the cache's length (concrete: raises)."""
    start = self.cache_position.get_value()
    ok = start + chunk <= self.cache_length
    if not isinstance(ok, jax.core.Tracer) and not ok:  # concrete: refused before anything is written
      raise ValueError(past_cache_message(type(self).__name__, self.cache_length) + f" (at position {int(start)})")
    self.cache_position.set_value(start + chunk)
    return ok

  def set_view(self, deterministic=None, decode=None, batch_size=None, max_length=None):
    """For `nnx.view`, as `nnx.MultiHeadAttention.set_view` (a cache is created when decode=True needs one)."""
    if deterministic is not None:
      self.deterministic = deterministic
    if decode is not None:
      self.decode = decode
      if decode and self.cache is None:
        if batch_size is None or max_length is None:
          raise TypeError("'batch_size' and 'max_length' must be provided when initializing the cache")
        batch = (batch_size,) if isinstance(batch_size, int) else tuple(batch_size)
        self.init_cache((*batch, max_length, self.in_features), self.dtype or jnp.float32)
