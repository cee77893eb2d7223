"""Each run's spectrum kept in its own run directory, so that an arm can be summarised after its checkpoints are gone.

`experiments.spectrum` writes `<workdir>/spectrum_<split>_<num_examples>.json` for every run it computes: the run's
entry of spectrum.json (seed, checkpoint step, family, eta, per-layer curves and statistics), the hash of the run's
config (`experiments.engine.spec.config_hash`, a sweep run's key) and the provenance of the computation. Sweep run
directories keep their checkpoints out of git but commit this file (.gitignore), so a later call with the same split
and number of examples reads it where the checkpoint is no longer there (a new checkout, a later session).

A stored spectrum is used only while it still describes the run: the same config where the run's config.json is
present, and the same checkpoint step as asked (`step`) or, where checkpoints are present, as the latest one. Any
other stored file is ignored (and replaced once the spectrum is computed again); never a stale spectrum.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments.engine.records import write_record
from experiments.engine.spec import config_hash
from primal_jax.atomic_files import read_json
from primal_jax.provenance import provenance

VERSION = 1
RUN_ONLY = ("label", "arm", "workdir", "source")  # fields of a spectrum.json run entry that belong to one analysis


def store_path(workdir: str | Path, split: str, num_examples: int) -> Path:
  """Where a run's spectrum on the first `num_examples` real examples of `split` is kept."""
  return Path(workdir) / f"spectrum_{split}_{num_examples}.json"


def run_config_hash(workdir: str | Path) -> str | None:
  """The config hash of the run in `workdir` (its config.json with the changes accepted on resume); None without
  a config.json (a committed sweep run directory keeps only result.json and summary.json)."""
  from primal_jax.training.experiment import load_run_config

  if not (Path(workdir) / "config.json").exists():
    return None
  return config_hash(load_run_config(workdir))


def latest_checkpoint_step(workdir: str | Path) -> int | None:
  """The latest checkpoint step in `workdir`, None where it holds no checkpoint."""
  from primal_jax.training.checkpointing import WORKDIR_SUBDIR, Checkpointer

  if not (Path(workdir) / WORKDIR_SUBDIR).is_dir():
    return None
  with Checkpointer(Path(workdir) / WORKDIR_SUBDIR) as ckpt:
    return ckpt.latest_step()


def load_stored(workdir: str | Path, split: str, num_examples: int, step: int | None = None) -> dict | None:
  """The run entry stored for (`split`, `num_examples`) if it still describes the run (see module doc), else None.

  Returns the entry with "default_label" and "config_hash" added (the label `experiments.spectrum.run_label` gave
  it, the hash of the config it was computed from).
  """
  path = store_path(workdir, split, num_examples)
  if not path.exists():
    return None
  stored = read_json(path, "a run's stored spectrum")
  if stored.get("version") != VERSION or stored["split"] != split or stored["num_examples"] != num_examples:
    return None
  current = run_config_hash(workdir)
  if current is not None and current != stored["config_hash"]:
    return None
  wanted = step if step is not None else latest_checkpoint_step(workdir)
  if wanted is not None and wanted != stored["run"]["step"]:
    return None
  return {**stored["run"], "default_label": stored["default_label"], "config_hash": stored["config_hash"]}


def save(workdir: str | Path, split: str, num_examples: int, run: Mapping[str, Any], *, default_label: str) -> Path:
  """Stores `run` (an entry of spectrum.json's runs, computed from the run's checkpoint) in its run directory."""
  path = store_path(workdir, split, num_examples)
  entry = {k: v for k, v in run.items() if k not in RUN_ONLY}
  record = {
    "version": VERSION,
    "split": split,
    "num_examples": num_examples,
    "config_hash": run_config_hash(workdir),
    "default_label": default_label,
    "run": entry,
    "provenance": provenance(),
  }
  write_record(path, record)
  return path


class MissingRunError(ValueError):
  """A workdir with neither a trained run nor a stored spectrum of the split asked for; one line naming it."""
