"""Argument checks that fail early with a message naming the argument.

Every check runs on static shapes at trace time, so it costs nothing under
`jit`. The one value check (`check_finite`) is opt-in: it needs concrete values
(eager mode) or a host callback (under `jit`).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np


def check_rank(x, rank: int, name: str, layout: str) -> None:
  """Raises ValueError unless `x` has `rank` dimensions (layout e.g. '[batch, length, features]')."""
  if jnp.ndim(x) != rank:
    raise ValueError(f"{name} must have rank {rank} {layout}, got shape {tuple(jnp.shape(x))}")


def check_positive(value: int, name: str) -> None:
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
    raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def check_rate(value, name: str) -> None:
  """Raises ValueError unless `value` is a real number in [0, 1) (a dropout or drop-path rate: 1 drops everything)."""
  ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
  if not (ok and 0.0 <= float(value) < 1.0):
    raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")


def check_divisible(total: int, parts: int, total_name: str, parts_name: str) -> None:
  if total % parts != 0:
    raise ValueError(
      f"{total_name}={total} must be divisible by {parts_name}={parts} "
      f"(each head owns {total_name} / {parts_name} contiguous channels)"
    )


def check_choice(value: str, choices: Sequence[str], name: str) -> None:
  if value not in choices:
    raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def check_same_shape(a, b, name_a: str, name_b: str) -> None:
  if tuple(jnp.shape(a)) != tuple(jnp.shape(b)):
    raise ValueError(f"{name_b} must have the same shape as {name_a} {tuple(jnp.shape(a))}, got {tuple(jnp.shape(b))}")


def _raise_if_not_finite(ok, name):
  if not bool(ok):
    raise ValueError(f"{name} contains NaN or inf values")


def check_finite(x, name: str) -> None:
  """Raises ValueError if `x` holds NaN/inf.

  Eagerly (concrete `x`) the error is raised here. Under `jit` a host callback
  raises it when the computation runs; JAX then re-raises it wrapped in its
  runtime error, with this message.
  """
  ok = jnp.all(jnp.isfinite(x))
  if isinstance(ok, jax.core.Tracer):
    jax.debug.callback(_raise_if_not_finite, ok, name)
  else:
    _raise_if_not_finite(ok, name)
