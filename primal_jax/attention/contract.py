"""What `AttentionShell` owes to Flax's `MultiHeadDotProductAttention` contract, as small functions.

Inputs (`resolve_inputs`: Flax's defaults, its errors and warnings), leading batch axes
(`[batch_sizes..., length, features]`, any number including none: `flat_batch` folds them into one axis
for the mechanisms and `flat_mask` folds a mask broadcast as Flax broadcasts it), the dtype rule
(`compute_dtype`, Flax's promotion with `dtype=None`) and initialisers that may or may not carry logical
partitioning (`is_boxed_init`, `plain_init`).
"""

from __future__ import annotations

import functools
import math
import warnings

import jax
import jax.numpy as jnp
from flax.core import meta

from primal_jax.validation import check_finite

# Flax's own messages (its tests match them), so code written against Flax reads the same errors.
KV_AND_ALIAS = (
  "If either `inputs_k` or `inputs_v` is not None, `inputs_kv` must be None. If `inputs_kv` is not None, both "
  "`inputs_k` and `inputs_v` must be None. We recommend using `inputs_k` and `inputs_v` args, since `inputs_kv` "
  "will be deprecated soon. See https://github.com/google/flax/discussions/3389 for more information."
)
V_WITHOUT_K = (
  "`inputs_k` cannot be None if `inputs_v` is not None. To have both `inputs_k` and `inputs_v` be the same "
  "value, pass in the value to `inputs_k` and leave `inputs_v` as None."
)
KV_DEPRECATED = (
  "The inputs_kv arg will be deprecated soon. Use inputs_k and inputs_v instead. See "
  "https://github.com/google/flax/discussions/3389 for more information."
)
MASK_AS_VALUES = (
  "You are passing an array of shape {shape} to the `inputs_v` arg, when you may have intended to pass it to the "
  "`mask` arg. As of Flax version 0.7.4, the function signature of MultiHeadDotProductAttention's `__call__` "
  "method has changed to `__call__(inputs_q, inputs_k=None, inputs_v=None, *, inputs_kv=None, mask=None, "
  "deterministic=None)`. Use the kwarg `mask` instead. See https://github.com/google/flax/discussions/3389 and "
  "read the docstring for more information."
)


def resolve_inputs(inputs_q, inputs_k, inputs_v, inputs_kv, *, debug_checks: bool = False):
  """(keys input, values input) with Flax's defaults (keys = queries, values = keys), errors and warnings.

  `inputs_kv` is Flax's deprecated alias for both; `inputs_v` without `inputs_k` is refused, as Flax does.
  Every input must have rank >= 2 ([batch_sizes..., length, features]); with `debug_checks`, NaN/inf is refused.
  """
  if inputs_kv is not None:
    if inputs_k is not None or inputs_v is not None:
      raise ValueError(KV_AND_ALIAS)
    inputs_k = inputs_v = inputs_kv
    warnings.warn(KV_DEPRECATED, DeprecationWarning, stacklevel=3)
  else:
    if inputs_k is None:
      if inputs_v is not None:
        raise ValueError(V_WITHOUT_K)
      inputs_k = inputs_q
    if inputs_v is None:
      inputs_v = inputs_k
    elif inputs_v.shape[-1] == inputs_v.shape[-2]:
      warnings.warn(MASK_AS_VALUES.format(shape=inputs_v.shape), DeprecationWarning, stacklevel=3)
  for name, value in (("inputs_q", inputs_q), ("inputs_k", inputs_k), ("inputs_v", inputs_v)):
    if jnp.ndim(value) < 2:
      raise ValueError(f"{name} must have shape [batch_sizes..., length, features], got {tuple(jnp.shape(value))}")
    if debug_checks:
      check_finite(value, name)
  return inputs_k, inputs_v


