"""What a checkpoint directory holds, and the checks every reader of it shares.

Layout: `<directory>/<step>/state` holds the state pytree (orbax `StandardSave`, OCDBT; every
process writes its own shards) and `<directory>/<step>/info` a small JSON record: the step, the
metrics passed to `save`, and a fingerprint of the state (every leaf's path, shape and dtype).
A run's workdir keeps its directory in `<workdir>/checkpoints`.

Why the fingerprint: orbax restores whatever arrays it finds, so a checkpoint of a different model
config either fails deep inside TensorStore or, worse, restores with silently different shapes.
Comparing fingerprints before any array is read turns that into a `CheckpointError` naming the
leaves that differ.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

WORKDIR_SUBDIR = "checkpoints"  # where the train loop keeps a run's Checkpointer directory
STATE_ITEM = "state"
INFO_ITEM = "info"
FORMAT_VERSION = 1
_MAX_REPORTED = 5


class CheckpointError(ValueError):
  """A checkpoint that cannot be used: absent, unreadable, damaged, or not matching the target state.

  `step` is the step at fault when one is (None otherwise), `previous_good` the latest earlier step found
  to verify, if it was looked for: a train loop offers to continue from it.
  """

  def __init__(self, message: str, *, step: int | None = None, previous_good: int | None = None):
    super().__init__(message)
    self.step, self.previous_good = step, previous_good


def check_fingerprint(saved: dict, expected: dict, where: str) -> None:
  """A CheckpointError naming the first differing leaves (saved vs expected), if any."""
  diffs = fingerprint_differences(saved, expected)
  if diffs:
    shown = "\n  ".join(diffs[:_MAX_REPORTED])
    more = f"\n  ... and {len(diffs) - _MAX_REPORTED} more" if len(diffs) > _MAX_REPORTED else ""
    raise CheckpointError(
      f"checkpoint {where} does not match the target state ({len(diffs)} differing leaves; written with a "
      f"different model or optimizer config?):\n  {shown}{more}"
    )


def first_line(err: BaseException) -> str:
  """`Type: first line` of an exception (orbax and TensorStore errors run to pages)."""
  text = str(err).strip().splitlines()
  return f"{type(err).__name__}: {text[0][:300] if text else ''}"


def path_str(path) -> str:
  return jax.tree_util.keystr(path, simple=True, separator="/")


def _leaf_spec(leaf) -> tuple[list[int], str]:
  shape = leaf.shape if hasattr(leaf, "shape") else np.shape(leaf)
  dtype = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
  return [int(d) for d in shape], str(dtype)


def state_fingerprint(tree) -> dict:
  """Leaf paths ('params/Dense_0/kernel'), shapes and dtypes of a state or abstract state, in tree order.

  Typed PRNG keys keep their key dtype (e.g. 'key<fry>'), so a raw-uint32 key and a typed key differ.
  """
  leaves = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    shape, dtype = _leaf_spec(leaf)
    leaves.append({"path": path_str(path), "shape": shape, "dtype": dtype})
  digest = hashlib.sha256(json.dumps(leaves, sort_keys=True).encode()).hexdigest()[:16]
  return {"num_leaves": len(leaves), "digest": digest, "leaves": leaves}


def _describe(leaf: dict) -> str:
  return f"shape {tuple(leaf['shape'])} {leaf['dtype']}"


def fingerprint_differences(saved: dict, expected: dict) -> list[str]:
  """One line per differing leaf, target order first, then leaves only the checkpoint has."""
  saved_by_path = {leaf["path"]: leaf for leaf in saved["leaves"]}
  expected_paths = {leaf["path"] for leaf in expected["leaves"]}
  lines = []
  for leaf in expected["leaves"]:
    old = saved_by_path.get(leaf["path"])
    if old is None:
      lines.append(f"{leaf['path']}: not in the checkpoint (expected {_describe(leaf)})")
    elif (list(old["shape"]), old["dtype"]) != (leaf["shape"], leaf["dtype"]):
      lines.append(f"{leaf['path']}: saved {_describe(old)}, expected {_describe(leaf)}")
  for leaf in saved["leaves"]:
    if leaf["path"] not in expected_paths:
      lines.append(f"{leaf['path']}: in the checkpoint ({_describe(leaf)}) but not in the target state")
  return lines


def valid_fingerprint(fp) -> bool:
  """Whether `fp` (read from a checkpoint's JSON record) has the structure `state_fingerprint` writes."""
  if not isinstance(fp, Mapping) or not isinstance(fp.get("leaves"), list):
    return False
  return all(isinstance(x, Mapping) and {"path", "shape", "dtype"} <= set(x) for x in fp["leaves"])


def require_shardings(abstract_state, what: str) -> None:
  """A ValueError naming the first leaf without a sharding (restores place every array directly)."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_state)[0]:
    if getattr(leaf, "sharding", None) is None:
      raise ValueError(
        f"{what} leaf {path_str(path)!r} has no sharding; expected jax.ShapeDtypeStruct(shape, dtype, "
        f"sharding=...) (or a jax.Array), so that arrays are restored directly onto the target devices"
      )


def absolute_path(path) -> epath.Path:
  """`path` as an absolute epath: orbax refuses relative paths on restore (saving works), so a run started
  with `--workdir=runs/x` could save but never resume. URLs such as gs://... are already absolute."""
  path = epath.Path(path)
  return path if path.is_absolute() or "://" in str(path) else epath.Path(os.path.abspath(path))


def metrics_to_floats(metrics: Mapping[str, Any] | None) -> dict[str, float]:
  """The metrics an info record holds: one float per scalar (a ValueError names a non-scalar)."""
  out = {}
  for name, value in (metrics or {}).items():
    if np.size(value) != 1:
      raise ValueError(f"metric {name!r} must be a scalar, got shape {np.shape(value)}")
    out[str(name)] = float(np.asarray(value).reshape(()))
  return out


def handler_registry() -> ocp.handlers.DefaultCheckpointHandlerRegistry:
  """The handlers of a step's two items: the state (`StandardSave`/`Restore`) and the info record (JSON)."""
  registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
  state_handler = ocp.StandardCheckpointHandler()
  info_handler = ocp.JsonCheckpointHandler()
  registry.add(STATE_ITEM, ocp.args.StandardSave, state_handler)
  registry.add(STATE_ITEM, ocp.args.StandardRestore, state_handler)
  registry.add(INFO_ITEM, ocp.args.JsonSave, info_handler)
  registry.add(INFO_ITEM, ocp.args.JsonRestore, info_handler)
  return registry


class PinnedSteps(ocp.checkpoint_managers.PreservationPolicy):
  """Preserves the steps a callable names (the best and the corrupt ones); combined with LatestN."""

  def __init__(self, pinned: Callable[[], set[int]]):
    self._pinned = pinned

  def should_preserve(self, checkpoints, *, context) -> list[bool]:
    pinned = self._pinned()
    return [info.step in pinned for info in checkpoints]
