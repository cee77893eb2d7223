"""The params of another run's (or a converted) checkpoint, to start a new run from (`config.init_from`).

`restore_params`: the saved params must be exactly the target's (every leaf's path, shape and dtype).
`restore_matching_params`: fine-tuning a different model from pretrained weights (DeiT-S into Primal.+DeiT,
another class count or image size): leaves present in both with the same shape are loaded, the target's
new leaves keep their initialisation, as the release's `load_state_dict(..., strict=False)` does.
Only the `params` subtree is read (orbax partial restore); the optimizer, step and RNG of the new run
start fresh. Nothing under the other run's directory is written or deleted.

A run's `init_from` settings are checked before anything is built (`check_init_from`: the path exists, the
mode is known, the fraction is one), and a "matching" start that loads too little of the model
(`check_loaded`: nothing at all, or less than `init_from_min_loaded` of its parameters) is an error naming
both models, instead of a fine-tuning run that silently trains from scratch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from primal_jax.errors import ConfigError, MissingFileError
from primal_jax.training.checkpointing.checksums import describe_problems, verify_step_dir
from primal_jax.training.checkpointing.format import (
  INFO_ITEM,
  STATE_ITEM,
  WORKDIR_SUBDIR,
  CheckpointError,
  absolute_path,
  check_fingerprint,
  first_line,
  path_str,
  require_shardings,
  state_fingerprint,
  valid_fingerprint,
)

log = logging.getLogger(__name__)

# `config.init_from_mode`: "exact" (the saved params are the model's, leaf for leaf) or "matching" (fine-tuning
# another model: leaves of the same path and shape loaded, the rest initialised; `restore_matching_params`).
INIT_FROM_MODES = ("exact", "matching")
# `config.init_from_min_loaded`: the least share of the model's parameters (elements) a "matching" start must
# load or adapt. DeiT-S into Primal.+DeiT (S/16, 100 classes) loads over 95% (the Primal layer's own projections,
# its fresh query and key and the head are not).
DEFAULT_MIN_LOADED = 0.5


class InitFromError(CheckpointError, ConfigError):
  """`config.init_from` names a checkpoint this run cannot start from (one line for the CLI)."""


def check_init_from(config, *, starting: bool = True) -> None:
  """Refuses, before any data or model is built, an unknown `init_from_mode`, an `init_from_min_loaded` outside
  [0, 1] and, for a run `starting` (not resuming from its own checkpoints), an `init_from` that does not exist
  (a ConfigError naming the setting)."""
  mode = config.get("init_from_mode", "exact")
  if mode not in INIT_FROM_MODES:
    raise ConfigError(f"init_from_mode must be one of {', '.join(INIT_FROM_MODES)}, got {mode!r}")
  fraction = config.get("init_from_min_loaded", DEFAULT_MIN_LOADED)
  if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0.0 <= fraction <= 1.0:
    raise ConfigError(f"init_from_min_loaded must be a fraction in [0, 1], got {fraction!r}")
  path = config.get("init_from") or ""
  if starting and path and not Path(path).expanduser().exists():
    raise MissingFileError(
      f"init_from: {path} does not exist; name a run's workdir, its checkpoints/ directory or one step of it "
      "(<directory>/<step>), or a converted checkpoint (python -m primal_jax.convert timm)"
    )


def describe_checkpoint(path) -> str:
  """The model a checkpoint holds, for messages: its run's config.json (the checkpoint may be the workdir, its
  checkpoints/ directory or one step of it) or a converted model's description, else 'unknown model'."""
  from primal_jax.models.config import stack_name

  path = Path(path).expanduser().resolve()
  folders = [path, path.parent]  # the step folder or checkpoints/ or the workdir, and the folders above it
  folders.append(folders[-1].parent)
  for folder in folders:
    config_file, described = folder / "config.json", folder / "vit_model.json"
    try:
      if config_file.is_file():
        model = json.loads(config_file.read_text())["model"]
        return (
          f"{model.get('name', '?')} {stack_name(model.get('layers', ()))}, dim {model.get('dim', '?')} ({config_file})"
        )
      if described.is_file():
        return f"converted {json.loads(described.read_text())} ({described})"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
      return f"unknown model ({config_file} unreadable)"
  return "a model without a config.json beside it"