def check_batch_and_length(inputs_q, projected: dict[str, jax.Array]) -> None:
  """Keys and values share their batch axes with the queries, and their length with each other."""
  batch = tuple(inputs_q.shape[:-1])[:-1]
  for name, x in projected.items():
    if tuple(x.shape[:-3]) != batch:
      raise ValueError(f"inputs_{name[0]} must have the batch axes {batch} of inputs_q, got shape {x.shape[:-2]}")
  if "key" in projected and "value" in projected and projected["key"].shape[-3] != projected["value"].shape[-3]:
    raise ValueError(
      f"inputs_v must have as many positions as inputs_k ({projected['key'].shape[-3]}), "
      f"got {projected['value'].shape[-3]}"
    )


def flat_batch(x: jax.Array | None, tail: int) -> jax.Array | None:
  """``[batch_sizes..., *tail]`` -> ``[prod(batch_sizes), *tail]`` (a single axis of size 1 with none)."""
  if x is None:
    return None
  shape = x.shape[x.ndim - tail :]
  return x.reshape((math.prod(x.shape[: x.ndim - tail]),) + shape)


def flat_mask(mask, batch: tuple[int, ...], q_len: int, k_len: int):
  """A mask for the folded batch: [B, M] padding, or [B|1, 1|H, N, M] "may attend".

  `mask` is either the project's key padding [batch_sizes..., M] or Flax's attention mask, any shape that
  broadcasts to [batch_sizes..., heads, N, M] (as `jnp.where(mask, ...)` broadcasts it in Flax).
  """
  if mask is None:
    return None
  mask = jnp.asarray(mask)
  b = math.prod(batch)
  if mask.ndim == len(batch) + 1 and tuple(mask.shape) == (*batch, k_len):
    return mask.reshape(b, k_len)
  if mask.ndim > len(batch) + 3 or mask.ndim < 2:
    raise ValueError(
      f"mask must have shape broadcasting to [batch_sizes..., heads, queries, keys] = "
      f"{(*batch, 'H', q_len, k_len)} or key padding {(*batch, k_len)}, got {tuple(mask.shape)}"
    )
  mask = mask.reshape((1,) * (len(batch) + 3 - mask.ndim) + tuple(mask.shape))
  heads = mask.shape[-3]
  try:
    mask = jnp.broadcast_to(mask, (*batch, heads, q_len, k_len))
  except ValueError:
    raise ValueError(
      f"mask must have shape broadcasting to [batch_sizes..., heads, queries, keys] = "
      f"{(*batch, heads, q_len, k_len)}, got {tuple(mask.shape)}"
    ) from None
  return mask.reshape(b, heads, q_len, k_len)


def compute_dtype(dtype, *arrays_and_dtypes):
  """The layer's computation dtype: `dtype`, or Flax's promotion of the inputs with the parameters."""
  return dtype if dtype is not None else jnp.result_type(*arrays_and_dtypes)


@functools.lru_cache(maxsize=512)
def _boxed_cached(init) -> bool:
  return _boxed(init)


def _boxed(init) -> bool:
  for shape in ((2, 2), (2, 2, 2), (2,)):
    try:
      out = jax.eval_shape(lambda key, shape=shape: init(key, shape, jnp.float32), jax.random.key(0))
    except Exception:  # noqa: BLE001 -- an initialiser that refuses this rank: try another
      continue
    return isinstance(out, meta.AxisMetadata)
  return False


def is_boxed_init(init) -> bool:
  """True when `init` returns a metadata box (e.g. `nn.with_logical_partitioning(...)`), found by tracing it."""
  if init is None:
    return False
  try:
    return _boxed_cached(init)
  except TypeError:  # unhashable
    return _boxed(init)


def plain_init(init):
  """`init` with any metadata box it returns removed (for parameters the box's names do not describe)."""
  if init is None:
    return None

  @functools.wraps(init)
  def plain(*args, **kwargs):
    value = init(*args, **kwargs)
    return value.unbox(apply_constraint=False) if isinstance(value, meta.AxisMetadata) else value

  return plain
