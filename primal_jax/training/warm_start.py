"""`restore_params`: the params of another run's checkpoint, to start a new run from (`config.init_from`).

Only the `params` subtree is read (orbax partial restore); the optimizer, step and RNG of the new run
start fresh. Nothing under the other run's directory is written or deleted.
"""

from __future__ import annotations

import logging
from typing import Any

import orbax.checkpoint as ocp

from primal_jax.training.checkpoint_format import (
  INFO_ITEM,
  STATE_ITEM,
  WORKDIR_SUBDIR,
  CheckpointError,
  absolute_path,
  check_fingerprint,
  first_line,
  require_shardings,
  state_fingerprint,
  valid_fingerprint,
)

log = logging.getLogger(__name__)


def _params_registry() -> ocp.handlers.DefaultCheckpointHandlerRegistry:
  registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
  registry.add(STATE_ITEM, ocp.args.PyTreeRestore, ocp.PyTreeCheckpointHandler())  # PyTree: supports partial_restore
  registry.add(INFO_ITEM, ocp.args.JsonRestore, ocp.JsonCheckpointHandler())
  return registry


def restore_params(path, abstract_params, *, step: int | None = None) -> Any:
  """Loads only the `params` subtree of another run's checkpoint (for `config.init_from`).

  Args:
    path: a `Checkpointer` directory (then `step`, default its latest step), a run's workdir (its
      `checkpoints` subdirectory is used) or one step's directory `<directory>/<step>`. Nothing under it
      is written or deleted.
    abstract_params: target pytree of `jax.ShapeDtypeStruct` with `.sharding` (or arrays).

  Returns:
    the params, with the structure and shardings of `abstract_params` (the step used is logged).

  Raises:
    CheckpointError: no checkpoint there, no `params` subtree, a params fingerprint that differs from
      `abstract_params` (naming the leaves), or an unreadable checkpoint.
  """
  require_shardings(abstract_params, "abstract_params")
  path = absolute_path(path)
  root = path
  if (path / WORKDIR_SUBDIR).is_dir() and not any(child.name.isdigit() for child in path.iterdir()):
    root = path / WORKDIR_SUBDIR  # a run's workdir: its Checkpointer directory
  if path.name.isdigit() and (path / STATE_ITEM).is_dir():
    if step is not None and int(step) != int(path.name):
      raise ValueError(f"step={step} contradicts the step directory {path}")
    root, step = path.parent, int(path.name)
  if not root.is_dir():
    raise CheckpointError(f"{path} is not a directory; expected a checkpoint directory or <directory>/<step>")
  options = ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0)
  manager = ocp.CheckpointManager(root, options=options, handler_registry=_params_registry())
  try:
    steps = sorted(manager.all_steps())
    if step is None and steps:
      step = steps[-1]
    if step is None or int(step) not in steps:
      raise CheckpointError(f"no checkpoint for step {step} in {root}; available steps: {steps}")
    step = int(step)
    where = f"{root / str(step)}"
    unreadable = f"checkpoint {where} is unreadable (corrupt or incomplete); nothing was deleted. Cause"
    try:
      info = manager.restore(step, args=ocp.args.Composite(**{INFO_ITEM: ocp.args.JsonRestore()}))[INFO_ITEM]
    except Exception as err:
      raise CheckpointError(f"{unreadable}: reading the {INFO_ITEM} record failed: {first_line(err)}") from err
    if not isinstance(info, dict) or not valid_fingerprint(info.get("fingerprint")):
      raise CheckpointError(f"{unreadable}: the {INFO_ITEM} record has no valid fingerprint")
    leaves = info["fingerprint"]["leaves"]
    saved = {"leaves": [dict(x, path=x["path"][len("params/") :]) for x in leaves if x["path"].startswith("params/")]}
    if not saved["leaves"]:
      tops = sorted({x["path"].split("/")[0] for x in leaves})
      raise CheckpointError(f"checkpoint {where} has no 'params' subtree; its top-level entries are {tops}")
    check_fingerprint(saved, state_fingerprint(abstract_params), f"{where} (params subtree)")
    target = {"params": abstract_params}
    args = ocp.args.PyTreeRestore(
      item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True
    )
    try:
      params = manager.restore(step, args=ocp.args.Composite(**{STATE_ITEM: args}))[STATE_ITEM]["params"]
    except Exception as err:
      raise CheckpointError(f"{unreadable}: reading the params arrays failed: {first_line(err)}") from err
  finally:
    manager.close()
  log.info("restored params from %s (metrics %s)", where, info.get("metrics"))
  return params