def check_loaded(
  report: Mapping[str, Sequence[str]], init_params, *, min_loaded: float, source: str, target: str
) -> None:
  """Refuses a "matching" start (`restore_matching_params`' report) that loaded or adapted no leaf, or less than
  `min_loaded` of the model's parameters: `source` (the checkpoint's model) is then another model than `target`."""
  sizes = {path_str(p): math.prod(leaf.shape) for p, leaf in jax.tree_util.tree_flatten_with_path(init_params)[0]}
  used = [p for kind in ("loaded", "adapted") for p in report.get(kind, ())]
  share = sum(sizes[p] for p in used) / max(sum(sizes.values()), 1)
  if used and share >= min_loaded:
    return
  unused = report.get("unused", ())
  tops = ", ".join(sorted({f"{p.split('/')[0]}/" for p in unused})) or "-"
  raise InitFromError(
    f"init_from (init_from_mode='matching') loaded {len(used)} of the model's {len(sizes)} leaves ({share:.0%} of "
    f"its parameters; init_from_min_loaded={min_loaded:g}, none at all is always refused): the checkpoint holds "
    f"another model ({source}; {len(unused)} of its leaves match nothing here, under {tops}) than this run's "
    f"({target}). Name a checkpoint of this model, or lower init_from_min_loaded to fine-tune from what matches"
  )


def _params_registry() -> ocp.handlers.DefaultCheckpointHandlerRegistry:
  registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
  registry.add(STATE_ITEM, ocp.args.PyTreeRestore, ocp.PyTreeCheckpointHandler())  # PyTree: supports partial_restore
  registry.add(INFO_ITEM, ocp.args.JsonRestore, ocp.JsonCheckpointHandler())
  return registry


@dataclasses.dataclass
class _SavedParams:
  """One step of a checkpoint directory, opened read-only: its `params` leaves and a reader for them."""

  manager: ocp.CheckpointManager
  step: int
  where: str
  info: dict
  leaves: list[dict]  # {"path" (below params/), "shape", "dtype"} in saved order

  def read(self, target: dict) -> dict:
    """The saved params for `target` (a subtree of them: ShapeDtypeStructs with shardings, same paths)."""
    target = {"params": target}
    args = ocp.args.PyTreeRestore(
      item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True
    )
    try:
      return self.manager.restore(self.step, args=ocp.args.Composite(**{STATE_ITEM: args}))[STATE_ITEM]["params"]
    except Exception as err:
      raise CheckpointError(
        f"checkpoint {self.where} is unreadable (corrupt or incomplete); nothing was deleted. Cause: reading the "
        f"params arrays failed: {first_line(err)}"
      ) from err


