"""Orbax checkpoints of the train state, checked against the target state before any array is read.

Layout and fingerprints: `format`. A checkpoint whose fingerprint differs from the target
state's is a `CheckpointError` naming the leaves, raised before any array is read. Every step also
carries the SHA-256 of each of its files (`checksums`), checked by `restore` before any
array is read: altered bytes are a `CheckpointError` naming the step and the file, and offering the
latest earlier step whose checksums verify.

Atomicity is orbax's: a step is written into `<step>.orbax-checkpoint-tmp` and renamed to `<step>`
only after every item is committed (`AtomicRenameTemporaryPath`, orbax's default on local and
POSIX filesystems; on `gs://` it marks completion with `commit_success.txt` instead). A save cut
short by a crash or preemption leaves only the tmp directory, which is never listed as a step and
is replaced when that step is saved again. Saving is asynchronous by default: `save` returns once
the arrays are copied to host memory; `wait_until_finished()` / `close()` wait for the write.

Corrupt checkpoints are never deleted by this module, because deleting evidence of a broken disk
or a half-copied run is the user's call. See `Checkpointer` for how they escape garbage collection.
"""

from __future__ import annotations

import datetime
import logging
import math
from collections.abc import Mapping
from typing import Any

import orbax.checkpoint as ocp
from etils import epath

from primal_jax.training.checkpointing.checksums import (
  NO_MANIFEST,
  describe_problems,
  set_aside,
  verify_step_dir,
  write_manifest,
)
from primal_jax.training.checkpointing.format import (
  FORMAT_VERSION,
  INFO_ITEM,
  STATE_ITEM,
  WORKDIR_SUBDIR,
  CheckpointError,
  PinnedSteps,
  absolute_path,
  check_fingerprint,
  fingerprint_differences,
  first_line,
  handler_registry,
  metrics_to_floats,
  require_shardings,
  state_fingerprint,
  valid_fingerprint,
)
from primal_jax.training.checkpointing.warm_start import restore_params

log = logging.getLogger(__name__)


# --- the checkpointer -----------------------------------------------------------------------------


