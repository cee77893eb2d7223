"""Which records each generated docs table reads, and whether each names a commit and a clean tree (issue 55 item 6).

  python -m experiments.provenance              # every generated table of README.md and docs/*.md
  python -m experiments.provenance --all        # list the clean records too
  python -m experiments.provenance README.md    # the tables of some documents

Every table between `<!-- table:NAME begin/end -->` markers is rendered and what it read is collected
(`experiments.tables.reads`): the sweep runs of the rows it shows or compares (`Row.sources`; a clean rerun where
there is one), and every other JSON record it opened under experiments/results or benchmarks/results (benchmark
records, the one-off LRA records, spectra, evaluation records). A record is clean, "legacy, no commit", "dirty
tree", or "tree state not recorded" (a commit without the dirty flag, counted as not clean); a record that names
no platform / device is flagged as well.

Exit status 1 where a README.md table reads a record that is not clean, or a table of another document reads one
and its section in the document does not say so ("legacy, no commit" for a legacy record; "dirty tree" or "tree
state not recorded" for the others; `experiments.docs_tables` writes a line that does under such a table, so this
fails on a section not regenerated since), docs/archive.md (the superseded runs) aside. A figure of README.md's
Results section outside its generated tables (the claims table) that only tables reading unclean records state
fails as a README table would. Exit status 2 on a record that does not read back. Records describing inputs rather
than runs (`experiments.tables.reads.INPUTS`) are not checked. A table is judged as a whole: its section says
"legacy, no commit" somewhere, not necessarily in the row of the legacy record.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from experiments.engine.records import Origin
from experiments.tables.common import ROOT
from experiments.tables.reads import unsaid
from primal_jax.atomic_files import DamagedFileError

README = "README.md"
EXEMPT = ("docs/archive.md",)  # superseded tables: listed, never a failure
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
  text: str  # the section as the document holds it (what a reader sees)
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
    states = unsaid(self.text, (r.origin for r in self.unclean))
    return f"reads {' and '.join(states)} records and does not say so" if states else None

  def summary(self) -> str:
    counts: dict[str, int] = {}
    for record in self.unclean:
      counts[record.origin.state] = counts.get(record.origin.state, 0) + 1
    unclean = "; ".join(f"{state} {n}" for state, n in counts.items())
    parts = [f"{len(self.records)} records"] + [f"not clean: {unclean}"] * bool(unclean)
    parts += [f"{len(self.without_device)} without a device"] * bool(self.without_device)
    failure = self.failure()
    return f"{self.document}: {self.name}: {', '.join(parts)}" + (f"  FAILS: {failure}" if failure else "")


def table_records(name: str, base: Path) -> tuple[str, tuple[Record, ...]]:
  """The text of table `name` rendered for a document in `base`, and the records it read."""
  from experiments.docs_tables import render_section

  text, found = render_section(name, base, note=False)
  return text, tuple(Record(path, origin) for path, origin in found.items())


def check_documents(paths: Sequence[Path]) -> list[TableCheck]:
  """A `TableCheck` per generated table of `paths`: the section the document holds, and the records the table reads
  (each distinct table rendered once)."""
  from experiments.docs_tables import MARKER

  read: dict[str, tuple[Record, ...]] = {}
  checks = []
  for path in paths:
    document = os.path.relpath(path.resolve(), ROOT)
    for match in MARKER.finditer(path.read_text()):
      name = match.group("name")
      if name not in read:
        try:
          read[name] = table_records(name, path.parent)[1]
        except DamagedFileError as err:
          raise DamagedFileError(f"{document}: table {name}: {err}") from None
      checks.append(TableCheck(document, name, match.group("body"), read[name]))
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
