"""The independent checker of ListOps labels: a stack machine that shares no evaluation code with the generator.

The generator applies each operator inline as its bracket closes; this module
parses text or token ids on its own (`text.listops_symbols` only splits them
into symbols) and applies operators written apart on purpose, so the tests can
check every generated label against it. The operators, as LRA's::

  MIN, MAX  smallest / largest argument
  MED       LRA's `int(np.median(args))`: the middle argument for an odd count;
            for an even count the mean of the two middle arguments rounded
            down (digits are >= 0, so int() truncation is floor), e.g.
            [MED 1 4 ] = 2 (statistics.median_low would give 1)
  SM        sum of the arguments modulo 10
"""

from __future__ import annotations

import functools
import statistics
import types
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from primal_jax.tasks.lra.listops.text import listops_symbols


def _sum_mod_10(args: Sequence[int]) -> int:
  return functools.reduce(lambda total, x: (total + x) % 10, args, 0)


# Written apart from the generator's inline arithmetic on purpose: a test checks one against the other.
_EVALUATE: Mapping[str, Callable[[Sequence[int]], int]] = types.MappingProxyType(
  {
    "[MIN": min,
    "[MAX": max,
    "[MED": lambda args: int(statistics.median(args)),  # LRA: int(np.median(args)), floor of the mean of the middle two
    "[SM": _sum_mod_10,
  }
)


def evaluate_listops(expression: str | Sequence[int] | np.ndarray) -> int:
  """The value (label) of one ListOps expression given as text or token ids.

  Accepts LRA text with or without its parentheses, or token ids (trailing
  padding allowed). A bare digit is an expression too. An operator may take
  any positive number of arguments.

  Raises:
    ValueError: unknown token, unbalanced brackets or parentheses, an operator
      without arguments, an empty expression, or more than one top-level value.
  """
  symbols = listops_symbols(expression)
  if not symbols:
    raise ValueError("expression is empty")
  frames: list[tuple[str, list[int]]] = []  # open operators and the values of their arguments so far
  results: list[int] = []  # completed top-level values
  for position, symbol in enumerate(symbols):
    if symbol in _EVALUATE:
      frames.append((symbol, []))
      continue
    if symbol == "]":
      if not frames:
        raise ValueError(f"expression has an unmatched ']' at position {position}")
      operator, args = frames.pop()
      if not args:
        raise ValueError(f"operator {operator} closed at position {position} has no arguments")
      value = _EVALUATE[operator](args)
    else:
      value = int(symbol)
    (frames[-1][1] if frames else results).append(value)
  if frames:
    raise ValueError(f"expression has {len(frames)} unclosed operators (missing ']')")
  if len(results) != 1:
    raise ValueError(f"expression has {len(results)} top-level values; a ListOps expression is a single value")
  return results[0]
