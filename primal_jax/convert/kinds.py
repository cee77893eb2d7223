"""The kinds of reference case `primal-convert verify` runs, and what each one's JSON must hold.

A case's JSON names its kind in `torch_module.class` (the release's PyTorch class, e.g. "ModelForSC"). Each kind is
one `CaseKind` in `CASE_KINDS` (the project's `Registry`): the runner, as a lazy `"module:function"` that takes the
loaded `ReferenceCase` and returns {output name: array}, and `config`, the fields of the JSON's `config` object the
runner reads with the JSON type each must have. `check_case_json` checks the JSON's own structure and the kind's
fields before anything runs, so a field of the wrong type is one line naming it, not a traceback from inside the
runner. A new kind is one entry:

  register_case_kind("MyModule", CaseKind("primal_jax.convert.my_case:run_my_module", {"num_heads": Field(INT)}))

(docs/development.md, "Reference cases"; a built-in kind is registered below with `builtin=True`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

from primal_jax.errors import ConfigError
from primal_jax.registry import Lazy, Registry

# JSON types a field may be: the name used in messages -> its Python types (bool is not a number here).
INT, NUMBER, TEXT, FLAG, OBJECT = "an integer", "a finite number", "a string", "true or false", "an object"
_TYPES: Mapping[str, tuple[type, ...]] = {
  INT: (int,),
  NUMBER: (int, float),
  TEXT: (str,),
  FLAG: (bool,),
  OBJECT: (dict,),
}


@dataclasses.dataclass(frozen=True)
class Field:
  """One `config` field a kind reads: its JSON type (`INT`, `NUMBER`, `TEXT`, `FLAG`, `OBJECT`) or, for a string
  field with a fixed set of values, the tuple of those values; `required` when the runner cannot do without it."""

  type: str | tuple[str, ...]
  required: bool = True

  def problem(self, value) -> str | None:
    """What is wrong with `value` ("must be an integer"), None if nothing is."""
    if isinstance(self.type, tuple):
      return None if isinstance(value, str) and value in self.type else f"must be one of {list(self.type)}"
    ok = isinstance(value, _TYPES[self.type]) and (self.type == FLAG or not isinstance(value, bool))
    if ok and self.type == NUMBER:
      ok = math.isfinite(value)  # JSON's NaN / Infinity (Python's json reads them) would only give NaN outputs
    return None if ok else f"must be {self.type}"


@dataclasses.dataclass(frozen=True)
class CaseKind:
  """A kind of reference case: `run` ("module:function", imported when a case of the kind runs) and the `config`
  fields it reads."""

  run: str
  config: Mapping[str, Field] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    Lazy(self.run)  # 'module:attribute', or a ValueError saying so

  def runner(self, name: str) -> Callable:
    return Lazy(self.run).load("reference case kind", name)


def _check_kind(value) -> None:
  if not isinstance(value, CaseKind):
    raise ValueError(f"a reference case kind must be a CaseKind, got {type(value).__name__}")


CASE_KINDS: Registry[CaseKind] = Registry("reference case kind", "torch_module.class", check=_check_kind)


def register_case_kind(name: str, kind: CaseKind, *, replace: bool = False) -> None:
  CASE_KINDS.register(name, kind, replace=replace)


def unregister_case_kind(name: str) -> None:
  CASE_KINDS.unregister(name)


_OPTIONAL_ETA = {"eta": Field(NUMBER, required=False)}
_LRA = {
  **{name: Field(INT) for name in ("num_head", "vocab_size", "transformer_dim", "transformer_hidden_dim")},
  "num_classes": Field(INT),
  "pooling_mode": Field(("MEAN", "CLS")),
  **_OPTIONAL_ETA,
  "trace_no_x": Field(FLAG, required=False),
  "attn_type": Field(TEXT, required=False),
  **{k: Field(INT, required=False) for k in ("linformer_k", "num_landmarks", "conv_kernel_size", "rp_dim", "num_hash")},
}
_DT = {
  "n_head": Field(INT),
  "max_length_K": Field(INT),
  **_OPTIONAL_ETA,
  "activation_function": Field(TEXT, required=False),
  **{k: Field(FLAG, required=False) for k in ("action_tanh", "scale_attn_weights", "scale_attn_by_inverse_layer_idx")},
}
_KEP_ETAS = {"eta_ksvd": Field(NUMBER), "eta_kl": Field(NUMBER), "rank_multi": Field(INT)}
_KEP_LAYER = {"num_heads": Field(INT), "embed_len": Field(INT), "concate": Field(FLAG), **_KEP_ETAS}
_KEP_VIT = {"heads": Field(INT), **_KEP_ETAS}

_BUILTIN = {
  "ModelForSC": CaseKind("primal_jax.convert.cases:run_lra_classifier", _LRA),
  "AttentionLayer": CaseKind("primal_jax.convert.cases:run_timeseries_layers", _OPTIONAL_ETA),
  "Primal_attention": CaseKind("primal_jax.convert.cases:run_rl_layer", _OPTIONAL_ETA),
  "PrimalMultiheadAttention": CaseKind("primal_jax.convert.cases:run_fairseq_layer", _OPTIONAL_ETA),
  "DecisionTransformer": CaseKind("primal_jax.convert.rl_case:run_decision_transformer", _DT),
  "ComboVisionTransformer": CaseKind(
    "primal_jax.convert.vit:run_combo_vision_transformer", {"num_heads": Field(INT), **_OPTIONAL_ETA}
  ),
  "Flowformer_attention": CaseKind(
    "primal_jax.convert.baseline_cases:run_flowformer_layer",
    {"n_heads": Field(INT), "eps": Field(NUMBER, required=False)},
  ),
  # KEP-SVGP (shared/reference/kep_svgp): the layer, the CIFAR ViT with KEP blocks, the uncertainty metrics.
  "KEP_SVGPAttention": CaseKind("primal_jax.convert.kep_svgp_case:run_kep_layer", _KEP_LAYER),
  "ViT": CaseKind("primal_jax.convert.kep_vit_case:run_kep_vit", _KEP_VIT),
  "CIFAR/utils/metrics.py": CaseKind("primal_jax.convert.kep_svgp_case:run_kep_metrics", {"bins": Field(INT)}),
}
for _name, _kind in _BUILTIN.items():
  CASE_KINDS.register(_name, _kind, builtin=True)


def _type_name(value) -> str:
  return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
    type(value), f"a {type(value).__name__}"
  )


def _expect(value, field: Field, where: str) -> None:
  problem = field.problem(value)
  if problem:
    raise ConfigError(f"{where} {problem}, got {value!r} ({_type_name(value)})")


def module_class(meta: dict) -> str:
  """The case's kind: `torch_module.class` up to its first space ("AttentionLayer (inner_attention = ...)"); a case
  of functions, not of a class (KEP-SVGP's metrics), is named by its `torch_module.file` the same way."""
  torch_module = meta.get("torch_module", {})
  return str(torch_module.get("class") or torch_module.get("file", "")).split(" ")[0]


def check_case_json(meta, where: str) -> None:
  """ConfigError (one line, naming `where` and the field) unless `meta`, a case's parsed JSON, is an object whose
  `case`, `torch_module`, `config`, `outputs` and `random_state` have their types and whose `config` holds the
  fields its kind reads (`CaseKind.config`) with theirs. An unknown kind is left to the caller (its own message)."""
  if not isinstance(meta, dict):
    raise ConfigError(f"{where} must hold a JSON object (a reference case's description), got {_type_name(meta)}")
  for key, field in (("case", Field(TEXT)), ("torch_module", Field(OBJECT)), ("config", Field(OBJECT))):
    if key in meta:
      _expect(meta[key], field, f"{where}: {key}")
  if "class" in meta.get("torch_module", {}):
    _expect(meta["torch_module"]["class"], Field(TEXT), f"{where}: torch_module.class")
  if meta.get("random_state") is not None:
    _expect(meta["random_state"], Field(OBJECT), f"{where}: random_state")
  outputs = meta.get("outputs", {})
  _expect(outputs, Field(OBJECT), f"{where}: outputs")
  for key, info in outputs.items():
    _expect(info, Field(OBJECT), f"{where}: outputs.{key}")
    for name in ("file", "key_in_file"):
      if info.get(name) is not None:
        _expect(info[name], Field(TEXT), f"{where}: outputs.{key}.{name}")
  kind = CASE_KINDS.get(module_class(meta)) if module_class(meta) in CASE_KINDS else None
  if kind is None:
    return
  config = meta.get("config", {})
  for name, field in kind.config.items():
    if name in config:
      _expect(config[name], field, f"{where}: config.{name}")
    elif field.required:
      expected = field.type if isinstance(field.type, str) else f"one of {list(field.type)}"
      raise ConfigError(f"{where}: config has no {name!r} ({expected}), which a {module_class(meta)} case needs")
