"""SHA-256 of every file of a checkpoint step, recorded when it is saved and checked before it is restored.

Why: orbax restores whatever bytes it finds. Bytes altered on disk (a flipped bit, a bad copy, a disk
error in an array's data file) restore silently, and the run diverges later with an error that blames
the learning rate. With the checksums, a damaged step is a `CheckpointError` naming the step and the
file before any array is read.

When: `Checkpointer` computes the manifest in orbax's `post_finalization_callback`, on the primary
process after every process has written its files and *before* orbax renames
`<step>.orbax-checkpoint-tmp` to `<step>`; the manifest is written atomically into that directory, so
a step appears with its checksums or not at all (on `gs://`, where orbax marks completion with
`commit_success.txt` instead of a rename, it is written into the step before that marker). The hashing
runs in orbax's background thread, so the train loop does not wait for it.

Layout: `<directory>/<step>/checksums.json` = {"algorithm": "sha256", "files": {relative path:
{"size": bytes, "sha256": hex}}}, covering every file of the step's items (`state/`, `info/`): the
arrays, their metadata and the info record. orbax's step-level bookkeeping files are rewritten after
the callback and are not covered. Steps saved before
checksums existed have no manifest: they restore with a warning (`NO_MANIFEST`).
"""

from __future__ import annotations

import datetime
import hashlib
import json

from etils import epath

from primal_jax.atomic_files import write_json_atomically

MANIFEST_FILE = "checksums.json"
ALGORITHM = "sha256"
SET_ASIDE_SUFFIX = ".set_aside"  # `<directory>.set_aside/<step>`: steps moved out of the way by a fallback
NO_MANIFEST = "no checksums recorded (saved before checksums existed)"
_MAX_REPORTED = 5


def file_sha256(path: epath.Path) -> str:
  """Hex SHA-256 of a file (local or gs://), read in 4 MiB blocks."""
  digest = hashlib.sha256()
  with path.open("rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      digest.update(block)
  return digest.hexdigest()


def _files(step_dir: epath.Path) -> list[epath.Path]:
  """Every file of the step's items (its subdirectories; epath has no recursive glob on object stores).

  Files directly in `step_dir` are orbax's bookkeeping (`_CHECKPOINT_METADATA`, `commit_success.txt`),
  rewritten after the callback that hashes the step, and the manifest itself: not covered.
  """
  files, folders = [], [p for p in step_dir.iterdir() if p.is_dir()]
  while folders:
    for path in folders.pop().iterdir():
      (folders if path.is_dir() else files).append(path)
  return sorted(files)


def compute_manifest(step_dir: epath.Path) -> dict:
  """{"algorithm", "files": {relative path: {"size", "sha256"}}} of every file under `step_dir`."""
  files = {}
  for path in _files(step_dir):
    rel = str(path.relative_to(step_dir))
    files[rel] = {"size": path.stat().length, "sha256": file_sha256(path)}
  return {"algorithm": ALGORITHM, "files": files}


def write_manifest(step_dir: epath.Path) -> None:
  """Hashes every file of `step_dir` and writes the manifest into it (atomically on a local disk)."""
  manifest = compute_manifest(step_dir)
  target = step_dir / MANIFEST_FILE
  if "://" in str(step_dir):  # an object store writes an object whole or not at all
    target.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
  else:
    write_json_atomically(target, manifest, indent=1, sort_keys=True)


def verify_step_dir(step_dir: epath.Path) -> list[str] | None:
  """Problems found comparing the files of `step_dir` with its manifest ([] when all match).

  None when the step has no manifest (saved before checksums existed). Sizes are compared before
  any hash, so a truncated file is reported without reading the step.
  """
  target = step_dir / MANIFEST_FILE
  if not target.exists():
    return None
  try:
    manifest = json.loads(target.read_text())
    recorded = manifest["files"]
    if manifest.get("algorithm") != ALGORITHM or not isinstance(recorded, dict):
      raise ValueError(f"expected algorithm {ALGORITHM!r} and a files mapping")
  except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
    return [f"{target}: the checksum manifest itself is damaged ({type(err).__name__}: {err})"]
  problems = []
  for rel, want in sorted(recorded.items()):
    path = step_dir / rel
    if not path.exists():
      problems.append(f"{path}: missing (recorded {want['size']} bytes)")
    elif (size := path.stat().length) != want["size"]:
      problems.append(f"{path}: {size} bytes, recorded {want['size']}")
  if problems:
    return problems
  for rel, want in sorted(recorded.items()):
    if file_sha256(step_dir / rel) != want["sha256"]:
      problems.append(f"{step_dir / rel}: sha256 differs from the one recorded at save (bytes altered)")
  return problems


def describe_problems(problems: list[str]) -> str:
  shown = "; ".join(problems[:_MAX_REPORTED])
  return shown + (f"; ... and {len(problems) - _MAX_REPORTED} more" if len(problems) > _MAX_REPORTED else "")


def set_aside(directory: epath.Path, step: int) -> epath.Path:
  """Moves `<directory>/<step>` to `<directory>.set_aside/<step>` (a new name if taken); returns where.

  Moved, not deleted: a damaged step is evidence (of a bad disk, a half-copied run) the user may want.
  Outside `directory`, so orbax no longer lists it and the run can save that step number again.
  """
  parent = directory.parent / (directory.name + SET_ASIDE_SUFFIX)
  parent.mkdir(parents=True, exist_ok=True)
  target = parent / str(step)
  if target.exists():
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%f")
    target = parent / f"{step}-{stamp}"
  (directory / str(step)).rename(target)
  return target
