"""Linen variable trees <-> NNX Variables, keeping the names and the logical partitioning.

A Linen collection is a nested dict of arrays (parameters boxed in `nn.LogicallyPartitioned` carry
their logical axis names). The NNX layers hold the same tree as `nnx.Dict`s of `nnx.Variable`s, so a
path in `nnx.state(layer)` is the path of the Linen tree (`query/kernel`, `We`, `combine/bias`, ...)
and a logical name sits in the Variable's `out_sharding` metadata, where `nnx.get_partition_spec` and
`nn.logical_axis_rules` read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
from flax import linen as nn
from flax import nnx
from flax.core import meta


def box_metadata(box: Any) -> dict[str, Any]:
  """The NNX metadata of a Linen box: its logical names as `out_sharding` (plus its rules and mesh)."""
  if isinstance(box, nn.LogicallyPartitioned):
    found = {"out_sharding": tuple(box.names), "sharding_rules": box.rules, "mesh": box.mesh}
  elif isinstance(box, nn.Partitioned):
    found = {"out_sharding": tuple(box.names), "mesh": box.mesh}
  else:
    return {}
  # Logical names are not mesh axes: the user maps them (nn.logical_axis_rules), never at creation.
  return {**{k: v for k, v in found.items() if v is not None}, "eager_sharding": False}


def to_variables(tree: Mapping[str, Any], var_type: type[nnx.Variable], overrides=None) -> nnx.Dict:
  """A Linen collection as an `nnx.Dict` of `var_type` Variables (boxes unboxed, their names kept).

  `overrides(path, metadata) -> metadata` may change the metadata of the Variable at `path`.
  """

  def convert(path, value):
    if isinstance(value, Mapping):
      return nnx.Dict({key: convert((*path, key), sub) for key, sub in value.items()})
    metadata = box_metadata(value)
    if overrides is not None:
      metadata = overrides(path, metadata)
    raw = value.unbox(apply_constraint=False) if isinstance(value, meta.AxisMetadata) else value
    return var_type(raw, **metadata)

  return convert((), tree)


def to_tree(node: Any) -> Any:
  """The plain nested dict of values held by an `nnx.Dict` of Variables (what a Linen `apply` takes)."""
  if isinstance(node, nnx.Variable):
    return node.get_value()
  return {key: to_tree(sub) for key, sub in _items(node)}


def _items(node):
  """The entries of an nnx.Dict (or dict), without what NNX transforms attach (`__captures__`)."""
  return [(key, sub) for key, sub in node.items() if not (isinstance(key, str) and key.startswith("__"))]


def assign(node: nnx.Dict, tree: Mapping[str, Any], where: str) -> None:
  """Writes the values of `tree` into the Variables of `node` in place (same paths, shapes and dtypes).

  Raises ValueError naming the first path that is missing, extra or of another shape.
  """
  ours, theirs = _flat(node), _flat(tree)
  if set(ours) != set(theirs):
    missing, extra = sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours))
    raise ValueError(f"{where}: the trees differ; missing {missing[:3]}, unexpected {extra[:3]}")
  for path, variable in ours.items():
    value = theirs[path]
    value = value.unbox(apply_constraint=False) if isinstance(value, meta.AxisMetadata) else value
    if jax.numpy.shape(value) != jax.numpy.shape(variable.get_value()):
      raise ValueError(
        f"{where}: {'/'.join(path)} has shape {jax.numpy.shape(value)}, the layer's is {variable.get_value().shape}"
      )
    variable.set_value(jax.numpy.asarray(value, variable.get_value().dtype))


def _flat(node, prefix=()) -> dict[tuple[str, ...], Any]:
  if isinstance(node, nnx.Variable) or not isinstance(node, Mapping | nnx.Dict):
    return {prefix: node}
  out = {}
  for key, sub in _items(node):
    out.update(_flat(sub, (*prefix, key)))
  return out


def flat_sown(tree, prefix=()):
  """(path, tuple of sown values) of a Linen `intermediates` collection."""
  for key, value in tree.items():
    if isinstance(value, Mapping):
      yield from flat_sown(value, (*prefix, key))
    else:
      yield (*prefix, key), value
