"""Which records each generated docs table reads, and whether each names a commit and a clean tree (issue 55 item 6).

  python -m experiments.provenance              # every generated table of README.md and docs/*.md
  python -m experiments.provenance --all        # list the clean records too
  python -m experiments.provenance README.md    # the tables of some documents

Every table between `<!-- table:NAME begin/end -->` markers is rendered (`experiments.docs_tables.render_table`) and
what it read is collected: the sweep runs of the rows it shows or compares (`Row.sources`, noted by the table
modules with `experiments.tables.common.note_rows`; a clean rerun where there is one), and every other JSON record
opened under experiments/results or benchmarks/results while it rendered (benchmark records, the one-off LRA
records, spectra, evaluation records: seen by a Python audit hook on `open`, so no table module has to list them).
A record's origin is `experiments.engine.records.run_origin` (a run directory) or `record_origin` (a JSON file):
clean, "legacy, no commit", "dirty tree", or "tree state not recorded" (a commit without the dirty flag, counted
as not clean); a record that names no platform / device is flagged as well.

Exit status 1 where a README.md table reads a record that is not clean, or a table of another document reads one
and its text does not say so ("legacy, no commit" for a legacy record; "dirty tree" or "tree state not recorded"
for the others), docs/archive.md (the superseded runs) aside; a figure of README.md's Results section outside its
generated tables (the claims table) that only tables reading unclean records state fails as a README table would.
Exit status 2 on a record that does not read back. Records describing inputs rather than runs (`INPUTS`) are not
checked. A table is judged as a whole: its text says "legacy, no commit" somewhere, not necessarily in the row of
the legacy record.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import dataclasses
import os
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from experiments.engine.records import RESULT_FILE, Origin, record_origin, run_origin
from experiments.tables import common
from experiments.tables.common import ROOT, reading
from primal_jax.atomic_files import DamagedFileError, read_json

README = "README.md"
EXEMPT = ("docs/archive.md",)  # superseded tables: listed, never a failure
# Files the tables read (under experiments/results) that describe inputs, not runs: not checked.
INPUTS = {
  "recorded_commands.json": "the mapping of recorded --config values to current ones",
  "d4rl/datasets.json": "the regenerated D4RL datasets (command, sha256, score of each)",
}
# The files of a run directory; read from a sweep's runs/<key>/ they are the scan of its records, which the rows'
# sources replace (a table reads the runs of the rows it shows, not every record of the family).
RUN_FILES = frozenset({RESULT_FILE, "summary.json", "provenance.json", "config.json", "metrics.jsonl", "attempts.json"})
# What a table's text says about a record that is not clean, by its state.
SAYS = {
  "legacy, no commit": ("legacy, no commit",),
  "dirty tree": ("dirty tree",),
  "tree state not recorded": ("dirty tree", "tree state not recorded"),
}
# Measured figures (as tests/test_docs_provenance.py): decimals, ratios and percentages; and intervals ("[+1.4, +3.8]",
# as the forest plots state them), which a number alone would match by coincidence in an unrelated table.
FIGURE = re.compile(r"(?<![\w.])(?:\d+(?:\.\d+)?%|\d+(?:,\d{3})*\.\d+x?|\d+(?:,\d{3})*x\b)")
INTERVAL = re.compile(r"\[[+-]?\d[\d,]*\.\d+, [+-]?\d[\d,]*\.\d+\]")


@dataclasses.dataclass(frozen=True)
class Record:
  path: Path  # a run directory or a JSON file
  origin: Origin

  def line(self) -> str:
    flags = [self.origin.state] + ["no device"] * (not self.origin.devices)
    return f"  {', '.join(flags):<40} {os.path.relpath(self.path, ROOT)}"


@dataclasses.dataclass(frozen=True)
class TableCheck:
  """One generated table of a document: the records it read and the text it renders."""

  document: str  # relative to the repository root
  name: str
  text: str
  records: tuple[Record, ...]

  @property
  def unclean(self) -> list[Record]:
    return [r for r in self.records if not r.origin.clean]

  @property
  def without_device(self) -> list[Record]:
    return [r for r in self.records if not r.origin.devices]

  def failure(self) -> str | None:
    """Why this table fails the check (see the module docstring), None where it passes."""
    if not self.unclean or self.document in EXEMPT:
      return None
    if self.document == README:
      return "a README table reads records that are not clean"
    states = {r.origin.state for r in self.unclean}
    unsaid = [s for s in SAYS if s in states and not any(phrase in self.text for phrase in SAYS[s])]
    return f"reads {' and '.join(unsaid)} records and does not say so" if unsaid else None

  def summary(self) -> str:
    counts: dict[str, int] = {}
    for record in self.unclean:
      counts[record.origin.state] = counts.get(record.origin.state, 0) + 1
    unclean = "; ".join(f"{state} {n}" for state, n in counts.items())
    parts = [f"{len(self.records)} records"] + [f"not clean: {unclean}"] * bool(unclean)
    parts += [f"{len(self.without_device)} without a device"] * bool(self.without_device)
    failure = self.failure()
    return f"{self.document}: {self.name}: {', '.join(parts)}" + (f"  FAILS: {failure}" if failure else "")


_OPENED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("opened", default=None)
_HOOKED: list[bool] = []


def _audit(event: str, args: tuple) -> None:
  if event == "open" and (found := _OPENED.get()) is not None and isinstance(args[0], (str, os.PathLike)):
    found.append(os.fspath(args[0]))


@contextlib.contextmanager
def opened() -> Iterator[list[str]]:
  """The paths of the files opened in this context (Python's `open` audit event; the hook is installed once and
  costs a context-variable lookup elsewhere)."""
  if not _HOOKED:
    sys.addaudithook(_audit)
    _HOOKED.append(True)
  found: list[str] = []
  token = _OPENED.set(found)
  try:
    yield found
  finally:
    _OPENED.reset(token)


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


def table_records(name: str, base: Path) -> tuple[str, tuple[Record, ...]]:
  """The text of table `name` rendered for a document in `base`, and the records it read."""
  from experiments.docs_tables import render_table

  with reading() as runs, opened() as files:
    text = render_table(name, base)
  found = {Path(run): run_origin(run) for run in dict.fromkeys(runs)}
  found.update((path, origin) for path, origin in file_records(files).items() if path not in found)
  return text, tuple(Record(path, origin) for path, origin in sorted(found.items()))


def check_documents(paths: Sequence[Path]) -> list[TableCheck]:
  """A `TableCheck` per generated table of `paths` (each distinct table rendered once)."""
  from experiments.docs_tables import MARKER

  rendered: dict[str, tuple[str, tuple[Record, ...]]] = {}
  checks = []
  for path in paths:
    document = os.path.relpath(path.resolve(), ROOT)
    for match in MARKER.finditer(path.read_text()):
      name = match.group("name")
      if name not in rendered:
        try:
          rendered[name] = table_records(name, path.parent)
        except DamagedFileError as err:
          raise DamagedFileError(f"{document}: table {name}: {err}") from None
      checks.append(TableCheck(document, name, *rendered[name]))
  return checks


def _section(text: str, heading: str) -> str:
  start = text.find(f"\n{heading}\n")
  if start < 0:
    return ""
  end = text.find("\n## ", start + len(heading) + 2)
  return text[start : None if end < 0 else end]


def figure_failures(readme: str, checks: Sequence[TableCheck]) -> list[str]:
  """The figures of README's Results section outside its generated tables that generated tables state, but only
  tables reading records that are not clean: one line each, naming those tables."""
  from experiments.docs_tables import MARKER

  prose = MARKER.sub("", _section(readme, "## Results"))
  out = []  # an interval's bounds are judged with it, not alone
  for figure in dict.fromkeys(INTERVAL.findall(prose) + FIGURE.findall(INTERVAL.sub("", prose))):
    pattern = re.compile(r"(?<![\w.])" + re.escape(figure) + r"(?![\d])")
    stating = {c.name: c for c in checks if pattern.search(c.text)}
    if stating and all(c.unclean for c in stating.values()):
      out.append(f"{README}: figure {figure} is stated only by tables reading unclean records: {', '.join(stating)}")
  return out


def main(argv: list[str] | None = None) -> int:
  from experiments.docs_tables import documents

  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--all", action="store_true", help="list every record, the clean ones too")
  parser.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README.md and docs/*.md)")
  args = parser.parse_args(argv)
  paths = args.files or documents()
  try:
    checks = check_documents(paths)
  except DamagedFileError as err:
    print(f"provenance: error: {err}", file=sys.stderr)
    return 2
  failures = 0
  for check in checks:
    print(check.summary())
    failures += check.failure() is not None
    shown = check.records if args.all else [r for r in check.records if not r.origin.clean or not r.origin.devices]
    for record in shown:
      print(record.line())
  readme = next((p for p in paths if os.path.relpath(p.resolve(), ROOT) == README), None)
  figures = figure_failures(readme.read_text(), checks) if readme else []
  for line in figures:
    print(f"FAILS: {line}")
  failures += len(figures)
  records = {r.path: r for c in checks for r in c.records}
  unclean = sum(not r.origin.clean for r in records.values())
  print(
    f"{len(checks)} tables, {len(records)} distinct records: {unclean} not clean, "
    f"{sum(not r.origin.devices for r in records.values())} without a device; {failures} failure(s)"
  )
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
