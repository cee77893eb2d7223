"""Continuing a run from its own checkpoints: the first step of the resume order (`primal_jax.training.loop`).

`resume_state(ckpt, abstract, resume_step)` is the run's state restored from its latest step, or from step
`resume_step` (>= 0) with the steps after it set aside (moved to `<checkpoints>.set_aside/`, never deleted);
None when the run has no checkpoint yet (then `warm_start.warm_start_state` starts it). A damaged step is a
`CheckpointError` naming the step and the file and offering the latest step that verifies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from primal_jax.training.checkpointing.checkpointer import Checkpointer
from primal_jax.training.checkpointing.checksums import SET_ASIDE_SUFFIX
from primal_jax.training.checkpointing.format import WORKDIR_SUBDIR, CheckpointError


def has_checkpoints(workdir: str | Path) -> bool:
  """Whether `<workdir>/checkpoints` holds a step: the run in `workdir` is resumed, not started."""
  directory = Path(workdir) / WORKDIR_SUBDIR
  return directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir())


def resume_state(ckpt: Checkpointer, abstract, resume_step: int = -1) -> tuple[Any, str] | None:
  """(state, where it came from) restored onto `abstract`'s shardings, or None if `ckpt` holds no step."""
  if resume_step >= 0:
    if resume_step not in ckpt.all_steps():
      raise CheckpointError(
        f"resume_step={resume_step}: no such checkpoint in {ckpt.directory}; steps: {ckpt.all_steps()}"
      )
    state, _ = _restore(ckpt, abstract, resume_step)
    moved = ckpt.set_aside_after(resume_step)
    aside = f"; steps {[int(p.name.split('-')[0]) for p in moved]} set aside in {moved[0].parent}" if moved else ""
    return state, f"resumed from step {resume_step} of {ckpt.directory}{aside}"
  latest = ckpt.latest_step()
  if latest is None:
    return None
  state, _ = _restore(ckpt, abstract, latest)
  return state, f"resumed from step {latest} of {ckpt.directory}"


def _restore(ckpt: Checkpointer, abstract, step: int):
  """`ckpt.restore`, a damaged step's error extended with how to continue from the latest step that verifies."""
  try:
    return ckpt.restore(abstract, step=step)
  except CheckpointError as err:
    if err.step is None:  # not damage (a different model, no such step): nothing to fall back to
      raise
    previous = err.previous_good if err.previous_good is not None else ckpt.last_verified_step(before=err.step)
    hint = (
      f" To continue the run from step {previous}, rerun with --config.resume_step={previous} (resume_step="
      f"{previous} in the config): the steps after it are moved to {ckpt.directory}{SET_ASIDE_SUFFIX}/, not deleted."
      if previous is not None
      else " No earlier step verifies: start the run again in a new workdir."
    )
    raise CheckpointError(f"{err}{hint}", step=err.step, previous_good=previous) from err
