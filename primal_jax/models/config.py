"""Frozen model hyper-parameters, shared by every model family.

Each layer names its attention (and that attention's options), so PrimalFormer
(all Primal), Primal.+X (last layer Primal), the softmax Transformer and the
baselines are configs, not separate model classes.
"""

from __future__ import annotations

import dataclasses
import types
import warnings
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from primal_jax.attention.registry import ATTENTIONS, LayerSpec, check_options, get_attention
from primal_jax.dropout import DROPOUT_IMPLS
from primal_jax.initializers import INIT_STYLES, partitioned_attention_inits
from primal_jax.validation import check_choice, check_divisible, check_positive, check_rate

STACKS = ("primalformer", "primal_plus")  # besides any registered attention name
POOLINGS = ("mean", "masked_mean", "cls")
NORM_POSITIONS = ("pre", "post")
NORM_TYPES = ("layer", "batch")
# MLP activations: "gelu" (exact erf unless exact_gelu=False), "gelu_tanh" (Flax's default form), "relu" (the
# release's RL Decision Transformer, GPT-2 activation_function="relu").
ACTIVATIONS = ("gelu", "gelu_tanh", "relu")
# The dtypes a model computes in or keeps its parameters in, by name; a config holds the jnp type. float64 only
# means float64 with jax_enable_x64 (the numerics tests); the configs' builders offer the first three.
FLOAT_DTYPES = types.MappingProxyType(
  {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16, "float64": jnp.float64}
)


def float_dtype(value, name: str):
  """The jnp float type `value` names (a name in FLOAT_DTYPES, or a NumPy/JAX dtype or type equal to one).

  Anything else (an alias such as "bf16", an integer or bool dtype) is a ValueError naming `name` and the
  accepted values: it would otherwise pass here and fail at the first init or train step.
  """
  if isinstance(value, str):
    found = FLOAT_DTYPES.get(value)
  else:
    try:
      dtype = np.dtype(value)
    except TypeError:
      dtype = None
    found = FLOAT_DTYPES.get(dtype.name) if dtype is not None else None
  if found is None:
    raise ValueError(f"{name} must be one of {', '.join(FLOAT_DTYPES)} (a name or a jnp/np type), got {value!r}")
  return found


def model_layers(model: str, num_layers: int, num_primal: int = 1) -> tuple[str, ...]:
  """Per-layer attention names of a model named as in the paper.

  "primalformer": every layer Primal; "primal_plus": the last `num_primal`
  layers Primal, the rest softmax (Primal.+X with X the softmax Transformer);
  any registered attention name: every layer uses it ("softmax" is Trans.).
  """
  check_positive(num_layers, "num_layers")
  if model == "primalformer":
    return ("primal",) * num_layers
  if model == "primal_plus":
    check_positive(num_primal, "num_primal")
    if num_primal > num_layers:
      raise ValueError(f"num_primal ({num_primal}) must be <= num_layers ({num_layers})")
    return ("softmax",) * (num_layers - num_primal) + ("primal",) * num_primal
  if model not in ATTENTIONS:
    raise ValueError(f"model must be one of {', '.join(STACKS + tuple(ATTENTIONS))}, got {model!r}")
  return (model,) * num_layers


def stack_name(layers) -> str:
  """The inverse of `model_layers` for logs and labels: "primalformer", "primal_plus", an attention name,
  or the layers joined by "+" for any other stack."""
  names = tuple(getattr(entry, "attention", entry) for entry in layers)
  if names and all(name == names[0] for name in names):
    return "primalformer" if names[0] == "primal" else names[0]
  first_primal = names.index("primal") if "primal" in names else len(names)
  if set(names[first_primal:]) == {"primal"} and set(names[:first_primal]) == {"softmax"}:
    return "primal_plus"
  return "+".join(names)


