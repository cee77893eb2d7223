"""Records: a sweep run's result.json, the JSON record of a one-off experiment binary, and the mapping that turns
a recorded command into the one that runs now (experiments/results/recorded_commands.json).

A run's origin (`run_origin`: the commit and tree state its record names, and the devices it ran on) decides whether
it is clean. A finished run whose record is legacy (no commit) or from a dirty tree is trained again, never edited,
into the sweep's rerun folder (`rerun_folder`: `<family>/rerun/` beside `<family>/sweep/`, the same run keys;
`python -m experiments.sweep --unclean_in=SWEEP_DIR`), and `record_dir` is the one lookup every table makes:
the rerun's record where it is finished and clean, else the sweep's own (`originals()` reads the sweep's own).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from primal_jax.atomic_files import read_json, write_json_atomically

RESULT_FILE = "result.json"  # runs/<hash>/result.json: the record of a finished sweep run; its presence means done
COMMAND_MAP = Path(__file__).resolve().parents[1] / "results" / "recorded_commands.json"


def write_record(path: str | Path, record: Any) -> None:
  """`record` as indented JSON at `path`, atomically: a reader sees the old file, or none, or the whole new one."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  write_json_atomically(path, record, indent=1, default=str)


def read_result(run_dir: str | Path) -> dict | None:
  """The run's result.json, None if it has none; a damaged one is a DamagedFileError naming it."""
  path = Path(run_dir) / RESULT_FILE
  return read_json(path, "a finished run's record") if path.exists() else None


def existing_record_error(out: str | Path | None, overwrite: bool) -> str | None:
  """The message refusing to replace a recorded result at `out` without `--overwrite`; None when writing is fine."""
  if out is None or overwrite or not Path(out).exists():
    return None
  return f"--out {out} exists (a recorded result); pass --overwrite to replace it, or another --out"


def read_jsonl(path: str | Path) -> list[dict]:
  """The records of a JSON-lines file (metrics.jsonl), [] if it does not exist."""
  path = Path(path)
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@functools.cache
def _config_map() -> tuple[tuple[str, str], ...]:
  mapping = read_json(COMMAND_MAP, "the recorded-command mapping")["config"]
  return tuple(sorted(mapping.items(), key=lambda item: -len(item[0])))


def current_config(spec: str) -> str:
  """The `--config` value that runs now for a recorded one: `experiments/configs/uea.py:smoke` (a file that
  is gone; also under any directory, as benchmark records name it absolute) -> `uea:smoke`; any other unchanged."""
  path, sep, arg = spec.partition(":")
  for old, new in _config_map():
    if path == old or path.endswith("/" + old):
      return new + sep + arg
  return spec


def current_command(command: str) -> str:
  """A recorded command line with every `--config=...` value mapped by `current_config`."""
  return re.sub(r"(--config=)(\S+)", lambda m: m.group(1) + current_config(m.group(2)), command)


# --- origins and reruns

RERUN_FOLDER = "rerun"  # <family>/rerun/runs/<key>/: a clean training of the run <family>/sweep/runs/<key>/


@dataclasses.dataclass(frozen=True)
class Origin:
  """What produced a record: the commit it names (None: a legacy record), whether the tree was dirty (None: not
  recorded, e.g. a tree copied to a lent device with `$PRIMAL_JAX_COMMIT`), and the devices it ran on (None: not
  recorded)."""

  commit: str | None
  dirty: bool | None
  devices: Mapping | None = None

  @property
  def clean(self) -> bool:
    """Names a commit and a tree recorded as clean: the only records a README number may come from."""
    return self.commit is not None and self.dirty is False

  @property
  def state(self) -> str:
    """'clean', 'legacy, no commit', 'dirty tree' or 'tree state not recorded' (a commit without the dirty flag)."""
    if self.commit is None:
      return "legacy, no commit"
    return {False: "clean", True: "dirty tree"}.get(self.dirty, "tree state not recorded")


def record_origin(record: Any) -> Origin:
  """The origin a JSON record states itself: its `provenance` (training summaries, evaluations, spectra), a
  benchmark's `meta` (`provenance`, else `git_commit` and `platform` / `device_kind`, which predate it), or a
  sweep result's `summary`; Origin(None, None) where it states none."""
  if not isinstance(record, Mapping):
    return Origin(None, None)
  meta = record.get("meta") if isinstance(record.get("meta"), Mapping) else {}
  summary = record.get("summary") if isinstance(record.get("summary"), Mapping) else {}
  origin = next((p for p in (record.get("provenance"), meta.get("provenance"), summary.get("provenance")) if p), {})
  commit = origin.get("commit") or meta.get("git_commit") or None
  devices = origin.get("devices") or record.get("devices") or summary.get("devices")
  if not devices and meta.get("platform"):
    devices = {"platform": meta["platform"], "kind": meta.get("device_kind")}
  return Origin(commit, origin.get("dirty") if commit else None, devices or None)


def run_origin(run_dir: str | Path) -> Origin:
  """The origin of a run directory's record: its summary.json's `provenance` (since 2026-11-26), else the
  provenance.json written beside runs made before that, else result.json's summary; the devices from the first of
  these that names them. Origin(None, None) for a legacy record that names no commit."""
  commit, dirty, devices = None, None, None
  for name in ("summary.json", "provenance.json", RESULT_FILE):
    path = Path(run_dir) / name
    if not path.exists():
      continue
    record = read_json(path, "a run's record")
    origin = record_origin({"provenance": record} if name == "provenance.json" else record)
    if commit is None and origin.commit:
      commit, dirty = origin.commit, origin.dirty
    devices = devices or origin.devices
  return Origin(commit, dirty, devices)


def rerun_folder(workdir: str | Path) -> Path:
  """Where the runs of the sweep in `workdir` are trained again: `<family>/rerun` for `<family>/sweep`, else
  `<workdir>/rerun` (a sweep whose runs sit in its family folder itself, experiments/results/uea_table1)."""
  workdir = Path(workdir)
  return workdir.parent / RERUN_FOLDER if workdir.name == "sweep" else workdir / RERUN_FOLDER


_ORIGINALS = contextvars.ContextVar("originals", default=False)


@contextlib.contextmanager
def originals() -> Iterator[None]:
  """Within it, `record_dir` reads every sweep's own records, the reruns ignored (docs/archive.md's superseded
  tables, `original:<table>` in `experiments.docs_tables`)."""
  token = _ORIGINALS.set(True)
  try:
    yield
  finally:
    _ORIGINALS.reset(token)


def record_dir(workdir: str | Path, key: str) -> Path:
  """The directory whose record stands for run `key` of the sweep in `workdir`: the rerun's
  (`rerun_folder(workdir)/runs/<key>`) where its result.json exists and its record is clean, else the sweep's own
  `runs/<key>` (also within `originals()`). The one lookup of every table: aggregate, stored_rows, the docs tables."""
  own = Path(workdir) / "runs" / key
  if _ORIGINALS.get():
    return own
  rerun = rerun_folder(workdir) / "runs" / key
  if (rerun / RESULT_FILE).exists() and run_origin(rerun).clean:
    return rerun
  return own


def is_rerun(run_dir: str | Path) -> bool:
  """Whether a run directory (`record_dir`'s answer) is a rerun: `.../rerun/runs/<key>`."""
  return Path(run_dir).parent.parent.name == RERUN_FOLDER
