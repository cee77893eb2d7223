"""Optimizers and learning-rate schedules of the paper's experiments, from a config.

UEA uses RAdam (Adam for SpokenArabicDigits) at a constant 1e-3; LRA uses Adam
with linear warm-up then linear decay. Everything is an optax transformation so
the optimizer state is a plain pytree that checkpoints and shards like params.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import optax

from primal_jax.errors import ConfigError

OPTIMIZERS = ("adam", "adamw", "radam")
SCHEDULES = ("constant", "linear", "cosine")


def _check_name(value: str, choices: tuple[str, ...], name: str) -> None:
  if value not in choices:
    raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def make_schedule(config, total_steps: int) -> Callable:
  """Linear warm-up from 0 over `warmup_steps`, then `schedule` down to `end_lr_factor * learning_rate`.

  Args:
    config: fields `learning_rate`, `warmup_steps`, `schedule` (constant |
      linear | cosine) and `end_lr_factor`.
    total_steps: the run's number of optimizer steps.
  """
  _check_name(config.schedule, SCHEDULES, "optimizer.schedule")
  if not (math.isfinite(config.learning_rate) and config.learning_rate > 0):  # NaN would train NaN params
    raise ConfigError(f"optimizer.learning_rate must be a finite number > 0, got {config.learning_rate}")
  if not 0 <= config.warmup_steps <= total_steps:
    raise ConfigError(f"optimizer.warmup_steps must be in [0, total_steps={total_steps}], got {config.warmup_steps}")
  peak, warmup = config.learning_rate, config.warmup_steps
  decay_steps = max(total_steps - warmup, 1)
  end = config.end_lr_factor * peak
  if config.schedule == "constant":
    main = optax.constant_schedule(peak)
  elif config.schedule == "linear":
    main = optax.linear_schedule(peak, end, decay_steps)
  else:
    main = optax.cosine_decay_schedule(peak, decay_steps, alpha=config.end_lr_factor)
  if warmup == 0:
    return main
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), main], [warmup])


def make_optimizer(config, total_steps: int) -> tuple[optax.GradientTransformation, Callable]:
  """(optax transformation, schedule) for `config` (see `make_schedule` plus `name`,
  `b1`, `b2`, `eps`, `weight_decay` and `grad_clip_norm`, 0 = no clipping)."""
  _check_name(config.name, OPTIMIZERS, "optimizer.name")
  schedule = make_schedule(config, total_steps)
  if config.name == "adam":
    opt = optax.adam(schedule, b1=config.b1, b2=config.b2, eps=config.eps)
  elif config.name == "adamw":
    opt = optax.adamw(schedule, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay)
  else:
    opt = optax.radam(schedule, b1=config.b1, b2=config.b2, eps=config.eps)
  if config.name != "adamw" and config.weight_decay:
    # L2 added to the gradient, as torch.optim.Adam(weight_decay=...) does.
    opt = optax.chain(optax.add_decayed_weights(config.weight_decay), opt)
  if config.grad_clip_norm:
    if config.grad_clip_norm < 0:
      raise ValueError(f"optimizer.grad_clip_norm must be >= 0, got {config.grad_clip_norm}")
    opt = optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), opt)
  return opt, schedule
