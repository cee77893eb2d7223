"""The rule types of the config schema: what one value of a config accepts, said in words and checked.

A rule is data (`Rule(accepts, test)`): `accepts` finishes the sentence "KEY must be ...", so every refusal
reads `KEY must be <accepts>, got <value>`; `test(value)` says whether the value is one of them. Choices may be
a callable (a registry's names, read when checked, so an entry registered after import counts).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Rule:
  """What a config key accepts: `accepts` in words ("an integer >= 1"), `test(value) -> bool`."""

  accepts: str | Callable[[], str]
  test: Callable[[Any], bool]

  def describe(self) -> str:
    return self.accepts() if callable(self.accepts) else self.accepts

  def __call__(self, value: Any) -> bool:
    try:
      return bool(self.test(value))
    except (TypeError, ValueError):
      return False


def _is_int(value: Any) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _bounds(lo, hi, lo_open: bool, hi_open: bool) -> str:
  if lo is not None and hi is not None:
    return f" in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
  if lo is not None:
    return f" {'>' if lo_open else '>='} {lo}"
  if hi is not None:
    return f" {'<' if hi_open else '<='} {hi}"
  return ""


def _within(value, lo, hi, lo_open: bool, hi_open: bool) -> bool:
  if lo is not None and (value < lo or (lo_open and value == lo)):
    return False
  return not (hi is not None and (value > hi or (hi_open and value == hi)))


def integer(lo: int | None = None, hi: int | None = None) -> Rule:
  """An integer (not a bool) in [lo, hi]."""
  return Rule(f"an integer{_bounds(lo, hi, False, False)}", lambda v: _is_int(v) and _within(v, lo, hi, False, False))


def number(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False) -> Rule:
  """A finite real number (an int or a float, not a bool, never NaN or inf) within the bounds."""
  return Rule(
    f"a finite number{_bounds(lo, hi, lo_open, hi_open)}",
    lambda v: _is_real(v) and math.isfinite(v) and _within(v, lo, hi, lo_open, hi_open),
  )


RATE = number(0, 1, hi_open=True)  # a dropout rate: 1 would drop everything


def one_of(choices: Iterable[str] | Callable[[], Iterable[str]], *, listed: bool = False) -> Rule:
  """One of `choices` (a callable: read at each check). `listed` writes them as a list, as `Registry.get` does."""

  def names() -> list[str]:
    return list(choices() if callable(choices) else choices)

  def accepts() -> str:
    return f"one of {sorted(names())}" if listed else f"one of {', '.join(names())}"

  return Rule(accepts, lambda v: isinstance(v, str) and v in names())


BOOLEAN = Rule("True or False", lambda v: isinstance(v, bool))
TEXT = Rule("a string", lambda v: isinstance(v, str))


def optional(rule: Rule) -> Rule:
  """None, or what `rule` accepts."""
  return Rule(lambda: f"None or {rule.describe()}", lambda v: v is None or rule(v))


def sequence(rule: Rule, *, what: str = "a list") -> Rule:
  """A list or tuple (never a string) of values that `rule` accepts."""

  def test(v) -> bool:
    return isinstance(v, Sequence) and not isinstance(v, str) and all(rule(item) for item in v)

  return Rule(lambda: f"{what} of {rule.describe().removeprefix('a ').removeprefix('an ')}s", test)


def mesh_shape() -> Rule:
  """A device mesh shape: positive integers with at most one -1 (the remaining devices)."""

  def test(v) -> bool:
    entries = list(v)
    return bool(entries) and all(_is_int(e) and (e >= 1 or e == -1) for e in entries) and entries.count(-1) <= 1

  return Rule("a list of integers >= 1 with at most one -1 (the remaining devices)", test)


def show(value: Any) -> str:
  """`value` as a refusal names it: its repr, cut to 80 characters; a mapping's items as a dict."""
  if isinstance(value, Mapping):
    value = dict(value)
  text = repr(value)
  return text if len(text) <= 80 else text[:77] + "..."


def refusal(key: str, value: Any, accepts: str) -> str:
  """The one line of a refused value: `--config.KEY: KEY must be ACCEPTS, got VALUE`."""
  return f"--config.{key}: {key} must be {accepts}, got {show(value)}"
