"""Rows over seeds from the finished runs' records, and the results.md / results.csv tables of a sweep (`Row` itself
lives in `experiments.engine.rows`, below the modules that read it; imported here for callers)."""

from __future__ import annotations

import csv
import io
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from experiments.engine import tuning
from experiments.engine.paired import PAIRED_CSV, paired_csv, paired_markdown
from experiments.engine.records import RESULT_FILE, read_result, record_dir
from experiments.engine.rows import Cell, Row
from experiments.engine.spec import PROTOCOL_METRIC, PROTOCOL_TITLE, PROTOCOLS, PlannedRun, Sweep, plan
from primal_jax import markdown
from primal_jax.atomic_files import read_json

log = logging.getLogger(__name__)


def summary_value(summary: dict, protocol: str) -> float | None:
  """The number a table shows for a run: test accuracy in %, the D4RL normalised score or test bits per byte
  (language models), None if the summary has no such entry."""
  entry = summary.get(PROTOCOL_METRIC[protocol]) if isinstance(summary, Mapping) else None
  if not isinstance(entry, Mapping):
    return None
  if "accuracy" in entry:
    return 100.0 * entry["accuracy"]
  for name in ("normalized_score", "bits_per_byte"):
    if name in entry:
      return float(entry[name])
  return None


def validation_value(summary: dict) -> float:
  """A run's best validation score in the tables' units (summary `best_validation`: accuracy in %, the D4RL
  normalised score or bits per byte), nan where it has none."""
  entry = summary.get("best_validation") if isinstance(summary, Mapping) else None
  if not isinstance(entry, Mapping):
    return float("nan")
  if entry.get("accuracy") is not None:
    return 100.0 * float(entry["accuracy"])
  for name in ("normalized_score", "bits_per_byte"):
    if entry.get(name) is not None:
      return float(entry[name])
  return float("nan")


def unscored_line(key: str, cell: Cell, seed: int | str, protocol: str) -> str:
  """The line that flags a finished run whose summary lacks its protocol's entry (left out of its row)."""
  labels = " ".join(f"{k}={v}" for k, v in cell.labels)
  return (
    f"run {key} ({cell.table} {labels}, seed {seed}, {protocol}) has no `{PROTOCOL_METRIC[protocol]}` in its "
    f"summary: not counted (see runs/{key}/train.log; delete runs/{key}/{RESULT_FILE} to train it again)"
  )


def _row(cell: Cell, protocol: str, found: Sequence[tuple[str, int, dict, Path]], planned: int, stored: bool) -> Row:
  """The Row of (key, seed, result, run directory) entries: the runs whose summary has the protocol's value, the
  rest listed in `Row.unscored` (and logged when `stored`: `write_results` names them itself)."""
  scored, unscored, sources = [], [], []
  for key, seed, result, source in found:
    value = summary_value(result.get("summary"), protocol)
    if value is None:
      if stored:
        log.warning(unscored_line(key, cell, seed, protocol))
      unscored.append((key, seed))
    else:
      scored.append((key, seed, value, result["wall_seconds"], validation_value(result.get("summary"))))
      sources.append(str(source))
  return Row(
    cell,
    protocol,
    tuple(value for _, _, value, *_ in scored),
    planned=planned,
    wall_seconds=tuple(wall for *_, wall, _ in scored),
    keys=tuple(key for key, *_ in scored) if stored else (),
    unscored=tuple(unscored),
    seeds=tuple(seed for _, seed, *_ in scored),
    validations=tuple(validation for *_, validation in scored),
    sources=tuple(sources),
  )


# --- aggregation


def aggregate(sweep: Sweep, workdir: str | Path, planned: Mapping[str, PlannedRun] | None = None) -> list[Row]:
  """One Row per (table cell, protocol), in the order the sweep lists them, from the finished runs (each run's
  record found by `records.record_dir`: a clean rerun's where there is one)."""
  planned = plan(sweep.runs) if planned is None else planned
  key_of = {run: key for key, p in planned.items() for run in p.runs}
  keys: dict[tuple[Cell, str], list[str]] = {}
  for run in sweep.runs:
    group = keys.setdefault((run.cell, run.protocol), [])
    if key_of[run] not in group:
      group.append(key_of[run])
  seeds = {(run.cell, run.protocol, key_of[run]): run.seed for run in sweep.runs}
  rows = []
  for (cell, protocol), group in keys.items():
    results = [(key, source, read_result(source)) for key in group for source in [record_dir(workdir, key)]]
    found = [(key, seeds[(cell, protocol, key)], r, source) for key, source, r in results if r is not None]
    rows.append(_row(cell, protocol, found, len(group), stored=False))
  return rows