@contextlib.contextmanager
def _open_params(path, step: int | None):
  """The `_SavedParams` of `path` (a Checkpointer directory, a run's workdir or `<directory>/<step>`)."""
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
    if problems := verify_step_dir(root / str(step)):  # another run's bytes are checked as our own are
      raise CheckpointError(
        f"checkpoint {where} is damaged: its files differ from the checksums recorded when it was saved: "
        f"{describe_problems(problems)}. Nothing was deleted; name another step of it (step=...)",
        step=step,
      )
    leaves = info["fingerprint"]["leaves"]
    saved = [dict(x, path=x["path"][len("params/") :]) for x in leaves if x["path"].startswith("params/")]
    if not saved:
      tops = sorted({x["path"].split("/")[0] for x in leaves})
      raise CheckpointError(f"checkpoint {where} has no 'params' subtree; its top-level entries are {tops}")
    yield _SavedParams(manager, step, where, info, saved)
  finally:
    manager.close()


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
      `abstract_params` (naming the leaves), files that differ from their recorded checksums (naming
      them), or an unreadable checkpoint.
  """
  require_shardings(abstract_params, "abstract_params")
  with _open_params(path, step) as saved:
    check_fingerprint({"leaves": saved.leaves}, state_fingerprint(abstract_params), f"{saved.where} (params subtree)")
    params = saved.read(abstract_params)
  log.info("restored params from %s (metrics %s)", saved.where, saved.info.get("metrics"))
  return params


# adapt(path, saved array, target shape) -> an array of the target shape, or None to keep the target's init.
Adapter = Callable[[str, np.ndarray, tuple[int, ...]], "np.ndarray | None"]


def _nested(flat: dict[str, Any]) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    *parents, leaf = path.split("/")
    node = tree
    for key in parents:
      node = node.setdefault(key, {})
    node[leaf] = value
  return tree


def _replicated(sharding):
  """A sharding on the same devices holding the whole array (for a saved leaf of another shape)."""
  if isinstance(sharding, jax.sharding.NamedSharding):
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
  return sharding


def restore_matching_params(
  path,
  init_params,
  *,
  step: int | None = None,
  reinit: Sequence[str] = ("head",),
  adapt: Adapter | None = None,
  keep_init: Callable[[str], bool] | None = None,
) -> tuple[Any, dict[str, list[str]]]:
  """Pretrained params into a model that differs from the saved one (fine-tuning; module doc).

  Per leaf of `init_params` (by path): saved with the same shape and dtype -> loaded; not saved -> the
  init kept ("new": e.g. a swapped-in Primal layer's We, Wr, Lambda, query, key, combine); saved with
  another shape -> `adapt(path, saved, shape)` if it returns an array ("adapted": e.g. a position
  embedding resized to another image size), else the init kept if the path starts with one of `reinit`
  ("reinitialised": the release drops a head of another class count), else a CheckpointError. Saved
  leaves the target lacks ("unused": a softmax layer's value projection) are not read. Paths for which
  `keep_init(path)` is True keep the init even when saved alike ("kept": the release's swapped-in Primal
  layer draws its query and key afresh, since its fused `qk` matches no pretrained key).

  Args:
    init_params: the new model's initialised params (arrays with shardings).
  Returns:
    (params with the structure and shardings of `init_params`, report {"loaded", "new", "kept", "adapted",
    "reinitialised", "unused"}: lists of leaf paths).
  """
  require_shardings(init_params, "init_params")
  flat = {path_str(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(init_params)[0]}
  kinds = ("loaded", "new", "kept", "adapted", "reinitialised", "unused")
  report: dict[str, list[str]] = {k: [] for k in kinds}
  with _open_params(path, step) as saved:
    by_path = {leaf["path"]: leaf for leaf in saved.leaves}
    report["unused"] = [p for p in by_path if p not in flat]
    same, other = {}, {}
    for p, leaf in flat.items():
      old = by_path.get(p)
      if old is None:
        report["new"].append(p)
      elif keep_init is not None and keep_init(p):
        report["kept"].append(p)
      elif (tuple(old["shape"]), old["dtype"]) == (tuple(leaf.shape), str(leaf.dtype)):
        same[p] = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
      else:
        other[p] = jax.ShapeDtypeStruct(tuple(old["shape"]), old["dtype"], sharding=_replicated(leaf.sharding))
    loaded = {}
    if same or other:
      read = saved.read(_nested({**same, **other}))
      loaded = {path_str(p): v for p, v in jax.tree_util.tree_flatten_with_path(read)[0]}
  out = dict(flat)
  for p in same:
    out[p] = loaded[p]
    report["loaded"].append(p)
  for p, spec in other.items():
    target = flat[p]
    value = adapt(p, np.asarray(loaded[p]), tuple(target.shape)) if adapt is not None else None
    if value is not None:
      if tuple(np.shape(value)) != tuple(target.shape):
        raise CheckpointError(f"adapt returned shape {np.shape(value)} for {p}, expected {tuple(target.shape)}")
      out[p] = jax.device_put(np.asarray(value, target.dtype), target.sharding)
      report["adapted"].append(p)
    elif any(p == r or p.startswith(r + "/") for r in reinit):
      report["reinitialised"].append(p)
    else:
      raise CheckpointError(
        f"checkpoint {saved.where}: {p} has shape {spec.shape} {spec.dtype} but the model's is "
        f"{tuple(target.shape)} {target.dtype}, and it is neither adapted nor in reinit={tuple(reinit)}"
      )
  log.info("params from %s: %s", saved.where, {k: len(v) for k, v in report.items()})
  params = jax.tree_util.tree_unflatten(jax.tree.structure(init_params), [out[p] for p in flat])
  return params, report


def warm_start_state(
  config,
  state,
  abstract_params,
  *,
  adapt: Adapter | None = None,
  keep_init: Callable[[str], bool] | None = None,
  target: str = "this run's model",
) -> tuple[Any, str]:
  """A run that starts (no checkpoint of its own): `state` (freshly initialised) with `config.init_from`'s params,
  and where they came from (the resume order's steps 2 and 3, `primal_jax.training.loop`); `abstract_params` is the
  target of an "exact" restore (ShapeDtypeStructs with shardings).

  "exact" (`init_from_mode`) restores the saved params leaf for leaf; "matching" fine-tunes from them
  (`restore_matching_params` with the model's `adapt` and `keep_init`, then `check_loaded` against `target`).
  """
  check_init_from(config)
  if not config.get("init_from"):
    return state, "initialised from scratch"
  if config.get("init_from_mode", "exact") == "exact":
    params = restore_params(config.init_from, abstract_params)
    return state.replace(params=params), f"params initialised from {config.init_from}"
  params, report = restore_matching_params(config.init_from, state.params, adapt=adapt, keep_init=keep_init)
  check_loaded(
    report,
    state.params,
    min_loaded=config.get("init_from_min_loaded", DEFAULT_MIN_LOADED),
    source=describe_checkpoint(config.init_from),
    target=target,
  )
  counts = ", ".join(f"{len(paths)} {what}" for what, paths in report.items() if paths)
  return state.replace(params=params), f"params initialised from {config.init_from} where they match ({counts})"
