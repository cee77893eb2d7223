"""One registry from a model name in a config to a Flax module.

The train loop only knows `build_model(model_config, info)`: a task's data
(`info`: sequence length, channels, classes) plus the config's `model` section
(family, sizes, Primal-Attention options) give the module and the batch keys
it is called on, so new model kinds are one entry here, not a new trainer.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from flax import linen as nn

from primal_jax.models.classifier import DualSequenceClassifier, SequenceClassifier
from primal_jax.models.config import FAMILIES, TransformerConfig, make_config
from primal_jax.models.timeseries import TimeSeriesClassifier, timeseries_config

DTYPES = types.MappingProxyType({"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16})
# Keys of the config's `model` section consumed by the builders themselves (the rest go to TransformerConfig).
_BUILDER_KEYS = ("name", "family", "num_layers", "mask_attention", "dtype", "param_dtype")


@dataclasses.dataclass(frozen=True)
class BuiltModel:
  """A module and how to call it: `module.apply(v, *[batch[k] for k in input_keys], deterministic=...)`."""

  module: nn.Module
  input_keys: tuple[str, ...]


def _dtype(name: str, field: str):
  if name not in DTYPES:
    raise ValueError(f"model.{field} must be one of {sorted(DTYPES)}, got {name!r}")
  return DTYPES[name]


def _transformer_kwargs(model_config) -> dict[str, Any]:
  cfg = dict(model_config.items()) if hasattr(model_config, "items") else dict(vars(model_config))
  kwargs = {k: v for k, v in cfg.items() if k not in _BUILDER_KEYS}
  kwargs["dtype"] = _dtype(cfg.get("dtype", "float32"), "dtype")
  kwargs["param_dtype"] = _dtype(cfg.get("param_dtype", "float32"), "param_dtype")
  return kwargs


def build_timeseries(model_config, info) -> BuiltModel:
  """UEA classifier; `info` gives seq_len and num_classes."""
  try:
    config = timeseries_config(
      model_config.family,
      seq_len=info.seq_len,
      num_classes=info.num_classes,
      num_layers=model_config.num_layers,
      **_transformer_kwargs(model_config),
    )
  except TypeError as err:  # an unknown key in the config's model section
    raise ValueError(f"bad model config for 'timeseries': {err}") from err
  module = TimeSeriesClassifier(config, mask_attention=model_config.get("mask_attention", True))
  return BuiltModel(module, ("inputs", "mask"))


def _lra_config(model_config, info):
  """`family` is a model family (primalformer, primal_plus, softmax) or any registered attention
  name, which then fills every layer (the LRA baselines: linear, performer, ...)."""
  kwargs = _transformer_kwargs(model_config)
  # The release sizes its embedding tables from its own vocabularies (e.g. 512 for bytes); a larger
  # `model.vocab_size` than the data's reproduces its parameter counts.
  vocab_size = max(kwargs.pop("vocab_size", 0) or 0, info.vocab_size)
  family, layers = model_config.family, model_config.num_layers
  try:
    if family in FAMILIES:
      return make_config(
        family, layers, vocab_size=vocab_size, max_len=info.seq_len, num_classes=info.num_classes, **kwargs
      )
    return TransformerConfig(
      layers=(family,) * layers, vocab_size=vocab_size, max_len=info.seq_len, num_classes=info.num_classes, **kwargs
    )
  except TypeError as err:
    raise ValueError(f"bad model config for {model_config.name!r}: {err}") from err


def build_lra(model_config, info) -> BuiltModel:
  """LRA sequence classifier (the release's `ModelForSC`): token ids [B, N] -> logits."""
  return BuiltModel(SequenceClassifier(_lra_config(model_config, info)), ("inputs", "mask"))


def build_lra_dual(model_config, info) -> BuiltModel:
  """LRA two-tower matching (retrieval, the release's `ModelForSCDual`)."""
  return BuiltModel(DualSequenceClassifier(_lra_config(model_config, info)), ("inputs", "inputs2", "mask", "mask2"))


MODEL_BUILDERS: types.MappingProxyType[str, Callable[..., BuiltModel]] = types.MappingProxyType(
  {"timeseries": build_timeseries, "lra": build_lra, "lra_dual": build_lra_dual}
)


def build_model(model_config, info) -> BuiltModel:
  """The module named by `model_config.name`, sized for the data described by `info`."""
  name = model_config.name
  if name not in MODEL_BUILDERS:
    raise ValueError(f"model.name must be one of {sorted(MODEL_BUILDERS)}, got {name!r}")
  return MODEL_BUILDERS[name](model_config, info)
