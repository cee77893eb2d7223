"""What a generated table reads, and whether each record is clean: the collection behind `python -m
experiments.provenance` and the note `experiments.docs_tables` writes under a docs table that reads unclean records.

A table's records are the sweep runs of the rows it shows or compares (`Row.sources`, which the table modules pass
to `common.note_rows`; a clean rerun where there is one) and every other JSON record it opens under
experiments/results or benchmarks/results (benchmark records, the one-off LRA records, spectra, evaluation records:
seen by a Python audit hook on `open`, so no table module has to list them). A record's origin is
`experiments.engine.records.run_origin` (a run directory) or `record_origin` (a JSON file).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from experiments.engine.records import RESULT_FILE, Origin, record_origin, run_origin
from experiments.tables import common
from primal_jax.atomic_files import read_json

# Files the tables read (under experiments/results) that describe inputs, not runs: not checked.
INPUTS = {
  "recorded_commands.json": "the mapping of recorded --config values to current ones",
  "d4rl/datasets.json": "the regenerated D4RL datasets (command, sha256, score of each)",
}
# The files of a run directory; read from a sweep's runs/<key>/ they are the scan of its records, which the rows'
# sources replace (a table reads the runs of the rows it shows, not every record of the family).
RUN_FILES = frozenset({RESULT_FILE, "summary.json", "provenance.json", "config.json", "metrics.jsonl", "attempts.json"})
# What a table's text says about a record that is not clean, by its state (`Origin.state`), in this order.
SAYS = {
  "legacy, no commit": ("legacy, no commit",),
  "dirty tree": ("dirty tree",),
  "tree state not recorded": ("dirty tree", "tree state not recorded"),
}

_OPENED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("opened", default=None)
_HOOKED: list[bool] = []


def _audit(event: str, args: tuple) -> None:
  if event == "open" and (found := _OPENED.get()) is not None and isinstance(args[0], (str, os.PathLike)):
    found.append(os.fspath(args[0]))


@contextlib.contextmanager
def opened() -> Iterator[list[str]]:
  """The paths of the files opened in this context (Python's `open` audit event; the hook is installed once, and
  outside this context it costs a context-variable lookup per event)."""
  if not _HOOKED:
    sys.addaudithook(_audit)
    _HOOKED.append(True)
  with common.collecting(_OPENED) as found:
    yield found


def file_records(paths: Iterable[str]) -> dict[Path, Origin]:
  """The records among files a table opened: JSON files under experiments/results or benchmarks/results, `INPUTS`
  and a sweep run's own files (`RUN_FILES` under runs/<key>/) left out. A file of a run directory (one holding a
  summary.json or result.json) stands for the directory (`run_origin`) unless it states an origin of its own (an
  evaluation record)."""
  found: dict[Path, Origin] = {}
  roots = (common.RESULTS.resolve(), common.BENCHMARK_RESULTS.resolve())
  inputs = {common.RESULTS.resolve() / name for name in INPUTS}
  for raw in dict.fromkeys(paths):
    path = Path(raw).resolve()
    if not any(path.is_relative_to(root) for root in roots):
      continue
    if path in inputs or path.suffix not in (".json", ".jsonl") or not path.is_file():
      continue
    folder = path.parent
    if folder.parent.name == "runs" and path.name in RUN_FILES:
      continue
    in_run = (folder / "summary.json").exists() or (folder / RESULT_FILE).exists()
    own = record_origin(read_json(path, "a record")) if path.suffix == ".json" else Origin(None, None)
    if in_run and (path.name in RUN_FILES or own.commit is None):
      found[folder] = run_origin(folder)
    else:
      found[path] = own
  return found


def records_read(render: Callable[[], str]) -> tuple[str, dict[Path, Origin]]:
  """`render()`'s text and the records it read (see the module docstring), by path."""
  with common.reading() as runs, opened() as files:
    text = render()
  found = {Path(run): run_origin(run) for run in dict.fromkeys(runs)}
  found.update((path, origin) for path, origin in file_records(files).items() if path not in found)
  return text, dict(sorted(found.items()))


def unsaid(text: str, origins: Iterable[Origin]) -> list[str]:
  """The states (`SAYS` order) of the records that are not clean whose phrase `text` does not contain."""
  states = {origin.state for origin in origins if not origin.clean}
  return [state for state in SAYS if state in states and not any(phrase in text for phrase in SAYS[state])]


def unclean_note(text: str, records: Mapping[Path, Origin]) -> str | None:
  """The line a docs table gets under it where it reads records that are not clean and does not say so itself
  ('Records read: 9; legacy, no commit: 9 of 9 ...'), None where it has nothing to add."""
  if not unsaid(text, records.values()):
    return None
  counts = {state: sum(o.state == state for o in records.values()) for state in SAYS}
  parts = [f"{state}: {n} of {len(records)}" for state, n in counts.items() if n]
  return (
    f"Records read: {len(records)}, not all clean ({'; '.join(parts)}): `python -m experiments.provenance` lists "
    "them; a rerun at a clean commit replaces them (docs/experiments.md)."
  )
