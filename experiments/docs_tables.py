"""The tables of README.md and docs/*.md that restate recorded results, generated from the result files.

  python -m experiments.docs_tables            # rewrite every table between its markers
  python -m experiments.docs_tables --check    # change nothing; exit 1 naming every out-of-date table

A result file that does not read back (cut short, not JSON) stops it with one line naming the document, the
table and the file, exit status 2, and nothing written.

A generated table sits between two markers, each on a line of its own, in a Markdown file:

  <!-- table:uea:main begin -->
  ...                                           (written by this command; edits here are overwritten)
  <!-- table:uea:main end -->

The name picks the table: a key of `TABLES`, or `spectrum:<name>` (experiments/results/spectrum_<name>/)
or `benchmark:<dir>` (benchmarks/results/<dir>/, `.` for the folder itself), `decoding:<dir>` (the decoding
benchmark's JSON in benchmarks/results/<dir>/), `vs_release:<dir>` (benchmarks/vs_release.py's),
`step_profile:<dir>` (benchmarks/step_profile.py's), or
`d4rl:<table>`, `vit:<table>`, `lm:<table>` (a table of
experiments/sweeps/<family>.py from the run records in experiments/results/<family>/sweep/,
`experiments.sweep_tables`). Sources: the UEA sweep's run
records (experiments/results/uea/runs/*/result.json), the LRA records (experiments/results/lra*/), the spectrum
and benchmark JSON files, and for `lra:params` the model code itself (`experiments.lra_params`).
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

from benchmarks.step_profile import docs_table as step_profile_table
from benchmarks.vs_release import docs_table as vs_release_table
from experiments.sweep_tables import d4rl_sweep, lm_sweep, lm_throughput, mean_std, vit_sweep
from experiments.sweep_tables import markdown_table as _markdown
from primal_jax.atomic_files import DamagedFileError, read_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
BENCHMARK_RESULTS = ROOT / "benchmarks" / "results"
DOCUMENTS = ("README.md", "docs/*.md")

# Paper Table 2 (LRA test accuracy, %): task -> model -> accuracy. Image is CIFAR-10 there.
PAPER_TABLE2 = {
  "listops": {"softmax": 37.1, "primalformer": 37.3, "primal_plus": 37.3},
  "text": {"softmax": 65.0, "primalformer": 61.2, "primal_plus": 65.4},
  "retrieval": {"softmax": 79.4, "primalformer": 77.8, "primal_plus": 81.0},
  "image": {"softmax": 38.2, "primalformer": 43.0, "primal_plus": 43.9},
  "pathfinder": {"softmax": 74.2, "primalformer": 68.3, "primal_plus": 74.3},
}
MODEL_NAMES = {"softmax": "Trans. (softmax)", "primalformer": "PrimalFormer", "primal_plus": "Primal.+Trans."}
# Markers stand on lines of their own (a marker quoted inside a line of text is not one).
MARKER = re.compile(
  r"^<!-- table:(?P<name>[\w:./-]+) begin -->\n(?P<body>.*?)^<!-- table:(?P=name) end -->$", re.S | re.M
)
BEGIN = re.compile(r"^<!-- table:([\w:./-]+) begin -->$", re.M)


def _link(path: Path, base: Path, text: str | None = None) -> str:
  return f"[{text or path.name}]({os.path.relpath(path, base)})"


def _pct(accuracy: float, digits: int = 2) -> str:
  return f"{100 * accuracy:.{digits}f}"


def _minutes(seconds: float) -> str:
  return f"{seconds / 60:.1f} min"


# --- UEA (the sweep's run records)


def _uea_rows():
  from experiments.sweeping import stored_rows

  rows = stored_rows(RESULTS / "uea")
  if not rows:
    raise ValueError(f"no finished runs in {RESULTS / 'uea' / 'runs'}")
  return {(row.cell.table, row.cell.labels, row.protocol): row for row in rows}


def _uea_table(cells: Sequence[tuple[str, tuple, str]], columns: Sequence[str], paper: bool = True) -> str:
  rows = _uea_rows()
  body = []
  for table, labels, title in cells:
    release, honest = rows.get((table, labels, "release")), rows.get((table, labels, "honest"))
    if release is None and honest is None:
      raise ValueError(f"no UEA runs for {table} {labels}")
    cell = (release or honest).cell
    paper_cell = ["-" if cell.paper is None else f"{cell.paper:.1f}"] if paper else []
    body.append([*title.split(" | "), *paper_cell, mean_std(release), mean_std(honest)])
  protocols = ["ours, release protocol", "ours, honest protocol"]
  header = [*columns, *(["paper"] if paper else []), *protocols]
  return _markdown(header, body, numeric_from=len(columns))


def uea_main(base: Path) -> str:
  jv = ("dataset", "JapaneseVowels")
  cells = [
    ("table1", (jv, ("model", "Trans.")), "Trans. (softmax)"),
    ("table1", (jv, ("model", "PrimalFormer")), "PrimalFormer"),
    ("table1", (jv, ("model", "Primal.+Trans.")), "Primal.+Trans. (data-dependent W_e, W_r)"),
    ("table8", (("model", "Primal.+Trans."), ("data-dependent", "no")), "Primal.+Trans., data-independent W_e, W_r"),
  ]
  return _uea_table(cells, ["JapaneseVowels"])


def uea_table6(base: Path) -> str:
  rows = _uea_rows()
  cells = sorted({labels for table, labels, _ in rows if table == "table6"}, key=lambda ls: [float(v) for _, v in ls])
  return _uea_table([("table6", labels, " | ".join(v for _, v in labels)) for labels in cells], ["s", "eta"])


def uea_basicmotions(base: Path) -> str:
  models = ("Trans.", "PrimalFormer", "Primal.+Trans.")
  cells = [("basicmotions", (("dataset", "BasicMotions"), ("model", m)), m) for m in models]
  return _uea_table(cells, ["BasicMotions"], paper=False)


# --- LRA


def _load(path: Path) -> dict:
  return read_json(path, "a result record")


def _seed(command: str) -> int:
  found = re.search(r"--config\.seed=(\d+)", command)
  return int(found.group(1)) if found else 0


def _at(entry: dict, key: str = "accuracy") -> str:
  return f"{_pct(entry[key])} (step {entry['step']:,})"


def listops_paper(base: Path) -> str:
  files = sorted((RESULTS / "lra").glob("listops_primalformer_paper_schedule*.json"))
  body = []
  for path in sorted(files, key=lambda p: _seed(_load(p)["command"])):
    record = _load(path)
    wall = _minutes(record["wall_s"]) if "wall_s" in record else "-"
    body.append(
      [
        _link(path, base, f"seed {_seed(record['command'])}"),
        _at(record["test_at_best_validation"]),
        _at(record["final"], "test_accuracy"),
        _at(record["best_test"]),
        wall,
        f"{record['paper_test_accuracy']:.1f}",
      ]
    )
  header = ["run", "test at best validation", "test after the last step", "best test (picked on test)", "wall time"]
  return _markdown([*header, "paper"], body)


def listops_paper_evaluations(base: Path) -> str:
  records = sorted(
    (_load(p) for p in (RESULTS / "lra").glob("listops_primalformer_paper_schedule*.json")),
    key=lambda r: _seed(r["command"]),
  )
  steps = sorted({e["step"] for r in records for e in r["evaluations"]})
  body = []
  for step in steps:
    row = [f"{step:,}"]
    for record in records:
      entry = next((e for e in record["evaluations"] if e["step"] == step), None)
      row.append("-" if entry is None else f"{_pct(entry['validation/accuracy'])} / {_pct(entry['test/accuracy'])}")
    body.append(row)
  return _markdown(["step", *(f"seed {_seed(r['command'])}: validation / test" for r in records)], body)


def _task(record: dict) -> str:
  return record["task"].removeprefix("lra_")  # records name the data task ("lra_image") or the LRA task


def _data_label(task: str, data: dict) -> str:
  if task == "image":
    return {"fashion_mnist": "Fashion-MNIST"}.get(data.get("dataset"), str(data.get("dataset")))
  if task == "pathfinder":
    parts = [f"{data.get('difficulty', '?')} level"]
    if data.get("contour_length"):
      parts.append(f"{data['contour_length']}-dash paths")
    if data.get("num_distractors") == 0:
      parts.append("no distractors")
    return ", ".join(parts)
  return f"generated, {data['num_train']:,} train" if "num_train" in data else "generated"


def _training_row(path: Path, base: Path, record: dict) -> list[str]:
  schedule = record["schedule"]
  model = MODEL_NAMES.get(record["model"], record["model"])
  if record["model"] != "softmax":
    model += f", eta = {record['eta']:g}"
  return [
    _link(path, base, path.stem),
    _task(record),
    model,
    _data_label(_task(record), record["data"]),
    f"{record['steps']:,} x {schedule['batch_size']}, lr {schedule['learning_rate']:g}",
    _at(record["test_at_best_validation"]),
    _minutes(record["wall_s"]),
  ]


def lra_short(base: Path) -> str:
  body = []
  for path in sorted((RESULTS / "lra_short").glob("*.json")):
    record = _load(path)
    paper = PAPER_TABLE2.get(_task(record), {}).get(record["model"])
    body.append([*_training_row(path, base, record), "-" if paper is None else f"{paper:.1f}"])
  header = ["record", "task", "model", "data", "steps x batch, lr", "test at best validation", "wall time", "paper"]
  return _markdown(header, body, numeric_from=5)


def pathfinder_trials(base: Path) -> str:
  body = []
  for path in sorted((RESULTS / "lra_short" / "pathfinder_trials").glob("*.json")):
    record = _load(path)
    if "history" in record:  # experiments.pathfinder_learnability: a conv net, tested every 100 steps
      geometry = record["geometry"]
      data = _data_label("pathfinder", {"difficulty": "easy", **geometry})
      last = record["history"][-1]
      body.append(
        [
          _link(path, base, path.stem),
          "pathfinder",
          "conv net",
          data,
          f"{record['steps']:,} x {record['batch_size']}, lr {record['learning_rate']:g}",
          f"{_pct(last['test_accuracy'])} (step {last['step']:,}, last)",
          _minutes(record["data_s"] + record["train_s"]),
        ]
      )
    else:
      body.append(_training_row(path, base, record))
  header = ["record", "task", "model", "data", "steps x batch, lr", "test accuracy", "wall time"]
  return _markdown(header, body, numeric_from=5)


def lra_params(base: Path) -> str:
  from experiments import lra_params as params

  return params.table()


# --- spectra and benchmarks


def spectrum(name: str, base: Path) -> str:
  path = RESULTS / f"spectrum_{name}" / "spectrum.json"
  record = _load(path)
  blocks = sorted({re.search(r"block_(\d+)", layer["name"]).group(1) for r in record["runs"] for layer in r["layers"]})
  body = []
  for run in record["runs"]:
    by_block = {re.search(r"block_(\d+)", layer["name"]).group(1): layer for layer in run["layers"]}
    row = [run["label"], f"{run['step']:,}"]
    for block in blocks:
      stats = by_block[block]["stats"] if block in by_block else None
      row.append(
        "-" if stats is None else f"{stats['components_90']['mean']:.2f} / {stats['components_99']['mean']:.2f}"
      )
    body.append(row)
  length = record["runs"][0]["layers"][0]["length"]["mean"]
  header = ["run", "step", *(f"block {b}: 90% / 99%" for b in blocks)]
  caption = (
    f"Components for 90% / 99% of the energy, mean over {record['num_examples']} {record['split']} sequences "
    f"(mean length {length:,.1f}); {_link(path, base, 'spectrum.json')}."
  )
  return _markdown(header, body, numeric_from=1) + "\n\n" + caption


def _seconds(value: float) -> str:
  return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def decoding(name: str, base: Path) -> str:
  """The decoding benchmark's tables (benchmarks/decoding.py), regenerated from its decoding.json."""
  from benchmarks import decoding as dec
  from benchmarks import harness as bm

  return dec.markdown(bm.load_results(BENCHMARK_RESULTS / name / "decoding.json")).strip()


