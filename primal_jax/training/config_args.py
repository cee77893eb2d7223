"""Config lookup (`--config=NAME[:arg]` or `--config=path/to/config.py[:arg]`) and its `:arg` suffix.

A config is named by the module name of a packaged config (`uea`, `lra`, ... in `primal_jax/configs/`,
`list_configs()`), so `pip install primal-jax[train]` can train from any directory, or by the path of any
Python file that defines `get_config(arg)`, so a user's own config needs no packaging. A spec that ends in
`.py` or holds a path separator is a path; anything else is a name.

`arg` is a comma-separated list of `key=value` pairs and bare switches (big_vision style), e.g.
`dataset=JapaneseVowels,family=primal_plus,smoke`. Every config file declares the keys it understands, so
a typo is an error instead of a silently ignored setting.

Every mistake here raises `primal_jax.errors.ConfigError` naming the argument and what it accepts, which
the binaries print as one line.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import pkgutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import primal_jax.configs
from primal_jax.errors import ConfigError, MissingFileError
from primal_jax.training.guards.run_config import add_run_controls

CONFIG_PACKAGE = primal_jax.configs.__name__


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
      raise ConfigError(f"unknown config argument {key!r}; accepted: {', '.join(sorted(defaults))}")
    default = defaults[key]
    if not sep:
      if not isinstance(default, bool):
        raise ConfigError(f"config argument {key!r} needs a value ({key}=...)")
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
      kind = type(default).__name__
      raise ConfigError(f"config argument {key}={value!r} is not a valid {kind} (default {default!r})") from err
  return out


def load_module(path: str | Path, kind: str = "config"):
  """The Python file at `path` as a fresh module object (not added to `sys.modules`)."""
  path = Path(path)
  if not path.is_file():
    where = "" if path.is_absolute() else f" (relative to {os.getcwd()})"
    raise MissingFileError(f"{kind} file {path} does not exist{where}")
  module_spec = importlib.util.spec_from_file_location(f"_primal_jax_{kind}_{path.stem}", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


def list_configs() -> dict[str, str]:
  """{name: first line of its docstring} of the packaged configs, read without importing them."""
  found = {}
  for info in sorted(pkgutil.iter_modules(primal_jax.configs.__path__), key=lambda m: m.name):
    if info.ispkg or info.name.startswith("_"):
      continue
    source = Path(info.module_finder.path) / f"{info.name}.py"
    doc = ast.get_docstring(ast.parse(source.read_text())) or ""
    found[info.name] = doc.strip().split("\n")[0]
  return found


def _is_path(source: str) -> bool:
  return source.endswith(".py") or "/" in source or os.sep in source


def _missing_config(source: str) -> ConfigError:
  """The error for a config that is neither a file nor a packaged name, pointing at the name if one matches."""
  names = list_configs()
  stem = Path(source).stem
  if _is_path(source):
    where = "" if Path(source).is_absolute() else f" (relative to {os.getcwd()})"
    hint = f"; the packaged config of that name is --config={stem}" if stem in names else ""
    return MissingFileError(f"config file {source} does not exist{where}{hint}; packaged configs: "
                            f"{', '.join(names)}")  # fmt: skip
  return ConfigError(f"unknown config name {source!r}; packaged configs: {', '.join(names)} "
                     "(or a path to a config file, ending in .py)")  # fmt: skip


def config_module(source: str):
  """The module of a config: a packaged one by name (`uea`), else the Python file at `source`."""
  if _is_path(source):
    if not Path(source).is_file():
      raise _missing_config(source)
    return load_module(source)
  if source not in list_configs():
    raise _missing_config(source)
  return importlib.import_module(f"{CONFIG_PACKAGE}.{source}")


def load_config(spec: str | Path, *, lock: bool = True):
  """The ConfigDict of `NAME[:arg]` or `path/to/config.py[:arg]`, exactly as `--config=` loads it.

  For the CLI, tests, notebooks and sweep runners alike, so every one of them resolves names the same way.
  """
  source, _, arg = str(spec).partition(":")
  module = config_module(source)
  if not hasattr(module, "get_config"):
    raise ConfigError(f"config {source} defines no get_config(arg)")
  config = module.get_config(arg or None)
  add_run_controls(config)  # resume_step, accept_config_changes: every config has them, a user's own too
  if lock:
    config.lock()
  return config
