"""The config's attention layers against the attention registry's metadata and each mechanism's own checks.

`model.layers` names each layer's attention (a name or [name, options]); `model.attention` gives options per
name. Both are checked before anything is built: every name registered, every option one the class declares,
every option value accepted by the class's `validate` (on a layer built as the model family builds it), and
the forms the family needs (the registry's `MODEL_NEEDS`: a causal LM trains causally and decodes) available to each
mechanism (`primal_jax.attention.registry.unsupported`, from the classes' `supports_causal` / `supports_decode`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from primal_jax.attention.registry import (
  ATTENTIONS,
  MODEL_FIELDS,
  MODEL_NEEDS,
  attentions_able,
  check_options,
  describe_needs,
  get_attention,
  unsupported,
)
from primal_jax.dotted import get_dotted
from primal_jax.models.registry import data_independent_primal, plain
from primal_jax.training.config_schema.rules import show


def _layer_entries(layers: Any) -> tuple[list[tuple[str, dict]], str | None]:
  """[(name, own options)] of `model.layers`, or the refusal of a malformed value."""
  layers = plain(layers)
  accepts = "a non-empty list of registered attention names or [name, {option: value}] pairs"
  if isinstance(layers, str) or not isinstance(layers, (tuple, list)) or not layers:
    return [], f"--config.model.layers: model.layers must be {accepts}, got {show(layers)}"
  entries = []
  for entry in layers:
    if isinstance(entry, str):
      entries.append((entry, {}))
    elif isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], str):
      if not isinstance(entry[1], Mapping):
        return [], f"--config.model.layers: layer {show(entry)}'s options must be a mapping of option -> value"
      entries.append((entry[0], dict(entry[1])))
    else:
      return [], f"--config.model.layers: model.layers must be {accepts}, got the entry {show(entry)}"
  for name, _ in entries:
    if name not in ATTENTIONS:
      return [], f"--config.model.layers: model.layers names attention {name!r}; registered: {', '.join(ATTENTIONS)}"
  return entries, None


def _build_fields(model: Mapping, needs: tuple[str, ...], max_len: int) -> dict[str, Any]:
  """The model-level fields a layer receives (`TransformerConfig.layer_attention`), in the family's form."""
  fields = {
    "num_heads": model.get("num_heads", 1),
    "dropout_rate": model.get("attention_dropout_rate", 0.0),
    "dropout_impl": model.get("dropout_impl", "threefry"),
    "init_style": model.get("init_style", "torch"),
    "max_len": max_len,
    "causal": "causal" in needs,
    "decode": False,  # decoding is what `unsupported` checks; the full-call layer is what trains
  }
  return fields


def _validate(name: str, fields: Mapping[str, Any], options: Mapping[str, Any]) -> str | None:
  cls = get_attention(name)
  declared = {f.name for f in dataclasses.fields(cls)}
  try:
    cls(**{**{k: v for k, v in fields.items() if k in declared}, **options}).validate()  # an option wins
  except (TypeError, ValueError, AttributeError, KeyError) as err:  # a value of another type, out of range, ...
    return " ".join(str(err).split())
  return None


def _without(options: Mapping[str, Any], key: str) -> dict[str, Any]:
  return {k: v for k, v in options.items() if k != key}


def attention_problems(config) -> list[str]:
  """The refusals (one line each) of the config's `model.layers` and `model.attention`."""
  model = plain(config.get("model"))
  if not isinstance(model, Mapping) or "layers" not in model:
    return []
  entries, problem = _layer_entries(model["layers"])
  if problem:
    return [problem]
  family = model.get("name")
  needs = MODEL_NEEDS.get(family, ())
  sections = plain(model.get("attention", {})) or {}
  if not isinstance(sections, Mapping):
    accepts = "a mapping of attention name -> {option: value}"
    return [f"--config.model.attention: model.attention must be {accepts}, got {show(sections)}"]
  for name, options in sections.items():
    if not isinstance(options, Mapping):
      return [f"--config.model.attention.{name}: its options must be a mapping of option -> value, got {show(options)}"]
  if "causal" in needs:
    sections = data_independent_primal(sections)  # as the causal families' builders do
  problems = []
  for name, options in sections.items():
    key = f"model.attention.{name}"
    if name not in ATTENTIONS:
      problems.append(f"--config.{key}: {name!r} is not a registered attention; registered: {', '.join(ATTENTIONS)}")
      continue
    try:
      check_options(name, plain(options), f"model.attention.{name}")
    except ValueError as err:
      problems.append(f"--config.{key}: {err}")
  if problems:
    return problems
  seq_len = get_dotted(config, "data.seq_len", 0)
  fields = _build_fields(model, needs, seq_len if isinstance(seq_len, int) and seq_len > 0 else 512)
  distinct = {repr((name, sorted(own.items()))): (name, own) for name, own in entries}  # each layer kind once
  for name, own in distinct.values():
    shared, own = dict(sections.get(name, {})), dict(own)
    for key in own:
      if key in MODEL_FIELDS:
        return [f"--config.model.layers: {key!r} is set by the model config for every layer, not per attention"]
    try:
      check_options(name, own, f"model.layers entry {name!r}")
    except ValueError as err:
      return [f"--config.model.layers: {err}"]
    if (why := _validate(name, fields, {**shared, **own})) is not None:
      merged = {**shared, **own}  # the culprit: the option whose removal (its class default) makes the layer pass
      culprit = next((k for k in merged if _validate(name, fields, _without(merged, k)) is None), None)
      if culprit in own or (culprit is None and own):
        where = "model.layers"  # the layer's own [name, options] entry
      else:
        where = f"model.attention.{name}" + (f".{culprit}" if culprit else "")
      problems.append(f"--config.{where}: attention {name!r}: {why}")
      continue
    if needs and (why := unsupported(name, {**shared, **own}, needs=needs)) is not None:
      able = attentions_able(needs, sections)
      problems.append(
        f"--config.model.layers: model.name={family!r} {describe_needs(needs)}, and {why}; "
        f"attentions it can use: {', '.join(able)}"
      )
  return problems
