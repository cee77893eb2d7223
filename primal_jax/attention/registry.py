"""One registry from attention name to module class, and the per-layer attention spec.

A layer is named by its attention and that attention's own options: the
options are the attributes of the registered class (`PrimalAttention.low_rank`,
`PerformerAttention.num_features`, ...), so adding a mechanism is one module
(a subclass of `AttentionShell`) plus one `register_attention` line, with no
edit to the model config. What the model decides for every layer alike (heads,
causality, decoding, dtypes, the dropout generator) is not an option;
`dropout_rate` and `init_style` default to the model's and an option may
override them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from primal_jax.attention.baselines import (
  CosformerAttention,
  FlowformerAttention,
  LinearAttention,
  LinformerAttention,
  LongformerAttention,
  NystromAttention,
  PerformerAttention,
  ReformerAttention,
  SoftAttention,
  YosoAttention,
)
from primal_jax.attention.gpt2 import GPT2Attention
from primal_jax.attention.kep_svgp import KEPSVGPAttention
from primal_jax.attention.primal import PrimalAttention
from primal_jax.attention.shell import AttentionShell
from primal_jax.attention.softmax import SoftmaxAttention
from primal_jax.registry import Registry


def _check_attention(cls) -> None:
  if not (isinstance(cls, type) and issubclass(cls, AttentionShell)):
    raise ValueError(f"an attention must subclass primal_jax.attention.AttentionShell, got {cls!r}")


# name -> AttentionShell subclass: a read-only Mapping; extend it with `register_attention`.
ATTENTIONS: Registry[type[AttentionShell]] = Registry("attention", "attention", _check_attention)
for _name, _cls in {
  "primal": PrimalAttention,
  "softmax": SoftmaxAttention,
  # Softmax with GPT-2's masking arithmetic (the Decision Transformer release's non-Primal layers).
  "gpt2": GPT2Attention,
  # Baselines of the paper's tables (primal_jax.attention.baselines): linear and cosFormer are Table 1 / 4 ones,
  # Performer is in Tables 1, 2 and 4, Linformer and Nystromformer in Table 2 (LRA) only.
  "linear": LinearAttention,
  "performer": PerformerAttention,
  "linformer": LinformerAttention,
  "nystromformer": NystromAttention,
  "cosformer": CosformerAttention,
  # The release's LRA Reformer and its RL Flowformer.
  "reformer": ReformerAttention,
  "flowformer": FlowformerAttention,
  # Non-release baselines of the paper's tables, against their authors' code (tools/upstream_baselines.py).
  "longformer": LongformerAttention,
  "yoso_e": YosoAttention,
  "soft": SoftAttention,
  # KEP-SVGP (Chen et al., ICML 2024): a sparse variational GP over the KSVD features (attention/kep_svgp).
  "kep_svgp": KEPSVGPAttention,
}.items():
  ATTENTIONS.register(_name, _cls, builtin=True)

# Attributes the model sets on every layer (`TransformerConfig`); a layer's options may not. `init_style` is the
# model's default that a layer may override: the release's CV Primal blocks keep PyTorch's default Linear init
# inside a timm-initialised ViT (`primal_jax.models.vit`).
MODEL_FIELDS = frozenset({"num_heads", "causal", "decode", "dtype", "param_dtype", "dropout_impl"})
# Flax's own dataclass fields, never options.
_FLAX_FIELDS = frozenset({"parent", "name"})


def register_attention(name: str, cls: type[AttentionShell], *, replace: bool = False) -> None:
  """Makes `cls` available to every model by `name` (one line per mechanism)."""
  ATTENTIONS.register(name, cls, replace=replace)


def unregister_attention(name: str) -> None:
  """Removes a mechanism registered with `register_attention` (a replaced built-in gets its own class back)."""
  ATTENTIONS.unregister(name)


def registered_attention(name: str, cls: type[AttentionShell], *, replace: bool = False):
  """`register_attention` for the duration of a `with` block."""
  return ATTENTIONS.registered(name, cls, replace=replace)


def get_attention(name: str, where: str = "attention") -> type[AttentionShell]:
  """The attention class registered under `name` (one of `ATTENTIONS`); `where` names the argument in errors."""
  return ATTENTIONS.get(name, where)


def option_names(name: str) -> tuple[str, ...]:
  """The options a layer of attention `name` accepts: its class's attributes less the model's."""
  fields = (f.name for f in dataclasses.fields(get_attention(name)))
  return tuple(f for f in fields if f not in MODEL_FIELDS and f not in _FLAX_FIELDS)


def check_options(name: str, options: Mapping[str, Any], where: str = "options") -> dict[str, Any]:
  """`options` as a dict, after checking every key is an option of attention `name`."""
  if not isinstance(options, Mapping):
    raise ValueError(f"{where} of attention {name!r} must be a mapping of option -> value, got {options!r}")
  accepted = option_names(name)
  for key in options:
    if key in MODEL_FIELDS:
      raise ValueError(f"{where}: {key!r} is set by the model config for every layer, not per attention")
    if key not in accepted:
      raise ValueError(f"{where}: {key!r} is not an option of attention {name!r}; accepted: {', '.join(accepted)}")
  return dict(options)


# --- What a mechanism cannot do, as metadata that configs and CLIs read (`primal_jax.training.config_schema`, the
# `lm` and `d4rl` configs): each class states it in its class attributes (`AttentionShell.supports_causal`,
# `supports_decode`; `finite_on_padded_rows`, default True, for a mechanism whose fully padded row is not finite),
# and an option may take a form away (cosFormer decodes only with a `horizon`; a `form="release"` baseline has no
# causal form), which the class's own `validate` says.
FORMS = ("causal", "decode")
# model.name -> the forms a model family builds its attention layers in (a family not listed: the full, non-causal
# form): the LM trains causally and decodes (`generation.generate`, primal-generate); the Decision Transformer
# trains causally and acts from full calls over its context. A family registered elsewhere adds its own line.
MODEL_NEEDS: dict[str, tuple[str, ...]] = {"lm": ("causal", "decode"), "decision_transformer": ("causal",)}


def describe_needs(needs: tuple[str, ...]) -> str:
  """ "trains causally and decodes" for ("causal", "decode"): what a family needs, in words."""
  if not needs:
    return "trains in the full (non-causal) form"
  return "trains causally" + (" and decodes" if "decode" in needs else "")


@dataclasses.dataclass(frozen=True)
class Capabilities:
  """What attention `name` can do by its class alone: a causal form, incremental decoding, finite padded rows."""

  causal: bool
  decode: bool
  padded_rows: bool


def capabilities(name: str) -> Capabilities:
  """The class attributes of attention `name` that say what it can do (see `unsupported` for its options)."""
  cls = get_attention(name)
  return Capabilities(
    causal=bool(cls.supports_causal),
    decode=bool(cls.supports_decode) and bool(cls.supports_causal),
    padded_rows=bool(getattr(cls, "finite_on_padded_rows", True)),
  )


def unsupported(name: str, options: Mapping[str, Any] | None = None, *, needs: tuple[str, ...] = ()) -> str | None:
  """Why attention `name` with `options` cannot be built in the forms `needs` ("causal", "decode"), or None.

  The class attributes first (`capabilities`), then the class's own `validate` on a layer built in that form
  with those options (an option such as cosFormer's `horizon` may be what decoding needs). Builds no parameters.
  """
  unknown = sorted(set(needs) - set(FORMS))
  if unknown:
    raise ValueError(f"needs must hold only {', '.join(FORMS)}, got {unknown}")
  can = capabilities(name)
  if "causal" in needs and not can.causal:
    return f"attention {name!r} has no causal form"
  if "decode" in needs and not can.decode:
    return f"attention {name!r} has no incremental decoding form (it keeps no decoding cache)"
  options = check_options(name, dict(options or {}))
  cls = get_attention(name)
  declared = {f.name for f in dataclasses.fields(cls)}
  form = {"causal": "causal" in needs or "decode" in needs, "decode": "decode" in needs}
  fields = {k: v for k, v in {"num_heads": 1, "max_len": 512, **form}.items() if k in declared}
  try:
    cls(**{**fields, **options}).validate()
  except (ValueError, TypeError) as err:
    return f"attention {name!r} with options {options or {}} in the {'+'.join(needs) or 'full'} form: {err}"
  return None


def attentions_able(
  needs: tuple[str, ...], options_of: Mapping[str, Mapping[str, Any]] | None = None
) -> tuple[str, ...]:
  """The registered attention names that can be built in the forms `needs` (with `options_of[name]`, if given)."""
  return tuple(name for name in ATTENTIONS if unsupported(name, (options_of or {}).get(name), needs=needs) is None)


@dataclasses.dataclass(frozen=True)
class LayerSpec:
  """One layer's attention: a registered name and that attention's options (hashable, so configs stay static)."""

  attention: str
  options: tuple[tuple[str, Any], ...] = ()

  def __post_init__(self):
    check_options(self.attention, dict(self.options), f"layer {self.attention!r}")

  @classmethod
  def of(cls, entry: str | tuple | LayerSpec, defaults: Mapping[str, Any] | None = None) -> LayerSpec:
    """A spec from a name, a (name, options) pair or a spec; `defaults` (per-name options) apply first."""
    if isinstance(entry, LayerSpec):
      name, own = entry.attention, dict(entry.options)
    elif isinstance(entry, str):
      name, own = entry, {}
    elif isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], str):
      name, own = entry[0], check_options(entry[0], entry[1], f"layer {entry[0]!r}")
    else:
      raise ValueError(f"a layer must be an attention name or a (name, options) pair, got {entry!r}")
    get_attention(name, "each entry of model.layers")
    merged = {**(defaults or {}), **own}
    return cls(name, tuple(sorted(merged.items())))

  @property
  def kwargs(self) -> dict[str, Any]:
    return dict(self.options)

  def build(self, **model_fields) -> AttentionShell:
    """The (unbound) attention module: the model's fields the class declares, then this layer's options.

    `model_fields` may offer more than a class has (e.g. `max_len`, which only Linformer declares).
    """
    cls = get_attention(self.attention)
    declared = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in model_fields.items() if k in declared}
    return cls(**{**kwargs, **self.kwargs})
