"""A run's config across resumes: `config.json` is written once, and a resume is checked against it.

Why: a run resumed with another learning rate, batch size, seed or model is no longer the run its
`config.json`, metrics and checkpoints describe, yet it used to be accepted silently (and a different
model rewrote `config.json` before the checkpoint mismatch was found, losing the run's record). Now the
config of a run that already exists in the workdir is compared with the run's own before anything is
written, and a change that breaks the run's continuity is refused with the changed keys, unless the
caller accepts those keys (`config.accept_config_changes`).

What may change on resume without asking (`FREE_ON_RESUME`): how often the run logs, evaluates and
checkpoints, how many checkpoints it keeps, the eval batch size, where the data is read from, the
device mesh and the distributed setting: none of them changes the trained state (the mesh changes the
reduction order only, within float rounding). `total_steps` and `num_epochs` may grow or shrink only
with `optimizer.schedule="constant"`, the one schedule that does not depend on the run's length. Every
other key (model, data, optimizer, ksvd, seed, task, protocol, init_from, and keys added or removed)
breaks continuity. `RUN_CONTROL` keys steer one invocation and are not part of the run's config
(`add_run_controls` gives every config loaded by name or path those fields, so `--config.resume_step=4`
works on the command line).

Records: `config.json` stays as the run was started. Every difference a resume brings (free or
accepted) is appended to `config_changes.json` as {"step", "time", "changes": {key: {"old", "new"}},
"accepted": [keys that needed accepting]}; the run's current config is `config.json` with those
changes applied in order (`run_config`), which is what the next resume is compared with. A fall-back
(`resume_step`) is recorded there too, with the steps it set aside, so that the same `resume_step` left
in a rerun command cannot fall back a second time (`check_fallback`).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from primal_jax.atomic_files import read_json, write_json_atomically
from primal_jax.errors import ConfigError
from primal_jax.training.metrics import CONFIG_FILE, config_record

CHANGES_FILE = "config_changes.json"
FREE_ON_RESUME = (
  "log_every_steps",
  "eval_every_steps",
  "eval_every_epochs",
  "checkpoint_every_steps",
  "checkpoint_on_eval",
  "max_to_keep",
  "data.eval_batch_size",
  "data.data_dir",
  "mesh_shape",
  "distributed",
  "init_from_min_loaded",  # read only when a run starts (warm_start.check_loaded); added after runs were made
)
LENGTH_KEYS = ("total_steps", "num_epochs")  # free only with a constant learning-rate schedule
# Fields that steer one invocation, with their defaults; never compared. `resume_step`: -1 resumes from the
# latest checkpoint, N >= 0 from step N (the steps after it are set aside). `accept_config_changes`: dotted keys
# ("optimizer.learning_rate,data.batch_size"; "optimizer" covers every optimizer.* key) whose changes to break.
RUN_CONTROL = {"resume_step": -1, "accept_config_changes": ""}
_MISSING = "<absent>"


class ConfigContinuityError(ConfigError):
  """A resume whose config breaks the continuity of the run in the workdir; the message lists the keys."""


def add_run_controls(config) -> None:
  """Adds the `RUN_CONTROL` fields a config lacks, so `--config.resume_step=N` works with any config file."""
  with config.unlocked():
    for key, default in RUN_CONTROL.items():
      if key not in config:
        config[key] = default


def flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
  """{"optimizer.learning_rate": 1e-3, ...}: nested mappings as dotted keys, other values (lists) as leaves."""
  out = {}
  for key, value in tree.items():
    name = f"{prefix}{key}"
    if isinstance(value, Mapping) and value:
      out.update(flatten(value, f"{name}."))
    else:
      out[name] = value
  return out


def unflatten(flat: Mapping[str, Any]) -> dict:
  """The nested dict of `flatten`'s dotted keys."""
  out: dict = {}
  for key, value in flat.items():
    *parents, leaf = key.split(".")
    node = out
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return out


def _read(workdir: Path, name: str, what: str, remedy: str) -> Any:
  return read_json(workdir / name, what, remedy=remedy)


def run_config(workdir: str | Path) -> dict | None:
  """The run's current config as a flat dict (`config.json` plus `config_changes.json`), None without one."""
  workdir = Path(workdir)
  if not (workdir / CONFIG_FILE).is_file():
    return None
  remedy = "Restore it from a copy of the run; without it the run cannot be checked or resumed safely."
  flat = flatten(_read(workdir, CONFIG_FILE, "the config the run was started with", remedy))
  for entry in _changes(workdir):
    for key, change in entry["changes"].items():
      if change["new"] == _MISSING:
        flat.pop(key, None)
      else:
        flat[key] = change["new"]
  return flat


