"""One registry from a model name in a config to a Flax module.

The train loop only knows `build_model(model_config, info)`: a task's data
(`info`: sequence length, channels, classes) plus the config's `model` section
(sizes, `layers`: one attention name per layer, `attention`: options per
attention name) give the module and the batch keys it is called on, so new
model kinds are one entry here, not a new trainer.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from primal_jax.errors import ConfigError
from primal_jax.models.classifier import DualSequenceClassifier, SequenceClassifier
from primal_jax.models.config import TransformerConfig
from primal_jax.models.decision_transformer import GPT2_BODY, DecisionTransformer
from primal_jax.models.lm import CausalLM
from primal_jax.models.timeseries import TimeSeriesClassifier, timeseries_config
from primal_jax.models.vit import DEIT_BODY, VisionTransformer

DTYPES = types.MappingProxyType({"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16})
# Keys of the config's `model` section consumed by the builders themselves (the rest go to TransformerConfig).
_BUILDER_KEYS = ("name", "mask_attention", "dtype", "param_dtype")


@dataclasses.dataclass(frozen=True)
class BuiltModel:
  """A module and how to call it: `module.apply(v, *[batch[k] for k in input_keys], deterministic=...)`."""

  module: nn.Module
  input_keys: tuple[str, ...]
  task: str = "classification"  # the objective its outputs serve (primal_jax.training.objectives)


def _dtype(name: str, field: str):
  if name not in DTYPES:
    raise ConfigError(f"model.{field} must be one of {sorted(DTYPES)}, got {name!r}")
  return DTYPES[name]


def _plain(value):
  """ConfigDicts and lists as dicts and tuples (a config's `layers` and `attention` sections)."""
  if hasattr(value, "to_dict"):
    value = value.to_dict()
  if isinstance(value, dict):
    return {k: _plain(v) for k, v in value.items()}
  if isinstance(value, list):
    return tuple(_plain(v) for v in value)
  return value


def _transformer_kwargs(model_config) -> dict[str, Any]:
  cfg = dict(model_config.items()) if hasattr(model_config, "items") else dict(vars(model_config))
  kwargs = {k: _plain(v) for k, v in cfg.items() if k not in _BUILDER_KEYS}
  kwargs["dtype"] = _dtype(cfg.get("dtype", "float32"), "dtype")
  kwargs["param_dtype"] = _dtype(cfg.get("param_dtype", "float32"), "param_dtype")
  return kwargs


def build_timeseries(model_config, info) -> BuiltModel:
  """UEA classifier; `info` gives seq_len and num_classes."""
  kwargs = _transformer_kwargs(model_config)
  try:
    config = timeseries_config(seq_len=info.seq_len, num_classes=info.num_classes, **kwargs)
  except TypeError as err:  # an unknown key in the config's model section
    raise ValueError(f"bad model config for 'timeseries': {err}") from err
  module = TimeSeriesClassifier(config, mask_attention=model_config.get("mask_attention", True))
  return BuiltModel(module, ("inputs", "mask"))


def _lra_config(model_config, info, **kwargs):
  """TransformerConfig of a token model; `kwargs` override the config's model section."""
  kwargs = {**_transformer_kwargs(model_config), **kwargs}
  # The release sizes its embedding tables from its own vocabularies (e.g. 512 for bytes); a larger
  # `model.vocab_size` than the data's reproduces its parameter counts.
  vocab_size = max(kwargs.pop("vocab_size", 0) or 0, info.vocab_size)
  try:
    return TransformerConfig(vocab_size=vocab_size, max_len=info.seq_len, num_classes=info.num_classes, **kwargs)
  except TypeError as err:
    raise ValueError(f"bad model config for {model_config.name!r}: {err}") from err


def build_lra(model_config, info) -> BuiltModel:
  """LRA sequence classifier (the release's `ModelForSC`): token ids [B, N] -> logits."""
  return BuiltModel(SequenceClassifier(_lra_config(model_config, info)), ("inputs", "mask"))


def build_lra_dual(model_config, info) -> BuiltModel:
  """LRA two-tower matching (retrieval, the release's `ModelForSCDual`)."""
  return BuiltModel(DualSequenceClassifier(_lra_config(model_config, info)), ("inputs", "inputs2", "mask", "mask2"))


def build_lm(model_config, info) -> BuiltModel:
  """Causal decoder LM (`CausalLM`) for next-token tasks: ids [B, T] -> logits [B, T, vocab].

  Primal layers get data-independent W_e, W_r unless `attention.primal.data_dependent` says otherwise
  (the causal layer then refuses True: rows sampled over the whole sequence would leak future tokens).
  """
  attention = _plain(model_config.get("attention", {})) or {}
  attention["primal"] = {"data_dependent": False, **attention.get("primal", {})}
  config = _lra_config(model_config, info, attention=attention)
  return BuiltModel(CausalLM(config), ("inputs",), task="next_token")


# Keys of a Decision Transformer's model section that are the module's own, not the body's.
_DT_KEYS = ("masking", "action_tanh", "embed_dropout_rate", "max_ep_len")


def build_decision_transformer(model_config, info) -> BuiltModel:
  """Decision Transformer (`offline_rl` task): segments of (R, s, a) -> actions [B, K, act_dim].

  The body is the release's GPT-2 (`GPT2_BODY`, hidden_dim 4 * dim unless given); `info` (an
  `RLDatasetInfo`) gives state_dim, act_dim and the episode length of the timestep table. Primal layers get
  data-independent W_e, W_r unless `attention.primal.data_dependent` says otherwise (the causal layer refuses).
  """
  kwargs = {k: v for k, v in _transformer_kwargs(model_config).items() if k not in _DT_KEYS}
  attention = kwargs.pop("attention", None) or {}
  attention["primal"] = {"data_dependent": False, **attention.get("primal", {})}
  if "dim" in kwargs:  # GPT-2's n_inner default
    kwargs.setdefault("hidden_dim", 4 * kwargs["dim"])
  try:
    config = TransformerConfig(**{**GPT2_BODY, **kwargs, "attention": attention})
  except TypeError as err:
    raise ValueError(f"bad model config for 'decision_transformer': {err}") from err
  module = DecisionTransformer(
    config,
    state_dim=info.state_dim,
    act_dim=info.act_dim,
    max_ep_len=model_config.get("max_ep_len", info.max_ep_len),
    masking=model_config.get("masking", "padding_aware"),
    action_tanh=model_config.get("action_tanh", True),
    embed_dropout_rate=model_config.get("embed_dropout_rate", None),
    action_only=True,
  )
  return BuiltModel(module, ("states", "actions", "returns_to_go", "timesteps", "mask"), task="offline_rl")


# Keys of a ViT's model section that are the module's own, not the body's.
_VIT_KEYS = ("patch_size", "primal_qk_on_finetune")


def build_vit(model_config, info) -> BuiltModel:
  """Vision Transformer (DeiT layout, `primal_jax.models.vit`): images [B, H, W, C] -> logits.

  The body defaults to DeiT's (`DEIT_BODY`: LayerNorm eps 1e-6, exact GELU, timm's init, no dropout);
  `info.image_shape` (an `ImageDatasetInfo`) gives the image size, `model.patch_size` the patch. Primal
  layers are data-dependent with n = min(N, s * rank_multi) rows unless their options say otherwise.
  """
  kwargs = {k: v for k, v in _transformer_kwargs(model_config).items() if k not in _VIT_KEYS}
  shape = getattr(info, "image_shape", None)
  if not shape:
    raise ValueError(f"model 'vit' needs an image task (data.task='images'); {info.name!r} has no image_shape")
  try:
    config = TransformerConfig(**{**DEIT_BODY, "num_classes": info.num_classes, **kwargs})
  except TypeError as err:
    raise ValueError(f"bad model config for 'vit': {err}") from err
  module = VisionTransformer(
    config,
    image_size=tuple(shape[:2]),
    patch_size=model_config.get("patch_size", 16),
    primal_qk_on_finetune=model_config.get("primal_qk_on_finetune", "init"),
  )
  return BuiltModel(module, ("inputs",))


MODEL_BUILDERS: types.MappingProxyType[str, Callable[..., BuiltModel]] = types.MappingProxyType(
  {
    "timeseries": build_timeseries,
    "lra": build_lra,
    "lra_dual": build_lra_dual,
    "lm": build_lm,
    "decision_transformer": build_decision_transformer,
    "vit": build_vit,
  }
)


def build_model(model_config, info) -> BuiltModel:
  """The module named by `model_config.name`, sized for the data described by `info`."""
  name = model_config.name
  if name not in MODEL_BUILDERS:
    raise ConfigError(f"model.name must be one of {sorted(MODEL_BUILDERS)}, got {name!r}")
  return MODEL_BUILDERS[name](model_config, info)
