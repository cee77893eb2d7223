"""One validation pass of a resolved training config, before anything is written: `check_config(config)`.

The binaries (`primal-train` / `experiments/main.py`, `experiments/sweep.py` for every run of its grid) call it
once the config and its overrides are resolved and before the workdir is touched, so a bad value is one line
(`--config.KEY: KEY must be ACCEPTS, got VALUE`, exit status 2) and leaves nothing behind: no `config.json`
recording it, no `metrics.jsonl`, no `checkpoints/`, and the corrected rerun starts clean.

The schema is declarative: `FIELDS` maps each dotted key the training code reads to the `Rule` of what it
accepts (`rules`: integers and finite numbers within bounds, dropout rates in [0, 1), choices read from the
registries when checked) and whether every config must have it. A data task's own keys are the rules its
family's config module registers (`register_data_fields`: `text_bytes`, `listops`, `pathfinder` so far); a key
no rule names (another family's data options, a user's own fields) is checked when its pipeline is built. What
one key cannot say is checked after the keys: a run needs steps (`total_steps` or `num_epochs`), the warm-up
fits in them, the heads divide the width, and the attention layers are checked against the registry's metadata
and each mechanism's own `validate` (`model.attention_problems`).

Why a table of rules and not pydantic or jsonschema: neither is a dependency of the package (pydantic reaches
this venv only through typer), the configs are open (each family has its own `data` keys, a user's config file
may add fields), and each refusal must be one line naming `--config.KEY` as the command line spells it.
ml_collections does the rest: a locked ConfigDict refuses an unknown key and an override of another type.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from primal_jax.data.registry import TASKS
from primal_jax.dotted import get_dotted
from primal_jax.errors import ConfigError
from primal_jax.ksvd import KSVD_SPECS
from primal_jax.models.config import ACTIVATIONS, NORM_POSITIONS, NORM_TYPES, POOLINGS
from primal_jax.models.registry import DTYPES, MODELS
from primal_jax.training.checkpointing.warm_start import INIT_FROM_MODES
from primal_jax.training.config_schema.model import attention_problems
from primal_jax.training.config_schema.rules import (
  BOOLEAN,
  RATE,
  TEXT,
  Rule,
  integer,
  mesh_shape,
  number,
  one_of,
  optional,
  refusal,
)
from primal_jax.training.evaluation import TEST_EVALS
from primal_jax.training.objectives import KL_SCALES, METRIC_MODES, OBJECTIVES
from primal_jax.training.optimizers import OPTIMIZERS, SCHEDULES

__all__ = ["DATA_FIELDS", "FIELDS", "Field", "check_config", "problems", "register_data_fields"]


@dataclasses.dataclass(frozen=True)
class Field:
  """A key's rule; `required`: the training code reads it from every config."""

  rule: Rule
  required: bool = False


def _best_metric(value: Any) -> bool:
  return value == "" or (isinstance(value, str) and value.rsplit("/", 1)[-1] in METRIC_MODES and "/" in value)


def _accept_list(value: Any) -> bool:
  return isinstance(value, str) or (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value))


def _required(rule: Rule) -> Field:
  return Field(rule, required=True)


COUNT, POSITIVE = integer(0), integer(1)
FIELDS: Mapping[str, Field] = {
  # Run controls.
  "seed": _required(integer(0, 2**32 - 1)),
  "distributed": Field(one_of(("off", "on", "auto"))),
  "mesh_shape": _required(mesh_shape()),
  "init_from": Field(TEXT),
  "init_from_mode": Field(one_of(INIT_FROM_MODES)),
  "init_from_min_loaded": Field(number(0, 1)),
  "task": Field(Rule(lambda: f"'' (the model's) or one of {sorted(OBJECTIVES)}", lambda v: v == "" or v in OBJECTIVES)),
  "total_steps": _required(Rule("an integer >= 0 (0: num_epochs epochs)", lambda v: integer(0)(v))),
  "num_epochs": _required(COUNT),
  "log_every_steps": _required(POSITIVE),
  "eval_every_steps": Field(Rule("an integer >= 0 (0: every eval_every_epochs epochs)", lambda v: COUNT(v))),
  "eval_every_epochs": Field(POSITIVE),
  "checkpoint_every_steps": _required(POSITIVE),
  "max_to_keep": _required(optional(POSITIVE)),
  "best_metric": Field(
    Rule(lambda: f"'' or 'SPLIT/METRIC' with METRIC one of {', '.join(METRIC_MODES)}", _best_metric)
  ),
  "test_eval": Field(one_of(TEST_EVALS)),
  "checkpoint_on_eval": Field(BOOLEAN),
  "resume_step": Field(Rule("an integer >= -1 (-1: the latest checkpoint)", lambda v: integer(-1)(v))),
  "accept_config_changes": Field(Rule("a comma-separated string of dotted keys", _accept_list)),
  # Data: what every family's pipeline reads (the rest is the family's own).
  "data.task": _required(one_of(lambda: TASKS, listed=True)),
  "data.batch_size": _required(POSITIVE),
  "data.eval_batch_size": Field(POSITIVE),
  "data.seed": Field(COUNT),
  "data.val_fraction": Field(number(0, 1, hi_open=True)),
  "data.seq_len": Field(Rule("an integer >= 0 (0: the task's own length)", lambda v: COUNT(v))),
  # Model.
  "model.name": _required(one_of(lambda: MODELS, listed=True)),
  "model.dim": Field(POSITIVE),
  "model.hidden_dim": Field(POSITIVE),
  "model.num_heads": Field(POSITIVE),
  "model.vocab_size": Field(COUNT),
  "model.patch_size": Field(POSITIVE),
  "model.dropout_rate": Field(RATE),
  "model.attention_dropout_rate": Field(RATE),
  "model.drop_path_rate": Field(RATE),
  "model.layer_norm_eps": Field(number(0, lo_open=True)),
  "model.dtype": Field(one_of(DTYPES)),
  "model.param_dtype": Field(one_of(DTYPES)),
  "model.pooling": Field(one_of(POOLINGS)),
  "model.norm_position": Field(one_of(NORM_POSITIONS)),
  "model.norm_type": Field(one_of(NORM_TYPES)),
  "model.activation": Field(one_of(ACTIVATIONS)),
  "model.exact_gelu": Field(BOOLEAN),
  # KSVD.
  "ksvd.eta": _required(number(0)),
  "ksvd.spec": _required(one_of(KSVD_SPECS)),
  # KEP-SVGP's KL term (`task="kep_svgp"`, `objectives.KEPSVGP`): its weight and scale.
  "kl.eta": Field(number(0)),
  "kl.scale": Field(one_of(KL_SCALES)),
  # Optimizer.
  "optimizer.name": _required(one_of(OPTIMIZERS)),
  "optimizer.learning_rate": _required(number(0, lo_open=True)),
  "optimizer.warmup_steps": _required(COUNT),
  "optimizer.schedule": _required(one_of(SCHEDULES)),
  "optimizer.end_lr_factor": _required(number(0, 1)),
  "optimizer.b1": _required(number(0, 1, hi_open=True)),
  "optimizer.b2": _required(number(0, 1, hi_open=True)),
  "optimizer.eps": _required(number(0)),
  "optimizer.weight_decay": _required(number(0)),
  "optimizer.grad_clip_norm": _required(Rule("a finite number >= 0 (0: no clipping)", lambda v: number(0)(v))),
}
# data.task -> {dotted key: Rule} of that task's own data keys, and its cross-field check (config -> refusals):
# registered by the family's config module (`register_data_fields`), which knows its pipeline's choices.
DATA_FIELDS: dict[str, dict[str, Rule]] = {}
DATA_CHECKS: dict[str, Callable[[Any], list[str]]] = {}
_ABSENT = object()