def _frozen_options(attention: Mapping | tuple) -> tuple[tuple[str, tuple], ...]:
  """{name: {option: value}} as sorted nested tuples (hashable), each name's options checked."""
  items = attention.items() if isinstance(attention, Mapping) else attention
  out = []
  for name, options in items:
    options = dict(options) if not isinstance(options, Mapping) else options
    out.append((name, tuple(sorted(check_options(name, options, f"attention[{name!r}]").items()))))
  return tuple(sorted(out))


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Hyper-parameters of a Transformer whose layers each name their attention.

  `layers` holds one entry per layer: an attention name, a (name, options)
  pair or a `LayerSpec`; `attention` gives options per attention name, applied
  to every layer of that name before the layer's own. Both are normalised to
  `LayerSpec`s in `layers`, so `config.layers[i].kwargs` is what layer i's
  attention receives. Defaults are the release's LRA ListOps PrimalFormer
  (2 layers, dim 64, hidden 128, 2 heads x 32, s = 20, rank_multi 10).

  `dtype` and `param_dtype` are float types by name or type (`FLOAT_DTYPES`), stored as the jnp type;
  anything else is refused here. A Primal layer with data-independent weights and `low_rank` s larger than
  its head width p warns (UserWarning): W_e and W_r are [H, p, s], so e = phi(q) W_e has rank <= p and the
  s - p extra directions add parameters and KSVD terms but no rank. It is a warning, not an error, because
  the D4RL configs run Table 7's s = 96 at p = 64 (data-dependent layers are bounded by n instead, which
  PrimalAttention checks).
  """

  layers: tuple = ("primal", "primal")
  attention: Any = ()  # {name: {option: value}}
  vocab_size: int = 32
  max_len: int = 512
  dim: int = 64
  hidden_dim: int = 128
  num_heads: int = 2
  # Regularisation and numerics.
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1  # every attention's dropout_rate unless its options set one
  # Stochastic depth (DeiT's drop path): block i drops each residual branch per sample at rate
  # drop_path_rate * i / (num_layers - 1), torch.linspace(0, rate, depth) as timm's decay rule.
  drop_path_rate: float = 0.0
  # Dropout mask generator everywhere: "threefry" (= nn.Dropout) or "hash" (a counter hash keyed by the
  # same PRNG key, several times cheaper on CPU; see primal_jax/dropout.py).
  dropout_impl: str = "threefry"
  layer_norm_eps: float = 1e-5  # PyTorch default (Flax's is 1e-6)
  # "pre": x + f(LN(x)) (the release's LRA blocks); "post": LN(x + f(x)) (its time-series blocks).
  norm_position: str = "pre"
  # "batch": BatchNorm over (batch, positions) in the blocks (mvts_transformer's option; needs the
  # mutable `batch_stats` collection when training). The final norm stays a LayerNorm.
  norm_type: str = "layer"
  exact_gelu: bool = True  # PyTorch nn.GELU (Flax's default is the tanh form)
  activation: str = "gelu"  # one of ACTIVATIONS
  init_style: str = "torch"
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  # Heads.
  pooling: str = "mean"
  num_classes: int = 10
  mask_final: bool = True  # release: final LayerNorm output multiplied by the mask

  def __post_init__(self):
    check_positive(self.dim, "dim")
    check_positive(self.num_heads, "num_heads")
    check_divisible(self.dim, self.num_heads, "dim", "num_heads")
    for rate in ("dropout_rate", "attention_dropout_rate", "drop_path_rate"):
      check_rate(getattr(self, rate), rate)
    if isinstance(self.layers, str) or not self.layers:
      raise ValueError(
        f"layers must be a non-empty sequence of attention names or (name, options), got {self.layers!r}"
      )
    attention = _frozen_options(self.attention)
    defaults = {name: dict(options) for name, options in attention}
    for name in defaults:
      get_attention(name)
    layers = tuple(LayerSpec.of(entry, defaults.get(_name_of(entry))) for entry in self.layers)
    object.__setattr__(self, "attention", attention)
    object.__setattr__(self, "layers", layers)
    object.__setattr__(self, "dtype", float_dtype(self.dtype, "dtype"))
    object.__setattr__(self, "param_dtype", float_dtype(self.param_dtype, "param_dtype"))
    for i in range(len(layers)):  # option values fail here, not at the first call
      attention = self.layer_attention(i)
      attention.validate()
      check_rate(attention.dropout_rate, f"layers[{i}] ({layers[i].attention}) attention option dropout_rate")
      self._warn_rank_beyond_head_width(i, attention)
    check_choice(self.pooling, POOLINGS, "pooling")
    check_choice(self.init_style, INIT_STYLES, "init_style")
    check_choice(self.norm_position, NORM_POSITIONS, "norm_position")
    check_choice(self.norm_type, NORM_TYPES, "norm_type")
    check_choice(self.activation, ACTIVATIONS, "activation")
    check_choice(self.dropout_impl, DROPOUT_IMPLS, "dropout_impl")

  def _warn_rank_beyond_head_width(self, index: int, attention) -> None:
    """The class doc's warning, for a data-independent layer with low_rank > its head width."""
    if not hasattr(attention, "low_rank") or getattr(attention, "data_dependent", True):
      return
    width = (getattr(attention, "qkv_features", None) or self.dim) // self.num_heads
    if attention.low_rank > width:
      warnings.warn(
        f"layer {index}: low_rank s={attention.low_rank} exceeds the head width p={width} with data-independent "
        f"weights: W_e, W_r are [p, s] per head, so e and r have rank <= {width}; the {attention.low_rank - width} "
        "extra directions add parameters and KSVD terms, no rank",
        UserWarning,
        stacklevel=4,
      )

  @property
  def num_layers(self) -> int:
    return len(self.layers)

  def drop_path(self, index: int) -> float:
    """Block `index`'s drop-path rate: linear from 0 (first block) to `drop_path_rate` (last)."""
    if self.num_layers == 1:
      return 0.0
    return self.drop_path_rate * index / (self.num_layers - 1)

  @property
  def layer_names(self) -> tuple[str, ...]:
    return tuple(spec.attention for spec in self.layers)

  def layer_attention(self, index: int, *, causal: bool = False, decode: bool = False, name: str = "attention"):
    """The attention module of layer `index` (unbound; create it inside a compact method)."""
    return self.layers[index].build(
      num_heads=self.num_heads,
      causal=causal,
      decode=decode,
      dropout_rate=self.attention_dropout_rate,
      dropout_impl=self.dropout_impl,
      init_style=self.init_style,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      max_len=self.max_len,
      **partitioned_attention_inits(),  # parameters boxed with their logical axes, for sharded training
      name=name,
    )


def _name_of(entry) -> str | None:
  if isinstance(entry, LayerSpec):
    return entry.attention
  if isinstance(entry, str):
    return entry
  if isinstance(entry, (tuple, list)) and entry and isinstance(entry[0], str):
    return entry[0]
  return None


def make_config(model: str = "primalformer", num_layers: int = 2, **overrides) -> TransformerConfig:
  """A `TransformerConfig` for a model named as in `model_layers`, e.g.
  make_config("primal_plus", 6, dim=512, attention={"primal": {"low_rank": 30}})."""
  return TransformerConfig(layers=model_layers(model, num_layers), **overrides)
