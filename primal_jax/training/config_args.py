"""Parsing of the `:arg` suffix of `--config=path/to/config.py:arg` (big_vision style).

`arg` is a comma-separated list of `key=value` pairs and bare switches, e.g.
`dataset=JapaneseVowels,family=primal_plus,smoke`. Every config file declares
the keys it understands, so a typo is an error instead of a silently ignored
setting.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def parse_config_arg(arg: str | None, defaults: Mapping[str, Any]) -> dict[str, Any]:
  """`defaults` updated from `arg`; values are converted to the type of their default.

  A bare `name` sets a boolean default to True. Unknown keys, and values that do
  not convert, raise ValueError naming the key and the accepted ones.
  """
  out = dict(defaults)
  for item in filter(None, (part.strip() for part in (arg or "").split(","))):
    key, sep, value = item.partition("=")
    key = key.strip()
    if key not in defaults:
      raise ValueError(f"unknown config argument {key!r}; accepted: {', '.join(sorted(defaults))}")
    default = defaults[key]
    if not sep:
      if not isinstance(default, bool):
        raise ValueError(f"config argument {key!r} needs a value ({key}=...)")
      out[key] = True
      continue
    try:
      if isinstance(default, bool):
        if value.lower() not in ("true", "false", "1", "0"):
          raise ValueError(value)
        out[key] = value.lower() in ("true", "1")
      else:
        out[key] = type(default)(value) if default is not None else value
    except ValueError as err:
      raise ValueError(f"config argument {key}={value!r} is not a valid {type(default).__name__}") from err
  return out


def load_module(path: str | Path, kind: str = "config"):
  """The Python file at `path` as a fresh module object (not added to `sys.modules`)."""
  path = Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"{kind} file {path} does not exist")
  module_spec = importlib.util.spec_from_file_location(f"_primal_jax_{kind}_{path.stem}", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


def load_config(spec: str | Path, *, lock: bool = True):
  """The ConfigDict of `path/to/config.py[:arg]`, exactly as `--config=` would load it.

  For tests, notebooks and sweep runners that build configs without absl flags.
  """
  path, _, arg = str(spec).partition(":")
  module = load_module(path)
  if not hasattr(module, "get_config"):
    raise ValueError(f"config file {path} defines no get_config(arg)")
  config = module.get_config(arg or None)
  if lock:
    config.lock()
  return config
