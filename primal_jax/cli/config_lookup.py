"""Config lookup: `--config=NAME[:arg]` or `--config=path/to/config.py[:arg]`, the one place that finds configs.

A config is named by a name in `primal_jax.tasks.CONFIGS` (`uea`, `lra`, `lm`, `d4rl`, `vit`: each family's
`config.py`, `list_configs()`), so `pip install primal-jax[train]` can train from any directory, or by the
path of any Python file that defines `get_config(arg)`, so a user's own config needs no packaging. A spec that
ends in `.py` or holds a path separator is a path; anything else is a name.

`arg` is a comma-separated list of `key=value` pairs and bare switches (big_vision style), e.g.
`dataset=JapaneseVowels,family=primal_plus,smoke`, parsed by each config with
`primal_jax.tasks.common.parse_config_arg`, so a typo is an error instead of a silently ignored setting.

Every mistake here raises `primal_jax.errors.ConfigError` naming the argument and what it accepts, which
the binaries print as one line.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
from pathlib import Path

from primal_jax.errors import ConfigError, MissingFileError
from primal_jax.tasks import CONFIGS
from primal_jax.training.guards.run_config import add_run_controls


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


def _first_doc_line(source: Path | None, get_config) -> str:
  if source is not None:
    doc = ast.get_docstring(ast.parse(source.read_text())) or ""
  else:
    doc = inspect.getdoc(inspect.getmodule(get_config)) or inspect.getdoc(get_config) or ""
  return doc.strip().split("\n")[0]


def list_configs() -> dict[str, str]:
  """{name: first line of its module's docstring} of the registered configs; the built-in ones are read
  without importing them."""
  found = {}
  for name in CONFIGS:
    entry = CONFIGS.lazy_entry(name)
    if entry is not None:  # a built-in: its module's source, not imported
      found[name] = _first_doc_line(Path(importlib.util.find_spec(entry.module).origin), None)
    else:
      found[name] = _first_doc_line(None, CONFIGS.get(name))
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


def config_function(source: str):
  """The `get_config(arg)` of a config: a registered one by name (`uea`), else the Python file at `source`."""
  if _is_path(source):
    if not Path(source).is_file():
      raise _missing_config(source)
    module = load_module(source)
    if not hasattr(module, "get_config"):
      raise ConfigError(f"config {source} defines no get_config(arg)")
    return module.get_config
  if source not in CONFIGS:
    raise _missing_config(source)
  return CONFIGS.get(source)


def load_config(spec: str | Path, *, lock: bool = True):
  """The ConfigDict of `NAME[:arg]` or `path/to/config.py[:arg]`, exactly as `--config=` loads it.

  For the CLI, tests, notebooks and sweep runners alike, so every one of them resolves names the same way.
  """
  source, _, arg = str(spec).partition(":")
  config = config_function(source)(arg or None)
  add_run_controls(config)  # resume_step, accept_config_changes: every config has them, a user's own too
  if lock:
    config.lock()
  return config
