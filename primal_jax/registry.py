"""The one registry type behind every extension point: attentions, tasks, models and objectives.

Each kind of thing has one `Registry` and the same four verbs around it, named for the kind
(`register_attention` / `get_attention` / `unregister_attention` / `registered_attention`, and likewise
`_task`, `_model`, `_objective`):

  register(name, value, replace=False)  adds `value`; a taken name is refused unless `replace`
  get(name)                             the value, or one ConfigError line listing the registered names
  unregister(name)                      removes it; a built-in entry replaced by `register` gets its own back
  registered(name, value)               a `with` block that registers, then restores the state before it

An entry may be a `"module:attribute"` string, imported on first `get`: a family's code (and its
third-party imports) loads only when a config names it, so a UEA run never imports MuJoCo. Such a lazy
entry names the setup.cfg extras that install its imports; a missing third-party module is one line
naming it and `pip install 'primal-jax[extras]'`. The built-in entries are registered with `builtin=True`
(`primal_jax.tasks` lists the families' entries).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from primal_jax.errors import ConfigError

T = TypeVar("T")
_ABSENT = object()  # "no entry" in `Registry.registered`'s snapshot (None is not a valid marker: a value may be None)


@dataclasses.dataclass(frozen=True)
class Lazy:
  """A registry entry not imported yet: `"module:attribute"` and the extras that install its imports."""

  target: str
  extras: tuple[str, ...] = ("train",)

  def __post_init__(self):
    module, sep, attribute = self.target.partition(":")
    if not (module and sep and attribute):
      raise ValueError(f"a lazy entry must be 'module:attribute', got {self.target!r}")

  @property
  def module(self) -> str:
    return self.target.partition(":")[0]

  def load(self, kind: str, name: str) -> Any:
    module_name, _, attribute = self.target.partition(":")
    try:
      module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
      if err.name is None or err.name.partition(".")[0] == __name__.partition(".")[0]:
        raise  # a missing module of this package is a bug, not a missing extra
      raise ConfigError(
        f"{kind} {name!r} needs the {err.name!r} module, which is not installed: "
        f"pip install 'primal-jax[{','.join(self.extras)}]'"
      ) from err
    value = module
    for part in attribute.split("."):
      value = getattr(value, part)
    return value


class Registry(Mapping, Generic[T]):
  """name -> value for one kind of thing; a read-only Mapping (extend it with `register`).

  `kind` names the thing in errors ("attention", "task", ...); `where` names the config argument that
  selects one (e.g. "model.name"), so a wrong name reads `model.name must be one of [...], got 'x'`.
  `check` validates a value as it is registered (raise ValueError naming what is accepted).
  """

  def __init__(self, kind: str, where: str, check: Callable[[Any], None] | None = None):
    self.kind, self.where, self._check = kind, where, check
    self._entries: dict[str, T | Lazy] = {}
    self._builtin: set[str] = set()
    self._replaced: dict[str, T | Lazy] = {}
    self._lazy: dict[str, Lazy] = {}  # built-in entries as registered, loaded or not

  def register(self, name: str, value: T | Lazy, *, replace: bool = False, builtin: bool = False) -> None:
    if not isinstance(name, str) or not name:
      raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")
    if not isinstance(value, Lazy) and self._check is not None:
      self._check(value)
    current = self._entries.get(name)
    if current is not None and current is not value and not replace:
      raise ValueError(f"{self.kind} {name!r} is already registered; pass replace=True to replace it")
    if name in self._builtin and name not in self._replaced and not builtin:
      self._replaced[name] = current
    if builtin:
      self._builtin.add(name)
      if isinstance(value, Lazy):
        self._lazy[name] = value
    self._entries[name] = value

  def unregister(self, name: str) -> None:
    if name not in self._entries:
      raise ValueError(f"no {self.kind} is registered as {name!r}; registered: {', '.join(self)}")
    if name in self._replaced:
      self._entries[name] = self._replaced.pop(name)
    elif name not in self._builtin:  # a built-in entry not replaced stays as it is
      del self._entries[name]

  @contextlib.contextmanager
  def registered(self, name: str, value: T | Lazy, *, replace: bool = False) -> Iterator[None]:
    """Registers `value` for the block, then restores `name` exactly as it was before (absent, the built-in,
    or a user's own entry), whatever was registered under `name` inside the block."""
    before = (self._entries.get(name, _ABSENT), self._replaced.get(name, _ABSENT))
    self.register(name, value, replace=replace)
    try:
      yield
    finally:
      for table, old in zip((self._entries, self._replaced), before, strict=True):
        if old is _ABSENT:
          table.pop(name, None)
        else:
          table[name] = old

  def get(self, name: Any, where: str | None = None) -> T:  # type: ignore[override]
    if not isinstance(name, str) or name not in self._entries:
      raise ConfigError(f"{where or self.where} must be one of {sorted(self._entries)}, got {name!r}")
    value = self._entries[name]
    if isinstance(value, Lazy):
      value = value.load(self.kind, name)
      if self._check is not None:
        self._check(value)
      self._entries[name] = value
    return value

  def lazy_entry(self, name: str) -> Lazy | None:
    """The built-in entry of `name` as registered (`Lazy` until first loaded), for tooling such as
    tests/test_extras.py that must know a family's module without importing it."""
    return self._lazy.get(name)

  def __getitem__(self, name: str) -> T:
    if name not in self._entries:
      raise KeyError(name)
    return self.get(name)

  def __iter__(self) -> Iterator[str]:
    return iter(sorted(self._entries))

  def __len__(self) -> int:
    return len(self._entries)

  def __contains__(self, name: object) -> bool:
    return name in self._entries

  def __repr__(self) -> str:
    return f"Registry[{self.kind}]({', '.join(self)})"