def benchmark(name: str, base: Path) -> str:
  from benchmarks import harness as bm

  folder = BENCHMARK_RESULTS / name
  results = bm.load_results(folder / "efficiency.json")
  meta, reference = results["meta"], results["meta"].get("reference", "softmax")
  records = [r for r in results["records"] if not r.get("error")]
  # A (variant, N) the run could not time is a cell saying why (efficiency.py's budgets), never a gap.
  failed = {(r["variant"], r["seq_len"]): r.get("not_run", "failed") for r in results["records"] if r.get("error")}
  lengths = sorted({r["seq_len"] for r in results["records"]})
  variants = list(dict.fromkeys(r["variant"] for r in results["records"]))
  # Memory at the longest N that every variant ran, so the column compares like with like.
  shared = [n for n in lengths if all(any(r["seq_len"] == n and r["variant"] == v for r in records) for v in variants)]
  mem_n = max(shared or lengths)
  value = {(r["variant"], r["seq_len"]): r for r in records}
  time_slopes = bm.scaling_slopes(records, "sec_per_1k_steps")
  memory_slopes = bm.scaling_slopes(records, "xla_memory.total_bytes")

  def ratio(variant: str, n: int, path: str) -> str:
    ref = value.get((reference, n))
    mine = bm.metric_value(value[variant, n], path)
    ref_value = None if ref is None or variant == reference else bm.metric_value(ref, path)
    return f" ({mine / ref_value:.2f}x)" if ref_value else ""

  body = []
  for variant in variants:
    row = [variant]
    for n in lengths:
      rec = value.get((variant, n))
      if rec is not None:
        row.append(_seconds(rec["sec_per_1k_steps"]) + ratio(variant, n, "sec_per_1k_steps"))
      else:
        not_run = failed.get((variant, n))
        row.append(
          "-"
          if not_run is None
          else {"memory": "over memory budget", "time": "over time budget"}.get(not_run, "failed")
        )
    rec = value.get((variant, mem_n))
    mem = None if rec is None else bm.metric_value(rec, "xla_memory.total_bytes")
    row.append("-" if mem is None else f"{mem / bm.MIB:,.0f}" + ratio(variant, mem_n, "xla_memory.total_bytes"))
    slopes = (time_slopes.get(variant), memory_slopes.get(variant))
    row.append(" / ".join("-" if s is None else f"{s:.2f}" for s in slopes))
    body.append(row)
  header = ["variant", *(f"N={n}" for n in lengths), f"XLA MiB, N={mem_n}", "slope: time / memory"]
  args = meta["args"]
  ratios = f" (ratio to `{reference}`)" if reference in variants else ""
  caption = (
    f"Seconds per 1,000 training steps{ratios}; {meta['device_kind']} ({meta['platform']}), "
    f"{meta.get('cpu_count', '?')} CPUs, host allocator {meta.get('allocator', 'system')}, {args['steps']} timed "
    f"steps x {args['repeats']} repeats, batch {args['batch_size']}, {meta['date'][:10]}; "
    f"{_link(folder / 'efficiency.md', base, 'all tables')}."
  )
  return _markdown(header, body) + "\n\n" + caption


