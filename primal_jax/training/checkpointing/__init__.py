"""A run's persistence: its checkpoints, and the params another run's checkpoint lends it.

  checkpointer  `Checkpointer` (orbax): save, verify, restore, retention (latest + best), set-aside
  format        what a step directory holds: the state and info items, fingerprints, `CheckpointError`
  checksums     the SHA-256 manifest of every step, written as it is saved and checked before a restore
  resume        `resume_state`: the run's own latest (or `resume_step`) checkpoint, damaged steps explained
  warm_start    `config.init_from`: `check_init_from` before anything is built, `warm_start_state` after

A train loop needs only the names below: `check_init_from` (settings, before the data and model are built),
a `Checkpointer` on `<workdir>/WORKDIR_SUBDIR`, then `resume_state` or else `warm_start_state`.
"""

from primal_jax.training.checkpointing.checkpointer import Checkpointer
from primal_jax.training.checkpointing.format import WORKDIR_SUBDIR, CheckpointError
from primal_jax.training.checkpointing.resume import has_checkpoints, resume_state
from primal_jax.training.checkpointing.warm_start import check_init_from, warm_start_state

__all__ = [
  "WORKDIR_SUBDIR",
  "CheckpointError",
  "Checkpointer",
  "check_init_from",
  "has_checkpoints",
  "resume_state",
  "warm_start_state",
]
