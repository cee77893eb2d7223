"""One registry from a model name in a config (`model.name`) to the builder of that model family.

The train loop only knows `build_model(model_config, info)`: a task's data (`info`: sequence length,
channels, classes) plus the config's `model` section give the module and the batch keys it is called on.
A builder is a function `(model_config, info) -> BuiltModel` in its model family's own module (`lra` and
`lra_dual` in `classifier`, `timeseries`, `lm`, `vit`, `decision_transformer`), registered here by name as
a lazy `"module:function"` entry, so a UEA run never imports the Decision Transformer. A new family is one
module (its module class, its options type and its `build`) plus one `register_model` line.

The `model` section holds three kinds of keys: `name` and the dtypes (`dtype`, `param_dtype`, by name),
which every family reads alike; the family's own options, the fields of its options type (a frozen
dataclass such as `VitOptions(patch_size, primal_qk_on_finetune)`); and the body's, the fields of the shared
`TransformerConfig`. `model_sections(model_config, Options)` splits them, and an unknown key is refused.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from primal_jax.errors import ConfigError
from primal_jax.models.config import TransformerConfig
from primal_jax.registry import Lazy, Registry

DTYPES = types.MappingProxyType({"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16})
# Keys of the config's `model` section that every family reads alike (the rest: the family's options, the body).
COMMON_KEYS = ("name", "dtype", "param_dtype")

# adapt(path, saved array, target shape) -> an array of the target shape, or None to keep the target's init.
Adapter = Callable[[str, np.ndarray, tuple[int, ...]], "np.ndarray | None"]


@dataclasses.dataclass(frozen=True)
class BuiltModel:
  """A module and how to call it: `module.apply(v, *[batch[k] for k in input_keys], deterministic=...)`.

  Attributes:
    module: the Flax module.
    input_keys: the batch keys of its positional inputs.
    task: the objective its outputs serve (`primal_jax.training.objectives`).
    adapt_pretrained: fine-tuning from another model's params (`config.init_from_mode="matching"`): adapts a
      saved leaf of another shape (e.g. a ViT's position embedding to another image size), or None.
    keep_init_on_finetune: path -> whether that leaf keeps its initialisation even when a pretrained leaf
      matches it (the release's fresh Primal query and key), or None.
  """

  module: nn.Module
  input_keys: tuple[str, ...]
  task: str = "classification"
  adapt_pretrained: Adapter | None = None
  keep_init_on_finetune: Callable[[str], bool] | None = None


Builder = Callable[[Any, Any], BuiltModel]


def _check_builder(value) -> None:
  if not callable(value):
    raise ValueError(f"a model builder must be a callable (model_config, info) -> BuiltModel, got {value!r}")


# model.name -> builder: a read-only Mapping; extend it with `register_model`.
MODELS: Registry[Builder] = Registry("model", "model.name", _check_builder)
for _name, _target in {
  "timeseries": "primal_jax.models.timeseries:build",
  "lra": "primal_jax.models.classifier:build",
  "lra_dual": "primal_jax.models.classifier:build_dual",
  "lm": "primal_jax.models.lm:build",
  "decision_transformer": "primal_jax.models.decision_transformer:build",
  "vit": "primal_jax.models.vit:build",
}.items():
  MODELS.register(_name, Lazy(_target, ()), builtin=True)


def register_model(name: str, builder: Builder, *, replace: bool = False) -> None:
  """Makes a model family available as `model.name=name`: `builder(model_config, info) -> BuiltModel`."""
  MODELS.register(name, builder, replace=replace)


def unregister_model(name: str) -> None:
  """Removes a family registered with `register_model` (a replaced built-in gets its own builder back)."""
  MODELS.unregister(name)


def registered_model(name: str, builder: Builder, *, replace: bool = False):
  """`register_model` for the duration of a `with` block."""
  return MODELS.registered(name, builder, replace=replace)


def get_model(name: str) -> Builder:
  """The builder registered under `name`; a ConfigError listing the registered names otherwise."""
  return MODELS.get(name)


def build_model(model_config, info) -> BuiltModel:
  """The module named by `model_config.name`, sized for the data described by `info`."""
  return get_model(model_config.name)(model_config, info)


# --- what builders share


def _dtype(name: str, field: str):
  if name not in DTYPES:
    raise ConfigError(f"model.{field} must be one of {sorted(DTYPES)}, got {name!r}")
  return DTYPES[name]


def plain(value):
  """ConfigDicts and lists as dicts and tuples (a config's `layers` and `attention` sections)."""
  if hasattr(value, "to_dict"):
    value = value.to_dict()
  if isinstance(value, dict):
    return {k: plain(v) for k, v in value.items()}
  if isinstance(value, list):
    return tuple(plain(v) for v in value)
  return value


def model_sections(model_config, options_type: type | None = None) -> tuple[Any, dict[str, Any]]:
  """(the family's options, the body's keyword arguments) of a config's `model` section.

  `options_type` is the family's frozen dataclass of options (None: the family has none): the section's keys
  that name its fields build it, the rest but `COMMON_KEYS` go to the body (`TransformerConfig`), with the
  dtypes as jnp types. An unknown key is a ValueError from the body's constructor (`body_config`).
  """
  section = dict(model_config.items()) if hasattr(model_config, "items") else dict(vars(model_config))
  own = {f.name for f in dataclasses.fields(options_type)} if options_type is not None else set()
  options = options_type(**{k: plain(v) for k, v in section.items() if k in own}) if options_type else None
  body = {k: plain(v) for k, v in section.items() if k not in own and k not in COMMON_KEYS}
  body["dtype"] = _dtype(section.get("dtype", "float32"), "dtype")
  body["param_dtype"] = _dtype(section.get("param_dtype", "float32"), "param_dtype")
  return options, body


def body_config(name: str, **kwargs) -> TransformerConfig:
  """`TransformerConfig(**kwargs)`, a key it does not know named as a bad key of model family `name`."""
  try:
    return TransformerConfig(**kwargs)
  except TypeError as err:  # an unknown key in the config's model section
    raise ValueError(f"bad model config for {name!r}: {err}") from err


def data_independent_primal(attention) -> dict:
  """The `attention` options with Primal layers' W_e, W_r data-independent unless they say otherwise (causal
  models: rows sampled over the whole sequence would leak future tokens, so the causal layer refuses True)."""
  attention = dict(attention or {})
  attention["primal"] = {"data_dependent": False, **attention.get("primal", {})}
  return attention


def token_config(model_config, info, **overrides) -> TransformerConfig:
  """The body of a token model (LRA classifiers, the LM) sized by `info`; `overrides` replace section keys.

  The release sizes its embedding tables from its own vocabularies (e.g. 512 for bytes); a larger
  `model.vocab_size` than the data's reproduces its parameter counts.
  """
  _, kwargs = model_sections(model_config)
  kwargs = {**kwargs, **overrides}
  vocab_size = max(kwargs.pop("vocab_size", 0) or 0, info.vocab_size)
  return body_config(
    model_config.name, vocab_size=vocab_size, max_len=info.seq_len, num_classes=info.num_classes, **kwargs
  )