def _changes(workdir: Path) -> list[dict]:
  if not (workdir / CHANGES_FILE).is_file():
    return []
  remedy = "Restore it from a copy of the run (it records the config changes accepted on resume)."
  entries = _read(workdir, CHANGES_FILE, "the config changes of earlier resumes", remedy)
  if not isinstance(entries, list) or not all(isinstance(e, dict) and "changes" in e for e in entries):
    raise ValueError(f"{workdir / CHANGES_FILE} is not a list of {{'step', 'changes', ...}} records")
  return entries


def differences(saved: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, dict]:
  """{key: {"old", "new"}} for every key whose value differs (`_MISSING` for a key on one side only)."""
  keys = sorted((set(saved) | set(new)) - set(RUN_CONTROL))
  return {
    k: {"old": saved.get(k, _MISSING), "new": new.get(k, _MISSING)}
    for k in keys
    if saved.get(k, _MISSING) != new.get(k, _MISSING)
  }


def _free(key: str, saved: Mapping[str, Any]) -> bool:
  return key in FREE_ON_RESUME or (key in LENGTH_KEYS and saved.get("optimizer.schedule") == "constant")


def _accepted(key: str, accept: Iterable[str]) -> bool:
  return any(key == a or key.startswith(f"{a}.") for a in accept)


def parse_accept(value) -> list[str]:
  """`accept_config_changes` ("optimizer.learning_rate,data.batch_size", or a list) as a list of keys."""
  items = value.split(",") if isinstance(value, str) else list(value or ())
  return [item.strip() for item in items if item.strip()]


def _show(value) -> str:
  text = repr(value) if value != _MISSING else "absent"
  return text if len(text) <= 60 else text[:57] + "..."


def check_resume(config, workdir: str | Path) -> dict:
  """The differences between `config` and the run already in `workdir`, if they keep its continuity.

  Reads only; call it before anything is written to the workdir. Returns {"changes": {key: {"old",
  "new"}}, "accepted": [keys that needed accepting]} for `record_changes` (no changes for a new workdir
  or the same config). Raises ConfigContinuityError listing every changed key that breaks continuity and is not
  in `config.accept_config_changes`, and DamagedFileError (naming the file) for a damaged record.
  """
  saved = run_config(workdir)
  if saved is None:
    return {"changes": {}, "accepted": []}
  diff = differences(saved, flatten(config_record(config)))
  accept = parse_accept(config.get("accept_config_changes", ""))
  refused = [k for k in diff if not _free(k, saved) and not _accepted(k, accept)]
  if refused:
    listed = ", ".join(f"{k} {_show(diff[k]['old'])} -> {_show(diff[k]['new'])}" for k in refused)
    raise ConfigContinuityError(
      f"workdir {workdir} holds a run whose config differs in keys that break its continuity: {listed}. Resume "
      f"with the run's own config ({Path(workdir) / CONFIG_FILE}), choose another workdir, or accept the changes "
      f"(recorded in {CHANGES_FILE}) with --config.accept_config_changes={','.join(refused)}"
    )
  return {"changes": diff, "accepted": [k for k in diff if not _free(k, saved)]}


def check_fallback(workdir: str | Path, resume_step: int, latest: int | None) -> None:
  """Refuses a `resume_step` already applied once the run has saved later steps since.

  Why: schedulers and sweep runners rerun the same command after a preemption. A `--config.resume_step=4`
  left in that command would fall back to step 4 at every rerun, setting the new progress aside each time.
  """
  if resume_step < 0 or latest is None or resume_step >= latest:
    return
  for entry in _changes(Path(workdir)):
    if entry.get("resumed_from") == resume_step:
      raise ConfigError(
        f"resume_step={resume_step} was applied already ({entry['time']}, {CHANGES_FILE}) and the run has saved "
        f"step {latest} since: rerun without --config.resume_step to continue from step {latest}, or move the steps "
        f"after {resume_step} out of the checkpoint directory yourself to fall back to it again"
      )


def record_changes(workdir: str | Path, step: int, resume: Mapping, set_aside: Iterable[int] = ()) -> None:
  """Appends `check_resume`'s record, at `step`, to `config_changes.json` (atomically), with the steps set
  aside by a `resume_step` fall-back (then `resumed_from` is `step`); nothing if there is neither."""
  set_aside = sorted(int(s) for s in set_aside)
  if not resume["changes"] and not set_aside:
    return
  workdir = Path(workdir)
  now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
  fallback = {"resumed_from": int(step), "set_aside": set_aside} if set_aside else {}
  entries = [*_changes(workdir), {"step": int(step), "time": now, **resume, **fallback}]
  write_json_atomically(workdir / CHANGES_FILE, entries, indent=1)
