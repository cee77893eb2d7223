"""Where the records are, and the small formatters the table modules share."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"
BENCHMARK_RESULTS = ROOT / "benchmarks" / "results"


def link(path: Path, base: Path, text: str | None = None) -> str:
  """A Markdown link to `path` from a document in `base`."""
  return f"[{text or path.name}]({os.path.relpath(path, base)})"


def pct(accuracy: float, digits: int = 2) -> str:
  return f"{100 * accuracy:.{digits}f}"


def minutes(seconds: float) -> str:
  return f"{seconds / 60:.1f} min"


# --- what a table reads (`experiments.provenance` lists it)

_READS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("reads", default=None)


@contextlib.contextmanager
def collecting(var: contextvars.ContextVar) -> Iterator[list[str]]:
  """Sets `var` to a fresh list while the context is open and yields it: what the code run inside appends to it."""
  found: list[str] = []
  token = var.set(found)
  try:
    yield found
  finally:
    var.reset(token)


def reading() -> contextlib.AbstractContextManager[list[str]]:
  """Collects, while it is open, the run directories the tables rendered in it read their numbers from (`note_rows`);
  yields the list it fills."""
  return collecting(_READS)


def note_rows(rows: Iterable) -> list:
  """Notes the run records of `rows` (`Row.sources`) as read by the table being rendered (inside `reading`; a no-op
  elsewhere) and returns the rows: a table calls it on the rows it shows or compares, once they are selected."""
  rows = list(rows)
  if (found := _READS.get()) is not None:
    found += [source for row in rows for source in row.sources]
  return rows
