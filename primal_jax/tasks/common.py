"""What the five family configs share (big_vision's `configs/common.py` idea): the `:arg` parser and the skeleton.

Every config builds `base_config()` (seed, distribution, warm start), then its own `data`, `model` and `ksvd`
sections, then `optimizer(...)` and `run_controls(...)`; `get_config(arg)` reads its `:arg` with
`parse_config_arg`. A field a family does not set is left out, not defaulted, so each config still reads as
exactly what its runs use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from primal_jax.attention.registry import ATTENTIONS, MODEL_NEEDS, attentions_able, describe_needs, unsupported
from primal_jax.errors import ConfigError


def parse_config_arg(arg: str | None, defaults: Mapping[str, Any]) -> dict[str, Any]:
  """`defaults` updated from `arg`; values are converted to the type of their default.

  A bare `name` sets a boolean default to True. Unknown keys, and values that do
  not convert, raise ValueError naming the key and the accepted ones.
  """
  out = dict(defaults)
  for item in filter(None, (part.strip() for part in (arg or "").split(","))):
    key, sep, value = item.partition("=")
    key = key.strip()
    if key not in defaults:
      raise ConfigError(f"unknown config argument {key!r}; accepted: {', '.join(sorted(defaults))}")
    default = defaults[key]
    if not sep:
      if not isinstance(default, bool):
        raise ConfigError(f"config argument {key!r} needs a value ({key}=...)")
      out[key] = True
      continue
    try:
      if isinstance(default, bool):
        if value.lower() not in ("true", "false", "1", "0"):
          raise ValueError(value)
        out[key] = value.lower() in ("true", "1")
      else:
        out[key] = type(default)(value) if default is not None else value
    except ValueError as err:
      kind = type(default).__name__
      raise ConfigError(f"config argument {key}={value!r} is not a valid {kind} (default {default!r})") from err
  return out


def check_model_arg(model: str, family: str, stacks: Sequence[str], options_of: Mapping[str, Mapping] | None = None):
  """Refuses a `model=` config argument naming an attention that model family `family` cannot build in the forms
  it needs (the attention registry's `MODEL_NEEDS` and each class's `supports_causal` / `supports_decode`, with
  the config's options `options_of[name]`): a ConfigError listing the accepted values, so a config offers only
  mechanisms it can train (and decode) and a wrong one is refused before anything is built. `stacks`: the
  family's own stack names (primalformer, dt, ...), always accepted."""
  if model in stacks:
    return
  needs = MODEL_NEEDS.get(family, ())
  accepted = ", ".join((*stacks, *attentions_able(needs, options_of)))
  if model not in ATTENTIONS:
    raise ConfigError(f"config argument model={model!r}: model must be one of {accepted}")
  why = unsupported(model, (options_of or {}).get(model), needs=needs)
  if why is not None:
    raise ConfigError(
      f"config argument model={model!r}: a {family!r} model {describe_needs(needs)}, and {why}; accepted: {accepted}"
    )


def base_config(**fields: Any) -> ml_collections.ConfigDict:
  """A new config with the fields every run has (seed 0, `distributed="auto"`, a (-1, 1) mesh, no warm start),
  then `fields` in order (e.g. `task="next_token"`)."""
  config = ml_collections.ConfigDict()
  config.seed = 0
  config.distributed = "auto"
  config.mesh_shape = (-1, 1)
  config.init_from = ""
  for key, value in fields.items():
    setattr(config, key, value)
  return config


def optimizer(
  name: str,
  learning_rate: float,
  *,
  warmup_steps: int = 0,
  schedule: str = "constant",
  end_lr_factor: float = 0.0,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  grad_clip_norm: float = 0.0,
) -> dict[str, Any]:
  """The `optimizer` section (`primal_jax.training.optimizers`): Adam-family moments, schedule, clipping."""
  return dict(
    name=name,
    learning_rate=learning_rate,
    warmup_steps=warmup_steps,
    schedule=schedule,
    end_lr_factor=end_lr_factor,
    b1=b1,
    b2=b2,
    eps=eps,
    weight_decay=weight_decay,
    grad_clip_norm=grad_clip_norm,
  )


def run_controls(
  config: ml_collections.ConfigDict,
  *,
  num_epochs: int,
  total_steps: int,
  log_every_steps: int,
  checkpoint_every_steps: int,
  best_metric: str,
  eval_every_steps: int | None = None,
  eval_every_epochs: int = 1,
  max_to_keep: int = 2,
  test_eval: str | None = None,
  checkpoint_on_eval: bool | None = None,
) -> ml_collections.ConfigDict:
  """Sets the schedule and evaluation fields of `config` (a None argument leaves its field out) and returns it.

  `total_steps` 0 means `num_epochs` epochs; `eval_every_steps` > 0 evaluates by steps, else every
  `eval_every_epochs` epochs; `best_metric` selects the kept state; `test_eval` is "every_eval" or
  "best_validation"; `checkpoint_on_eval` checkpoints at every evaluation.
  """
  config.num_epochs = num_epochs
  config.total_steps = total_steps
  config.log_every_steps = log_every_steps
  if eval_every_steps is not None:
    config.eval_every_steps = eval_every_steps
  config.eval_every_epochs = eval_every_epochs
  config.checkpoint_every_steps = checkpoint_every_steps
  config.max_to_keep = max_to_keep
  config.best_metric = best_metric
  if test_eval is not None:
    config.test_eval = test_eval
  if checkpoint_on_eval is not None:
    config.checkpoint_on_eval = checkpoint_on_eval
  return config