def stored_rows(workdir: str | Path) -> list[Row]:
  """One Row per (table cell, protocol) from the finished runs' own records, without planning a sweep.

  Every `result.json` names the cells it reports to, so a finished sweep's tables can be rebuilt after its
  sweep file or configs changed (which changes the run hashes that `aggregate` looks runs up by). Rows are
  sorted by (table, labels, protocol); accuracies within a row by seed. `planned` is the number found.

  A run with a clean rerun (`records.record_dir`) counts with the rerun's record, in the cells the sweep's own
  record names: a rerun replaces its original, it adds no row.
  """
  groups: dict[tuple[Cell, str], list[tuple[int, str, dict, Path]]] = {}  # (seed, key, result, its directory)
  for path in sorted(Path(workdir).glob(f"runs/*/{RESULT_FILE}")):
    own = read_json(path, "a finished run's record")
    source = record_dir(workdir, path.parent.name)
    result = own if source == path.parent else read_result(source)
    for entry in own["runs"]:
      recorded = entry["cell"]
      cell = Cell(recorded["table"], tuple(tuple(pair) for pair in recorded["labels"]), recorded["paper"])
      groups.setdefault((cell, entry["protocol"]), []).append((entry["seed"], path.parent.name, result, source))
  rows = []
  for (cell, protocol), found in sorted(groups.items(), key=lambda i: (i[0][0].table, i[0][0].labels, i[0][1])):
    found = sorted(found, key=lambda item: item[0])  # by seed
    rows.append(_row(cell, protocol, [(key, seed, r, d) for seed, key, r, d in found], len(found), stored=True))
  return rows


def _fmt(row: Row | None, digits: int = 1) -> str:
  if row is None or not row.n:
    return "-"
  return f"{row.mean:.{digits}f}" if row.n < 2 else f"{row.mean:.{digits}f} ± {row.std:.{digits}f}"


def results_markdown(sweep: Sweep, rows: Sequence[Row], walls: Sequence[float]) -> str:
  """One Markdown table per sweep table: labels, the paper's number, each protocol's mean ± std and n; after a
  table named in `sweep.baselines`, its paired differences (`experiments.engine.paired`)."""
  by_cell: dict[Cell, dict[str, Row]] = {}
  for row in rows:
    by_cell.setdefault(row.cell, {})[row.protocol] = row
  protocols = [p for p in PROTOCOLS if any(row.protocol == p for row in rows)]
  out = []
  for table in dict.fromkeys(cell.table for cell in by_cell):
    cells = [cell for cell in by_cell if cell.table == table]
    columns = list(dict.fromkeys(k for cell in cells for k, _ in cell.labels))
    header = [*columns, "paper"] + [h for p in protocols for h in (PROTOCOL_TITLE[p], "n")]
    body = []
    for cell in cells:
      labels = dict(cell.labels)
      values = [labels.get(c, "") for c in columns] + ["-" if cell.paper is None else f"{cell.paper:.1f}"]
      for p in protocols:
        row = by_cell[cell].get(p)
        values += [_fmt(row, sweep.digits), f"{row.n}/{row.planned}" if row else "-"]
      body.append(values)
    out += [f"### {sweep.titles.get(table, table)}", "", markdown.table(header, body, numeric_from=len(columns)), ""]
    out += tuned_markdown(sweep, rows, table) + paired_markdown(sweep, rows, table)
  if walls:
    out.append(
      f"{len(walls)} distinct runs finished; wall time {sum(walls) / 3600:.2f} h in all, {np.mean(walls):.0f} s "
      f"per run (min {min(walls):.0f} s, max {max(walls):.0f} s), each run's from start to result (compilation, "
      "data loading and, in subprocess mode, process start included)."
    )
  out.append(
    f"{sweep.value_name}, mean ± sample std (ddof=1) over seeds; n = finished/planned seeds. "
    + " ".join(f"{PROTOCOL_TITLE[p]}: summary `{PROTOCOL_METRIC[p]}`." for p in protocols)
  )
  if sweep.notes:
    out += ["", sweep.notes]
  flagged = [(row, entry) for row in rows for entry in row.unscored]
  if flagged:
    out += ["", "Finished runs left out of the tables:", ""]
    out += [f"- {unscored_line(key, row.cell, seed, row.protocol)}" for row, (key, seed) in flagged]
  return "\n".join(out) + "\n"


