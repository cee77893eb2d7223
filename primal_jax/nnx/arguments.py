"""`nnx.MultiHeadAttention`'s constructor arguments, mapped onto the Linen layer an NNX layer builds.

Every argument of the installed `flax.nnx.MultiHeadAttention` is accepted. One that the mechanism's Linen class
has as a field of the same name is forwarded (the Linen layer honours it: `out_kernel_init`, `normalize_qk`,
the `*_dot_general` hooks, `num_kv_heads`, ...); one at Flax's default needs nothing; any other value is refused
in one line naming the argument, the value and what is accepted. `*_promote_dtype` functions have nnx's
signature (`fn(args, /, *, dtype, inexact)`), the Linen fields Linen's (`fn(*args, dtype, inexact)`):
`linen_promote` adapts one to the other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from flax import nnx
from flax.nnx.nn import attention as nnx_attention
from flax.nnx.nn import dtypes as nnx_dtypes

# nnx.MultiHeadAttention arguments an NNX layer forwards to a Linen field of the same name, with Flax's default.
FLAX_DEFAULTS: dict[str, Any] = {
  "out_kernel_init": None,
  "out_bias_init": None,
  "attention_fn": nnx_attention.dot_product_attention,
  "normalize_qk": False,
  "qkv_promote_dtype": nnx_dtypes.promote_dtype,
  "out_promote_dtype": nnx_dtypes.promote_dtype,
  "ln_promote_dtype": nnx_dtypes.promote_dtype,
  "qkv_dot_general": None,
  "out_dot_general": None,
  "qkv_dot_general_cls": None,
  "out_dot_general_cls": None,
}
PROMOTE = ("qkv_promote_dtype", "out_promote_dtype", "ln_promote_dtype")
INITS = ("out_kernel_init", "out_bias_init")


def _is_default(key: str, value: Any) -> bool:
  default = FLAX_DEFAULTS[key]
  if value is None:
    return True  # None: "Flax's default" for every argument here (nnx itself treats None so for the inits)
  return value is default if callable(default) or default is None else value == default


def linen_promote(fn: Callable) -> Callable:
  """An nnx-style promote_dtype function (`fn(args, /, *, dtype, inexact)`) in Linen's signature (`fn(*args, ...)`)."""

  def promote(*args, dtype=None, inexact=True):
    return list(fn(tuple(args), dtype=dtype, inexact=inexact))

  promote.nnx_promote_dtype = fn
  return promote


def forwarded_fields(layer_name: str, linen_class: type, num_heads: int, num_kv_heads, flax_args: dict) -> dict:
  """The Linen fields that carry `flax_args` (nnx.MultiHeadAttention arguments) and `num_kv_heads`.

  An argument at Flax's default is left out (the Linen field's own default is the same behaviour); another
  value needs a Linen field of its name, else ValueError in one line. `out_kernel_init` / `out_bias_init` are
  returned as given (the caller strips metadata they attach).
  """
  fields = {f.name for f in dataclasses.fields(linen_class)}
  out: dict[str, Any] = {}
  for key, value in flax_args.items():
    if _is_default(key, value):
      continue
    if key not in fields:
      default = FLAX_DEFAULTS[key]
      shown = getattr(default, "__qualname__", repr(default))
      raise ValueError(
        f"{layer_name}: {key}={_show(value)} is not supported by this attention (accepted: {shown}, Flax's default)"
      )
    out[key] = linen_promote(value) if key in PROMOTE else value
  if num_kv_heads is not None and num_kv_heads != num_heads:
    if "num_kv_heads" not in fields:
      raise ValueError(
        f"{layer_name}: num_kv_heads={num_kv_heads} (grouped-query attention) is not supported by this attention "
        f"(accepted: None or num_heads={num_heads})"
      )
    out["num_kv_heads"] = num_kv_heads
  return out


def _show(value: Any) -> str:
  return getattr(value, "__qualname__", None) or repr(value)


def plain_init(init, found: dict, key: str):
  """`init` returning plain arrays: metadata an `nnx.with_partitioning` / `nnx.with_metadata` initialiser
  attaches is kept in `found[key]` (and given to the projections' Variables, as nnx.MultiHeadAttention does)."""
  if init is None:
    return None

  def plain(*args, **kwargs):
    value = init(*args, **kwargs)
    if isinstance(value, nnx.VariableMetadata):
      found[key] = dict(value.metadata)
      return value.raw_value
    return value

  return plain


def variable_metadata(
  wrapped: dict, kernel: Mapping, bias: Mapping, out_kernel: Mapping, out_bias: Mapping, ln_scale: Mapping
):
  """`override(path, metadata)` for `to_variables`: the nnx metadata arguments on the Variables they name.

  `wrapped` holds what partitioned initialisers attached, keyed "kernel", "bias", "out_kernel", "out_bias".
  `ln_scale` maps "query_ln" / "key_ln" to the metadata of that LayerNorm's scale (`normalize_qk=True`).
  """
  inner = {"kernel": kernel, "bias": bias}
  outer = {"kernel": out_kernel or kernel, "bias": out_bias or bias}

  def override(path, found):
    extra: Mapping = {}
    if len(path) == 2 and path[0] in ("query", "key", "value"):
      extra = {**wrapped.get(path[1], {}), **inner.get(path[1], {})}
    elif len(path) == 2 and path[0] == "out":
      extra = {**wrapped.get(f"out_{path[1]}", wrapped.get(path[1], {})), **outer.get(path[1], {})}
    elif len(path) == 2 and path[0] in ln_scale and path[1] == "scale":
      extra = ln_scale[path[0]]
    return {**found, **extra}

  return override


def has_stream(rngs: nnx.Rngs, name: str) -> bool:
  """Whether `rngs[name]` gives keys (the stream itself or nnx's "default" fallback)."""
  try:
    rngs[name]
  except KeyError:
    return False
  return True
