"""Input handling shared by the attentions that take the `MultiHeadDotProductAttention` call signature."""

from __future__ import annotations

import jax

from primal_jax.validation import check_finite, check_rank, check_same_shape


def resolve_qkv(
  inputs_q: jax.Array,
  inputs_k: jax.Array | None,
  inputs_v: jax.Array | None,
  inputs_kv: jax.Array | None,
  *,
  debug_checks: bool = False,
) -> tuple[jax.Array, jax.Array]:
  """(keys input, values input) with Flax's defaults: keys = queries, values = keys.

  `inputs_kv` is Flax's alias for both. Raises ValueError for a wrong rank, keys
  and values of different shapes, and (with `debug_checks`) NaN/inf inputs.
  """
  if inputs_kv is not None:
    if inputs_k is not None or inputs_v is not None:
      raise ValueError("pass either inputs_k/inputs_v or inputs_kv, not both")
    inputs_k = inputs_v = inputs_kv
  inputs_k = inputs_q if inputs_k is None else inputs_k
  inputs_v = inputs_k if inputs_v is None else inputs_v
  check_rank(inputs_q, 3, "inputs_q", "[batch, length, features]")
  check_rank(inputs_k, 3, "inputs_k", "[batch, length, features]")
  check_same_shape(inputs_k, inputs_v, "inputs_k", "inputs_v")
  if debug_checks:
    for name, value in (("inputs_q", inputs_q), ("inputs_k", inputs_k), ("inputs_v", inputs_v)):
      check_finite(value, name)
  return inputs_k, inputs_v
