"""Checks of the data package's inputs (counts, seeds, fractions, config keys), each naming the bad argument.

Why not `primal_jax.validation`: those checks guard model arguments (ranks,
shapes, head divisibility) and return nothing; the data code needs checks that
also normalise (an `np.int64` seed comes back as `int`, ready for JSON cache
keys and SeedSequence), with numpy alone, so that generation and the `.ts`
parser keep working without grain or TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def is_integer(value: Any) -> bool:
  """True for Python and numpy integers; False for bool (a flag passed as a count is a mistake)."""
  return isinstance(value, int | np.integer) and not isinstance(value, bool)


def check_integer(value: Any, name: str) -> int:
  if not is_integer(value):
    raise ValueError(f"{name} must be an integer, got {value!r}")
  return int(value)


def check_nonnegative_int(value: Any, name: str) -> int:
  if not is_integer(value) or value < 0:
    raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
  return int(value)


def check_positive_int(value: Any, name: str) -> int:
  if check_nonnegative_int(value, name) == 0:
    raise ValueError(f"{name} must be a positive integer, got {value!r}")
  return int(value)


def check_int_at_least(value: Any, name: str, minimum: int) -> int:
  if not is_integer(value) or value < minimum:
    raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
  return int(value)


def check_fraction(value: Any, name: str) -> float:
  """float(value) in [0, 1): the share of a split held out (1 would leave nothing to train on)."""
  fraction = float(value)
  if not 0.0 <= fraction < 1.0:
    raise ValueError(f"{name} must lie in [0, 1), got {value!r}")
  return fraction


def config_get(data_config: Any, key: str, default: Any = None) -> Any:
  """`data_config[key]` for a mapping, else `getattr(data_config, key, default)` (ConfigDict, namespace)."""
  if isinstance(data_config, Mapping):
    return data_config.get(key, default)
  return getattr(data_config, key, default)


def require_keys(data_config: Any, keys: tuple[str, ...], task: str) -> None:
  """Names the first key that is missing (or None), before a pipeline fails somewhere less clear."""
  for key in keys:
    if config_get(data_config, key) is None:
      raise ValueError(f"data_config has no {key!r}; the {task} task needs {', '.join(keys)}")
