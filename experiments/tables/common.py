"""Where the records are, and the small formatters the table modules share."""

from __future__ import annotations

import os
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