def register_data_fields(
  task: str, fields: Mapping[str, Rule], check: Callable[[Any], list[str]] | None = None
) -> None:
  """Adds the rules of data task `task`'s own keys (checked when present and `data.task == task`), and a check
  of what one key cannot say (a function of the config returning its refusals, one line each)."""
  DATA_FIELDS[task] = dict(fields)
  if check is not None:
    DATA_CHECKS[task] = check


def _value(config, key: str) -> Any:
  node = config
  for part in key.split("."):
    if not isinstance(node, Mapping) and not hasattr(node, "keys"):
      return _ABSENT
    if part not in node:
      return _ABSENT
    node = node[part]
  return node


def _plain(value: Any) -> Any:
  return value.to_dict() if hasattr(value, "to_dict") else value


def _cross_problems(config) -> list[str]:
  """What one key cannot say: steps to train, a warm-up that fits them, heads that divide the width."""
  out = []
  total, epochs = config.get("total_steps"), config.get("num_epochs")
  if total == 0 and epochs == 0:
    out.append("--config.total_steps: total_steps or num_epochs must be > 0 (a run needs steps), got 0 and 0")
  warmup = get_dotted(config, "optimizer.warmup_steps")
  if isinstance(total, int) and total > 0 and isinstance(warmup, int) and warmup > total:
    out.append(
      f"--config.optimizer.warmup_steps: optimizer.warmup_steps must be in [0, total_steps={total}], got {warmup}"
    )
  dim, heads = get_dotted(config, "model.dim"), get_dotted(config, "model.num_heads")
  if isinstance(dim, int) and isinstance(heads, int) and dim > 0 and heads > 0 and dim % heads:
    out.append(
      f"--config.model.num_heads: model.dim={dim} must be divisible by model.num_heads={heads} (each head owns "
      "dim / num_heads channels)"
    )
  return out


def problems(config) -> list[str]:
  """Every refusal of `config`, one line each (empty: it passes). Reads only."""
  out = []
  for section in ("data", "model", "ksvd", "optimizer"):
    value = config.get(section, _ABSENT) if hasattr(config, "get") else _ABSENT
    if value is _ABSENT:
      out.append(f"--config.{section}: the config has no {section!r} section; every training config needs one")
    elif not hasattr(value, "keys"):
      out.append(refusal(section, _plain(value), "a section of fields (a ConfigDict)"))
  if out:
    return out
  for key, field in FIELDS.items():
    value = _value(config, key)
    if value is _ABSENT:
      if field.required:
        needs = field.rule.describe()
        out.append(f"--config.{key}: the config has no {key!r}; every training config needs it ({needs})")
      continue
    value = _plain(value)
    if not field.rule(value):
      out.append(refusal(key, value, field.rule.describe()))
  task = get_dotted(config, "data.task")
  for key, rule in DATA_FIELDS.get(task, {}).items():
    if (value := _value(config, key)) is not _ABSENT and not rule(_plain(value)):
      out.append(refusal(key, _plain(value), rule.describe()))
  if out:
    return out
  out += DATA_CHECKS[task](config) if task in DATA_CHECKS else []
  return out + _cross_problems(config) + attention_problems(config)


def check_config(config) -> None:
  """Raises ConfigError with every refusal of `config` on one line (``"; "`` between them); reads only."""
  found = problems(config)
  if found:
    raise ConfigError("; ".join(found))
