"""Dotted keys ("optimizer.learning_rate") into nested mappings and ConfigDicts: one setter, one getter."""

from __future__ import annotations

from typing import Any

from primal_jax.errors import ConfigError


def set_dotted(config, key: str, value: Any, *, new_leaf: bool = False) -> None:
  """Sets `config[a][b]...[leaf] = value` for `key` = "a.b...leaf".

  Every parent must exist; so must the leaf, unless `new_leaf` (a variant adding an option its config does not
  list; a locked ConfigDict still refuses it). A missing field is a ConfigError naming the key and the field; a
  value of another type than a ConfigDict field's is a ConfigError naming the key, the type it takes and the value.
  """
  *parents, leaf = key.split(".")
  node = config
  for part in parents:
    if not hasattr(node, "keys") or part not in node:
      raise ConfigError(f"override {key!r}: the config has no field {part!r}")
    node = node[part]
  if not hasattr(node, "keys") or (not new_leaf and leaf not in node):
    raise ConfigError(f"override {key!r}: the config has no field {leaf!r}")
  try:
    node[leaf] = value
  except TypeError as err:  # a ConfigDict field refuses a value of another type
    current = node[leaf]
    raise ConfigError(
      f"override {key!r}={value!r}: {key} takes a value of type {type(current).__name__} (the config's "
      f"{current!r}), got one of type {type(value).__name__}"
    ) from err


def get_dotted(tree: Any, key: str, default: Any = None) -> Any:
  """`tree[a][b]...[leaf]` for `key` = "a.b...leaf"; `default` where a level is missing, None or not a mapping."""
  node = tree
  for part in key.split("."):
    if not hasattr(node, "keys") or part not in node or node[part] is None:
      return default
    node = node[part]
  return node