TABLES: dict[str, Callable[[Path], str]] = {
  "uea:main": uea_main,
  "uea:table6": uea_table6,
  "uea:basicmotions": uea_basicmotions,
  "lra:listops_paper": listops_paper,
  "lra:listops_paper_evaluations": listops_paper_evaluations,
  "lra:short": lra_short,
  "lra:pathfinder_trials": pathfinder_trials,
  "lra:params": lra_params,
}
PARAMETERIZED: dict[str, Callable[[str, Path], str]] = {
  "spectrum": spectrum,
  "benchmark": benchmark,
  "d4rl": d4rl_sweep,
  "vit": vit_sweep,
  "lm": lm_sweep,
  "lm_throughput": lm_throughput,
  "decoding": decoding,
  "vs_release": vs_release_table,
  "step_profile": step_profile_table,
}


def render_table(name: str, base: Path) -> str:
  """The Markdown of table `name`, its links relative to `base` (the folder of the file it goes in)."""
  if name in TABLES:
    return TABLES[name](base)
  kind, _, arg = name.partition(":")
  if kind in PARAMETERIZED and arg:
    return PARAMETERIZED[kind](arg, base)
  known = [*TABLES, *(f"{k}:<name>" for k in PARAMETERIZED)]
  raise ValueError(f"unknown table {name!r}; known: {', '.join(known)}")


def fill(text: str, base: Path, select: Callable[[str], bool] | None = None) -> tuple[str, list[str]]:
  """`text` with every marked table (for which `select(name)` holds) regenerated, and the names found."""
  begins = BEGIN.findall(text)
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
        cache[name] = render_table(name, base)
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