def tuned_markdown(sweep: Sweep, rows: Sequence[Row], table: str) -> list[str]:
  """The lines after a tuned table (`Sweep.tuned`): each group's mean validation per tried value and its choice."""
  if table not in sweep.tuned:
    return []
  column, pilot = sweep.tuned[table], sweep.pilot.get(table)
  over = "seeds" if pilot is None else f"the pilot seeds {', '.join(map(str, pilot))}"
  lines = [f"Chosen on validation ({column}: mean best-validation score over {over} per value tried):", ""]
  for choice in tuning.sweep_choices(sweep, rows, table):
    labels = " ".join(v for _, v in choice.labels)
    tried = ", ".join(f"{v}: {'-' if math.isnan(m) else f'{m:.{sweep.digits}f}'}" for v, m in choice.tried)
    chosen = choice.chosen if choice.chosen is not None else "pending (a value's runs have not all finished)"
    lines.append(f"- {labels} ({choice.protocol}): {tried}; chosen {chosen}")
  return [*lines, ""]


def results_csv(rows: Sequence[Row]) -> str:
  columns = list(dict.fromkeys(k for row in rows for k, _ in row.cell.labels))
  buffer = io.StringIO()
  writer = csv.writer(buffer, lineterminator="\n")
  writer.writerow(["table", *columns, "protocol", "n", "planned", "mean", "std", "paper", "accuracies", "mean_wall_s"])
  for row in rows:
    labels = dict(row.cell.labels)
    writer.writerow(
      [row.cell.table, *(labels.get(c, "") for c in columns), row.protocol, row.n, row.planned]
      + [f"{row.mean:.4f}" if row.n else "", f"{row.std:.4f}" if row.n > 1 else ""]
      + ["" if row.cell.paper is None else row.cell.paper, ";".join(f"{a:.4f}" for a in row.accuracies)]
      + [f"{np.mean(row.wall_seconds):.1f}" if row.n else ""]
    )
  return buffer.getvalue()


def write_results(
  sweep: Sweep,
  workdir: str | Path,
  planned: Mapping[str, PlannedRun] | None = None,
  *,
  print_fn: Callable[[str], None] = print,
) -> list[Row]:
  """results.md, results.csv (and paired.csv for a sweep with baselines: `experiments.engine.paired`) and the
  sweep's plots in `workdir`; returns the rows. A finished run without its protocol's value is left out of its
  row and named (`unscored_line`) to `print_fn` and in results.md."""
  workdir = Path(workdir)
  rows, texts = results_files(sweep, workdir, planned)
  for row in rows:
    for key, seed in row.unscored:
      print_fn(unscored_line(key, row.cell, seed, row.protocol))
  for name, text in texts.items():
    (workdir / name).write_text(text)
  if sweep.plot is not None:
    sweep.plot(rows, workdir)
  return rows


def results_files(
  sweep: Sweep, workdir: Path, planned: Mapping[str, PlannedRun] | None = None
) -> tuple[list[Row], dict[str, str]]:
  """The rows and the text of each table file `write_results` writes in `workdir` (file name -> text), written
  nowhere (`experiments.tables.sweep_files` checks the committed ones against it)."""
  planned = plan(sweep.runs) if planned is None else planned
  rows = aggregate(sweep, workdir, planned)
  results = [r for r in (read_result(record_dir(workdir, key)) for key in planned) if r is not None]
  texts = {"results.md": results_markdown(sweep, rows, [r["wall_seconds"] for r in results])}
  texts["results.csv"] = results_csv(rows)
  if sweep.baselines:
    texts[PAIRED_CSV] = paired_csv(sweep, rows)
  return rows, texts


def result_line(planned: PlannedRun, summary: dict) -> str:
  protocol = planned.runs[0].protocol
  value = summary_value(summary, protocol)
  return "no test result" if value is None else f"{PROTOCOL_METRIC[protocol]} {value:.1f}"
