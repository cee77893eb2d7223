"""The tables of README.md and docs/*.md that restate recorded results, generated from the result files.

  python -m experiments.docs_tables            # rewrite every table between its markers
  python -m experiments.docs_tables --check    # change nothing; exit 1 naming every out-of-date table

A result file that does not read back (cut short, not JSON) stops it with one line naming the document, the
table and the file, exit status 2, and nothing written.

A generated table sits between two markers, each on a line of its own, in a Markdown file:

  <!-- table:uea:table8 begin -->
  ...                                           (written by this command; edits here are overwritten)
  <!-- table:uea:table8 end -->

The name picks the table: a key of `TABLES`, or `spectrum:<name>` (experiments/results/spectrum_<name>/, one row per
run; `spectrum_arms:<name>`: its arms, mean ± std over models and the paired differences by seed)
or `benchmark:<dir>` (benchmarks/results/<dir>/, `.` for the folder itself; `benchmark_vs:<dir>:<variant>`: time,
memory, FLOPs and % of the matmul peak as ratios to that variant), `decoding:<dir>` (the decoding
benchmark's JSON in benchmarks/results/<dir>/; `decoding_sized:<dir>`: its bound at each step's own size),
`vs_release:<dir>` (benchmarks/vs_release.py's; its ratios in one paragraph: `vs_release_summary:<dir>`),
`step_profile:<dir>` (benchmarks/step_profile.py's), `gemv_chain:<dir>` (benchmarks/gemv_chain.py's),
`uncertainty:<name>` (the uncertainty benchmark's tables and text plots, experiments/tables/uncertainty.py), or
`d4rl:<table>`, `vit:<table>`, `lm:<table>` (a table of
experiments/sweeps/<family>.py from the run records in experiments/results/<family>/sweep/), or
`paired:<family>:<table>` (that table's paired differences by seed against the baseline row its sweep file names;
`paired:<family>:<table>:<label>` against the row of that label instead).
A sweep's run trained again at a clean commit (`python -m experiments.sweep --unclean_in`, docs/experiments.md) is
read in place of its legacy or dirty original (`experiments.engine.records.record_dir`; the code column says
"rerun: <commit>"); `original:<name>` renders table `<name>` from the sweeps' own records, the reruns ignored
(the superseded numbers, for docs/archive.md). `python -m experiments.provenance` lists the records each table reads;
a table outside README.md that reads records which are not clean (legacy, dirty tree, tree state not recorded) and
does not say so itself gets one line under it that does (`experiments.tables.reads.unclean_note`).
Each kind is rendered by a module of `experiments.tables`; this one places the tables. Sources: the UEA sweep's run
records (experiments/results/uea_table1/runs/*/result.json), the LRA records (experiments/results/lra*/), the spectrum
and benchmark JSON files, and for `lra:params` the model code itself (`experiments.lra_params`).
Run without file arguments, it also rewrites (or, with `--check`, names) the table files each sweep wrote beside
its records, results.md, results.csv and paired.csv (`experiments.tables.sweep_files`).
`tests/test_docs_tables.py` runs the check, so a result file or a model that changes without its table fails CI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from experiments.tables import (
  decoding,
  efficiency,
  forest,
  gemv_chain,
  ksvd_ratio,
  paired_docs,
  results,
  step_profile,
  sweep_files,
  sweeps,
  uncertainty,
  vs_release,
)
from experiments.tables.common import ROOT
from experiments.tables.reads import records_read, unclean_note
from primal_jax.atomic_files import DamagedFileError

DOCUMENTS = ("README.md", "docs/*.md")
# Markers stand on lines of their own (a marker quoted inside a line of text is not one).
MARKER = re.compile(
  r"^<!-- table:(?P<name>[\w:./+()@ -]+) begin -->\n(?P<body>.*?)^<!-- table:(?P=name) end -->$", re.S | re.M
)
BEGIN = re.compile(r"^<!-- table:([\w:./+()@ -]+) begin -->$", re.M)


TABLES: dict[str, Callable[[Path], str]] = {
  "uea:table1_all": results.uea_table1_all,
  "uea:eta": results.uea_eta,
  "lm:eta": sweeps.lm_eta,  # before the parameterized lm:<table>: its rows join three tables
  "uea:table6": results.uea_table6,
  "uea:table8": results.uea_table8,
  "lra:listops_paper": results.listops_paper,
  "lra:listops_paper_evaluations": results.listops_paper_evaluations,
  "lra:short": results.lra_short,
  "lra:pathfinder_trials": results.pathfinder_trials,
  "lra:params": results.lra_params,
}
PARAMETERIZED: dict[str, Callable[[str, Path], str]] = {
  "spectrum": results.spectrum,
  "spectrum_arms": results.spectrum_arms,
  "benchmark": efficiency.docs_table,
  "benchmark_vs": efficiency.docs_relative_table,  # benchmark_vs:<dir>:<variant>: ratios to that variant
  "d4rl": sweeps.d4rl_sweep,
  "vit": sweeps.vit_sweep,
  "lra": sweeps.lra_sweep,  # lra:listops, lra:image, lra:pathfinder (the names in TABLES are matched first)
  "lm": sweeps.lm_sweep,
  "lm_throughput": sweeps.lm_throughput,
  "paired": paired_docs.paired_sweep,
  "tuned": paired_docs.tuned_sweep,
  "forest": forest.forest_sweep,
  "decoding": decoding.docs_table,
  "decoding_scaling": decoding.docs_scaling_table,
  "decoding_sized": decoding.docs_sized_table,
  "vs_release": vs_release.docs_table,
  "vs_release_summary": vs_release.docs_summary,
  "step_profile": step_profile.docs_table,
  "gemv_chain": gemv_chain.docs_table,
  "uncertainty": uncertainty.docs_table,  # uncertainty:<name>: experiments/tables/uncertainty.py
  "release_ratio": ksvd_ratio.release_ratio,  # release_ratio:<name>: the release's own eta x KSVD / task
}


ORIGINAL = "original:"  # original:<name>: table <name> from the sweeps' own records, reruns ignored


def render_table(name: str, base: Path) -> str:
  """The Markdown of table `name`, its links relative to `base` (the folder of the file it goes in)."""
  if name.startswith(ORIGINAL):
    from experiments.engine.records import originals

    with originals():
      return render_table(name.removeprefix(ORIGINAL), base)
  if name in TABLES:
    return TABLES[name](base)
  kind, _, arg = name.partition(":")
  if kind in PARAMETERIZED and arg:
    return PARAMETERIZED[kind](arg, base)
  known = [*TABLES, *(f"{k}:<name>" for k in PARAMETERIZED)]
  raise ValueError(f"unknown table {name!r}; known: {', '.join(known)}")


def render_section(name: str, base: Path, *, note: bool = True) -> tuple[str, dict]:
  """What goes between table `name`'s markers in a document in `base`, and the records it read (path -> `Origin`,
  `experiments.tables.reads`): the table, and with `note` the line saying which records are not clean where the
  table does not say so itself."""
  text, records = records_read(lambda: render_table(name, base))
  line = unclean_note(text, records) if note else None
  return (text if line is None else f"{text}\n\n{line}"), records


def fill(
  text: str, base: Path, select: Callable[[str], bool] | None = None, *, note: bool | None = None
) -> tuple[str, list[str]]:
  """`text` with every marked table (for which `select(name)` holds) regenerated (`render_section`, with its
  unclean-records line where `note`; by default in every document but those at the repository root, README.md,
  whose records must all be clean), and the names found."""
  note = Path(base).resolve() != ROOT.resolve() if note is None else note
  begins = BEGIN.findall(text)
  odd = sorted(set(re.findall(r"^<!-- table:(.+) begin -->$", text, re.M)) - set(begins))
  if odd:  # a marker the pattern would pass over: it would be left stale without a word
    raise ValueError(f"table marker with a character a table name cannot have (letters, digits, _:./+()@ -): {odd[0]}")
  names = [m.group("name") for m in MARKER.finditer(text)]
  if len(begins) != len(names):
    unmatched = sorted(set(begins) - set(names)) or begins
    raise ValueError(f"table marker without its end marker: {', '.join(unmatched)}")
  cache: dict[str, str] = {}

  def replace(match: re.Match) -> str:
    name = match.group("name")
    if select is not None and not select(name):
      return match.group(0)
    if name not in cache:
      try:
        cache[name] = render_section(name, base, note=note)[0]
      except DamagedFileError as err:
        raise DamagedFileError(f"table {name}: {err}") from None
      except json.JSONDecodeError as err:  # a reader outside this module that does not name its file
        raise DamagedFileError(f"table {name}: a JSON file it reads is damaged ({err})") from None
    return f"<!-- table:{name} begin -->\n{cache[name]}\n<!-- table:{name} end -->"

  return MARKER.sub(replace, text), names


def documents(root: Path = ROOT) -> list[Path]:
  return sorted(p for pattern in DOCUMENTS for p in root.glob(pattern))


def update(paths: Sequence[Path], *, check: bool, select: Callable[[str], bool] | None = None) -> list[str]:
  """Regenerates the tables of `paths` (unless `check`); returns "file: table" for every table that changed.

  `select(name)` limits the work to some tables (the others are left as they are).
  """
  stale, changed = [], {}
  for path in paths:  # every file is rendered before any is written: an error leaves all of them as they were
    text = path.read_text()
    try:
      new, names = fill(text, path.parent, select)
    except DamagedFileError as err:
      raise DamagedFileError(f"{os.path.relpath(path, ROOT)}: {err}") from None
    if new == text:
      continue
    changed[path] = new
    old_bodies = {m.group("name"): m.group("body") for m in MARKER.finditer(text)}
    new_bodies = {m.group("name"): m.group("body") for m in MARKER.finditer(new)}
    stale += [f"{os.path.relpath(path, ROOT)}: {n}" for n in dict.fromkeys(names) if old_bodies[n] != new_bodies[n]]
  if not check:
    for path, new in changed.items():
      path.write_text(new)
  return stale


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is out of date")
  parser.add_argument("files", nargs="*", type=Path, help=f"Markdown files (default: {', '.join(DOCUMENTS)})")
  args = parser.parse_args(argv)
  paths = args.files or documents()
  try:
    stale = update(paths, check=args.check)
    if not args.files:  # and the table files the sweeps wrote beside their records
      stale += [f"{name}: sweep tables" for name in sweep_files.update(check=args.check)]
  except DamagedFileError as err:  # a damaged result file: one line naming it, nothing written
    print(f"docs_tables: error: {err}", file=sys.stderr)
    return 2
  for entry in stale:
    print(("out of date: " if args.check else "updated: ") + entry)
  if args.check and stale:
    print("run `python -m experiments.docs_tables` and commit the result", file=sys.stderr)
    return 1
  if not stale:
    print(f"{len(paths)} file(s): every table up to date")
  return 0


if __name__ == "__main__":
  sys.exit(main())