class Checkpointer:
  """Saves and restores the train state under `directory` (one subdirectory per step).

  Retention: the latest `max_to_keep` steps (None: all) are kept; with `best_metric` set, the step
  with the best value of `metrics[best_metric]` (`best_mode` 'max' or 'min'; steps saved without that
  metric or with a non-finite value never count) is kept as well when `keep_best`. This is an orbax
  `AnyPreservationPolicy(LatestN, pinned steps)`: orbax's own `best_fn` option would keep the
  `max_to_keep` best steps (plus every step without metrics) instead of the latest ones. Old steps are
  deleted when a later save finalises.

  Corrupt steps: at construction every step's `info` record and state metadata are read (small JSON
  files; array data is not read). A step that fails, or that fails `restore` later, is recorded in
  `corrupt_steps` and pinned: garbage collection never deletes it, so it stays until the user removes
  it. If the *latest* step is corrupt the constructor raises `CheckpointError` unless
  `allow_corrupt=True`, since resuming would fail and orbax would also skip every save at or below that
  step. Corruption only in array data (a truncated or altered data file) is found by `restore` (sizes and
  checksums), not at construction; a step never restored in this process is then collected like any other
  old step. `set_aside_after(step)` moves the steps after `step` out of the directory to continue from it.

  Not thread-safe; on multi-host, construct and call on every process (orbax synchronises them).
  """

  def __init__(
    self,
    directory,
    *,
    max_to_keep: int | None = 3,
    save_interval_steps: int = 1,
    best_metric: str | None = None,
    best_mode: str = "max",
    keep_best: bool = True,
    async_save: bool = True,
    allow_corrupt: bool = False,
  ):
    if max_to_keep is not None and (not isinstance(max_to_keep, int) or max_to_keep < 1):
      raise ValueError(f"max_to_keep must be None (keep all) or an integer >= 1, got {max_to_keep!r}")
    if not isinstance(save_interval_steps, int) or save_interval_steps < 1:
      raise ValueError(f"save_interval_steps must be an integer >= 1, got {save_interval_steps!r}")
    if best_mode not in ("max", "min"):
      raise ValueError(f"best_mode must be 'max' or 'min', got {best_mode!r}")
    self._directory = absolute_path(directory)
    self._best_metric = best_metric
    self._best_mode = best_mode
    self._keep_best = keep_best
    self._allow_corrupt = allow_corrupt
    self._metric_values: dict[int, float] = {}
    self._corrupt: dict[int, str] = {}
    self._async_save = async_save
    self._saving: int | None = None  # the step whose files `_seal` hashes
    policy = ocp.checkpoint_managers.AnyPreservationPolicy(
      [ocp.checkpoint_managers.LatestN(n=max_to_keep), PinnedSteps(self._pinned_steps)]
    )
    options = ocp.CheckpointManagerOptions(
      save_interval_steps=save_interval_steps,
      preservation_policy=policy,
      enable_async_checkpointing=True,  # always: orbax calls `_seal` only on its async path; sync = save + wait
      async_options=ocp.AsyncOptions(post_finalization_callback=self._seal),
      cleanup_tmp_directories=False,
    )
    self._manager = ocp.CheckpointManager(self._directory, options=options, handler_registry=handler_registry())
    self._scan()

  def _scan(self) -> None:
    for step in self._manager.all_steps():
      try:
        info = self._read_info(step)
        self._read_state_metadata(step)
      except CheckpointError:  # recorded in self._corrupt
        continue
      value = self._metric_value(info.get("metrics"))
      if value is not None:
        self._metric_values[step] = value
    latest = self.latest_step()
    if latest in self._corrupt and not self._allow_corrupt:
      reason = self._corrupt[latest]
      try:  # files that differ from their checksums explain it better: name them and the step to fall back to
        self._check_checksums(latest)
      finally:
        self._manager.close()
      raise CheckpointError(
        f"the latest checkpoint {self._step_dir(latest)} is unreadable; nothing was deleted. Move or delete "
        f"it to resume from an earlier step, or pass allow_corrupt=True to open {self._directory} anyway "
        f"(corrupt steps are then kept and reported in corrupt_steps). Cause: {reason}"
      )
    for step, reason in self._corrupt.items():
      log.warning("checkpoint %s is unreadable and will be kept (never garbage-collected): %s", step, reason)

  # --- queries

  @property
  def directory(self) -> epath.Path:
    return self._directory

  @property
  def corrupt_steps(self) -> dict[int, str]:
    """Steps found unreadable (at construction or by `restore`) -> reason; these are never deleted."""
    return dict(self._corrupt)

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def best_step(self) -> int | None:
    """The kept step with the best `best_metric` (latest on ties); None without `best_metric` or values."""
    steps = set(self._manager.all_steps())
    scored = [(value, step) for step, value in self._metric_values.items() if step in steps]
    if not scored:
      return None
    sign = 1.0 if self._best_mode == "max" else -1.0
    return max(scored, key=lambda vs: (sign * vs[0], vs[1]))[1]

  def should_save(self, step: int) -> bool:
    """Whether `save(step, ...)` without `force` would write (interval, preemption, first save)."""
    return self._manager.should_save(int(step))

  def reached_preemption(self, step: int) -> bool:
    """True on every process at the same step once JAX's preemption service saw a SIGTERM (multi-host)."""
    return self._manager.reached_preemption(int(step))

  # --- save / restore

  def save(self, step: int, state, *, metrics: Mapping[str, Any] | None = None, force: bool = False) -> bool:
    """Writes `state` (and `metrics`) as `step` if due (`save_interval_steps`) or `force`; returns whether it did.

    Due means orbax's default decision: `step` is a multiple of `save_interval_steps`, a preemption sync
    point was reached, or the directory has no checkpoint yet (so the first call always writes); never
    at or below `latest_step()`. Asynchronous: returns once the arrays are on host. Raises
    `CheckpointError` if `step` already exists (with `force`).
    """
    step = int(step)
    if not force and not self._manager.should_save(step):
      return False
    if step in self._manager.all_steps():
      raise CheckpointError(f"checkpoint {self._step_dir(step)} already exists; steps are never overwritten")
    floats = metrics_to_floats(metrics)
    info = {
      "format_version": FORMAT_VERSION,
      "step": step,
      "metrics": floats,
      "best_metric": self._best_metric,
      "saved_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
      "fingerprint": state_fingerprint(state),
    }
    value = self._metric_value(floats)
    if value is not None:
      self._metric_values[step] = value  # before saving: the retention decision is taken inside save
    args = ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardSave(state), INFO_ITEM: ocp.args.JsonSave(info)})
    try:
      self._manager.wait_until_finished()  # orbax would wait inside save: `_seal` must still see the previous step
      self._saving = step
      self._manager.save(step, args=args, force=True)
      if not self._async_save:
        self._manager.wait_until_finished()
    except BaseException:
      self._metric_values.pop(step, None)
      raise
    kept = set(self._manager.all_steps())
    self._metric_values = {s: v for s, v in self._metric_values.items() if s in kept}
    return True

  def restore(self, abstract_state, step: int | None = None) -> tuple[Any, dict]:
    """Restores `step` (default: the latest) onto the shardings of `abstract_state`.

    Args:
      abstract_state: the target pytree of `jax.ShapeDtypeStruct` with `.sharding` (e.g. `jax.eval_shape`
        of the init plus shardings), or of arrays; the mesh may differ from the one that saved.
      step: the step to restore; None for `latest_step()`.

    Returns:
      (state, info): the state with the structure and shardings of `abstract_state`, and the step's
      JSON record {'step', 'metrics', 'best_metric', 'saved_at', 'fingerprint', 'format_version'}.

    Raises:
      CheckpointError: no such step; the fingerprint differs from the target's (names the first
        differing leaves with saved vs expected shape); a file differs from its recorded size or SHA-256
        (names the step and the file, and the latest earlier step that verifies); or the step is unreadable
        (names the path). A damaged step is pinned against garbage collection; nothing is deleted.
      ValueError: a leaf of `abstract_state` has no sharding.
    """
    require_shardings(abstract_state, "abstract_state")
    self._manager.wait_until_finished()  # a step still being written would read as corrupt
    step = self._resolve_step(step)
    info = self._read_info(step)
    check_fingerprint(info["fingerprint"], state_fingerprint(abstract_state), str(self._step_dir(step)))
    self._check_checksums(step)
    args = ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardRestore(abstract_state)})
    try:
      restored = self._manager.restore(step, args=args)[STATE_ITEM]
    except Exception as err:
      raise self._corrupt_error(step, f"reading the {STATE_ITEM} arrays failed", err) from err
    return restored, info

  @staticmethod
  def restore_params(path, abstract_params, *, step: int | None = None) -> Any:
    """The module-level `restore_params`: only the params of another run's checkpoint (`config.init_from`)."""
    return restore_params(path, abstract_params, step=step)

  def verify(self, step: int) -> list[str] | None:
    """Files of `step` that differ from their recorded size or SHA-256 ([] if none; None: nothing recorded)."""
    self._manager.wait_until_finished()
    return verify_step_dir(self._step_dir(self._resolve_step(step)))

  def last_verified_step(self, before: int | None = None) -> int | None:
    """The latest step (below `before`, if given) whose files match their checksums; None if there is none.

    Reads every file of each step it tries, so it is for error paths, not for every step of a run.
    """
    for step in reversed(self.all_steps()):
      if (before is None or step < before) and step not in self._corrupt and self.verify(step) == []:
        return step
    return None

  def set_aside_after(self, step: int) -> list[epath.Path]:
    """Moves every step after `step` to `<directory>.set_aside/` so that a run continues from `step`.

    The way back from a damaged latest step: the moved steps are kept (evidence, never deleted), orbax
    no longer lists them, and the run saves those step numbers again. Returns where they went.
    """
    self._manager.wait_until_finished()
    step = self._resolve_step(step)
    moved = [set_aside(self._directory, s) for s in self.all_steps() if s > step]
    self._manager.reload()
    for s in [s for s in (*self._corrupt, *self._metric_values) if s > step]:
      self._corrupt.pop(s, None)
      self._metric_values.pop(s, None)
    return moved

  def wait_until_finished(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # --- internals

  def _pinned_steps(self) -> set[int]:
    pinned = set(self._corrupt)
    best = self.best_step() if self._keep_best else None
    if best is not None:
      pinned.add(best)
    return pinned

  def _metric_value(self, metrics) -> float | None:
    if self._best_metric is None or not isinstance(metrics, Mapping) or self._best_metric not in metrics:
      return None
    try:
      value = float(metrics[self._best_metric])
    except (TypeError, ValueError):
      return None
    return value if math.isfinite(value) else None

  def _step_dir(self, step: int) -> epath.Path:
    return self._directory / str(step)

  def _resolve_step(self, step: int | None) -> int:
    steps = self.all_steps()
    if step is None:
      if not steps:
        raise CheckpointError(f"no checkpoint in {self._directory}; check latest_step() before restoring")
      return steps[-1]
    if int(step) not in steps:
      raise CheckpointError(f"no checkpoint for step {step} in {self._directory}; available steps: {steps}")
    return int(step)

  def _seal(self) -> None:
    """orbax's post-finalization callback (primary process, before the tmp directory is renamed)."""
    tmp = self._directory / f"{self._saving}{ocp.path.atomicity.TMP_DIR_SUFFIX}"
    write_manifest(tmp if tmp.exists() else self._step_dir(self._saving))

  def _check_checksums(self, step: int) -> None:
    problems = verify_step_dir(self._step_dir(step))
    if problems is None:
      log.warning("checkpoint %s: %s; restored without verifying its bytes", self._step_dir(step), NO_MANIFEST)
      return
    if not problems:
      return
    self._corrupt[step] = f"checksum mismatch: {describe_problems(problems)}"
    previous = self.last_verified_step(before=step)
    offer = (
      f"The latest earlier step whose checksums verify is {previous}"
      if previous is not None
      else "No earlier step verifies"
    )
    raise CheckpointError(
      f"checkpoint step {step} ({self._step_dir(step)}) is damaged: its files differ from the checksums recorded "
      f"when it was saved: {describe_problems(problems)}; nothing was deleted. {offer}.",
      step=step,
      previous_good=previous,
    )

  def _corrupt_error(self, step: int, what: str, err: BaseException) -> CheckpointError:
    reason = f"{what}: {first_line(err)}"
    self._corrupt[step] = reason
    return CheckpointError(
      f"checkpoint {self._step_dir(step)} is unreadable (corrupt or incomplete); nothing was deleted and "
      f"it will not be garbage-collected. Remove it yourself to resume from an earlier step. Cause: {reason}",
      step=step,
    )

  def _read_info(self, step: int) -> dict:
    try:
      info = self._manager.restore(step, args=ocp.args.Composite(**{INFO_ITEM: ocp.args.JsonRestore()}))[INFO_ITEM]
    except Exception as err:
      raise self._corrupt_error(step, f"reading the {INFO_ITEM} record failed", err) from err
    if not isinstance(info, dict) or info.get("step") != step or not valid_fingerprint(info.get("fingerprint")):
      bad = ValueError(f"expected a dict with step={step} and a fingerprint, got {str(info)[:200]}")
      raise self._corrupt_error(step, f"the {INFO_ITEM} record is malformed", bad)
    return info

  def _read_state_metadata(self, step: int) -> None:
    try:
      metadata = self._manager.item_metadata(step)[STATE_ITEM]
    except Exception as err:
      raise self._corrupt_error(step, f"reading the {STATE_ITEM} metadata failed", err) from err
    if metadata is None:
      raise self._corrupt_error(step, f"the {STATE_ITEM} item is missing", FileNotFoundError(str(self._step_dir(step))))


__all__ = [  # the format's names too: one import for a reader of checkpoints
  "WORKDIR_SUBDIR",
  "CheckpointError",
  "Checkpointer",
  "fingerprint_differences",
  "restore_params",
  "state_fingerprint",
]
