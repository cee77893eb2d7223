"""The docs tables that restate a sweep's run records (experiments/results/<family>/sweep/runs/*/result.json).

`experiments.docs_tables` renders them under the names `d4rl:<table>`, `vit:<table>`, `lm:<table>` and
`lra:<table>` (a Table 2 task of experiments/sweeps/lra.py), and
`paired:<family>:<table>` (a table's paired differences against its baseline row, `Sweep.baselines`, or with
`:<label>` against the row of that label); each
reads the finished runs' own records (`experiments.engine.aggregate.stored_rows`), so a table survives changes of
the sweep file or the configs, and a run still in progress is simply not counted yet. A run trained again at a clean
commit (`<family>/rerun/runs/<key>/`, `python -m experiments.sweep --unclean_in`) counts with the rerun's record
(`experiments.engine.records.record_dir`), and the code column says "rerun: <commit>".
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from experiments.engine.records import is_rerun, run_origin
from experiments.tables import common
from experiments.tables.common import ROOT, link, minutes, note_rows
from experiments.tables.ksvd_ratio import KSVD_RATIO, ksvd_ratio, mean_ratio
from primal_jax import markdown
from primal_jax.atomic_files import DamagedFileError, read_json

SWEEPS = ROOT / "experiments" / "sweeps"  # the sweep files (`paired:<family>:<table>` reads their baselines)


def mean_std(row, digits: int = 1, full: int = 3) -> str:
  """'mean ± std' over the row's seeds, '(n = k)' when fewer than `full` finished."""
  if row is None or not row.n:
    return "-"
  text = f"{row.mean:.{digits}f}" if row.n < 2 else f"{row.mean:.{digits}f} ± {row.std:.{digits}f}"
  return text if row.n == full else f"{text} (n = {row.n})"


def _per_run(row) -> str:
  """Mean wall time per counted run; '-' when no run of the row counts (each lacks the protocol's value)."""
  return minutes(sum(row.wall_seconds) / row.n) if row.n else "-"


# The sweep argument the docs tables read each family's sweep file with (its plan: which runs a table pairs);
# lra: the Image and Pathfinder baselines its records were trained with (docs/results.md).
DOCS_SWEEP_ARGS = {"d4rl": "halfcheetah", "uea": "table1_seeds=10", "lra": "image_baselines=linformer+longformer"}


# Record folders whose runs are of another family's sweep file (a table trained in a workdir of its own).
SWEEP_OF = {"lra_figure1": "lra", "vit_figure1_calibrated": "vit"}


def docs_sweep(family: str):
  """experiments/sweeps/<family>.py (`SWEEP_OF`'s file for a folder of its own) with the docs' argument
  (`DOCS_SWEEP_ARGS`)."""
  from experiments.engine.spec import load_sweep

  name = SWEEP_OF.get(family, family)
  arg = DOCS_SWEEP_ARGS.get(name, "")
  return load_sweep(f"{SWEEPS / name}.py" + (f":{arg}" if arg else ""))


def _rows(family: str, table: str, order: Sequence[str] = (), labels: Mapping[str, str] | None = None) -> list:
  """The rows of `table` (those whose labels include `labels`) from the family's records, sorted by `order` of
  their model; noted as what the table reads (`common.note_rows`)."""
  from experiments.engine.aggregate import stored_rows

  folder = common.RESULTS / family / "sweep"
  wanted = (labels or {}).items()
  stored = [row for row in stored_rows(folder) if row.cell.table == table]
  sweep = docs_sweep(family)
  if not stored or table in sweep.shared:  # runs recorded under other tables (d4rl's table4_shared): by the plan
    from experiments.engine.aggregate import aggregate

    stored = [row for row in aggregate(sweep, folder) if row.cell.table == table and row.n]
  rows = [row for row in stored if wanted <= dict(row.cell.labels).items()]
  if not rows and wanted:
    where = ", ".join(f"{k} {v!r}" for k, v in wanted)
    raise ValueError(f"no finished run of table {table!r} in {where} ({folder / 'runs'})")
  if not rows:
    raise ValueError(f"no finished runs of table {table!r} in {folder / 'runs'}")
  rank = {name: i for i, name in enumerate(order)}
  return note_rows(sorted(rows, key=lambda row: rank.get(dict(row.cell.labels).get("model"), len(rank))))


def _setting(labels: dict, skip: Sequence[str], default: str = "-") -> str:
  return ", ".join(f"{k} {v}" for k, v in labels.items() if k not in skip) or default


def run_device(run_dir: Path) -> str:
  """The accelerator a run trained on: its summary's `devices` (recorded since 2026-11-26), else the
  `provenance.json` written beside runs made in a lent device call before that (`records.run_origin`), else this
  project's 2-core CPU (where every earlier run was made)."""
  if devices := run_origin(run_dir).devices:
    return "CPU" if devices["platform"] == "cpu" else devices["kind"].removeprefix("NVIDIA ")
  return "CPU"


def ran_on(row) -> str:
  """'CPU', 'H200' or 'CPU 1, H200 2': where the row's seeds ran (wall times differ by machine)."""
  counts: dict[str, int] = {}
  for source in row.sources:
    device = run_device(Path(source))
    counts[device] = counts.get(device, 0) + 1
  if not counts:  # no run of the row counts
    return "-"
  return next(iter(counts)) if len(counts) == 1 else ", ".join(f"{d} {n}" for d, n in sorted(counts.items()))


def params(row) -> str:
  """The row's trained parameter count (summary `num_params`), '1,234' or 'a-b' where its runs differ, '-' where
  no counted run recorded one: tables show it beside each score, so a comparison of unequal sizes is visible."""
  counts = set()
  for source in row.sources:
    path = Path(source) / "summary.json"
    if path.exists() and (count := read_json(path, "a run's summary").get("num_params")) is not None:
      counts.add(int(count))
  if not counts:
    return "-"
  return f"{min(counts):,}" if len(counts) == 1 else f"{min(counts):,}-{max(counts):,}"


def _commits(origins) -> str:
  commits = sorted({origin.commit[:7] for origin in origins})
  return ", ".join(commits) if len(commits) <= 2 else f"{len(commits)} commits"


def provenance(row) -> str:
  """Which code the row's counted runs name: their short commit(s) ('3 commits' beyond two) where every record
  names a commit and a clean tree, 'rerun: <commit>' for the runs counted from a clean rerun
  (`records.record_dir`); otherwise how many are 'legacy, no commit' or from a 'dirty' tree (a tree state not
  recorded counts as dirty), and how many are reruns."""
  origins = [(run_origin(source), is_rerun(source)) for source in row.sources]
  if not origins:
    return "-"
  n = len(origins)
  legacy = sum(origin.commit is None for origin, _ in origins)
  dirty = sum(origin.commit is not None and not origin.clean for origin, _ in origins)
  reruns = [origin for origin, rerun in origins if rerun]
  if legacy or dirty:
    parts = [f"legacy, no commit: {legacy} of {n}"] * bool(legacy) + [f"dirty tree: {dirty} of {n}"] * bool(dirty)
    return "; ".join(parts + [f"rerun: {len(reruns)} of {n}"] * bool(reruns))
  own = [origin for origin, rerun in origins if not rerun]
  return "; ".join([_commits(own)] * bool(own) + [f"rerun: {_commits(reruns)}"] * bool(reruns))


def _paper(row) -> str:
  return "-" if row.cell.paper is None else f"{row.cell.paper:.1f}"


def d4rl_sweep(table: str, base: Path) -> str:
  """One offline-RL table: the paper's score (D4RL data), ours (embedded data) and the dataset's own score.
  `<table>:<env>` shows that environment's rows alone."""
  table, _, env = table.partition(":")
  datasets = read_json(common.RESULTS / "d4rl" / "datasets.json", "the datasets' record")
  rows = _rows("d4rl", table, labels={"env": env} if env else None)
  body = []
  for row in sorted(rows, key=lambda row: row.cell.labels):
    labels = dict(row.cell.labels)
    data = datasets[f"{labels['env']}-{labels['dataset']}-v4-n100000-s0"]
    setting = _setting(labels, ("env", "dataset", "model"), default="release")
    body.append([labels["env"], labels["dataset"], labels["model"], setting, f"{data['normalized_score']:.1f}"])
    body[-1] += [params(row), _paper(row), mean_std(row), ksvd_ratio(row), _per_run(row), ran_on(row)]
    body[-1].append(provenance(row))
  header = ["env", "dataset", "model", "setting", "dataset mean", "params", "paper (D4RL)", "ours (embedded)"]
  return markdown.table(header + [KSVD_RATIO, "time/run", "ran on", "code"], body, numeric_from=4)


def converged(row) -> str:
  """Whether the row's runs converged (`experiments.engine.convergence`) from their summaries' validation curves;
  where a run has none (records before 2026-12-06), the best validation steps of the runs ('no curve; best at
  3,000 of 3,000')."""
  from experiments.engine.convergence import convergence, describe

  paths = [Path(source) / "summary.json" for source in row.sources]
  summaries = [read_json(path, "a run's summary") for path in paths if path.exists()]
  if not summaries:
    return "-"
  why = "no curve"
  if all(summary.get("validation_curve") for summary in summaries):
    try:
      return describe([convergence(summary["validation_curve"]) for summary in summaries])
    except ValueError:  # a curve too short to judge a plateau on (two evaluations: `short` ListOps, Image)
      why = "too few evaluations to judge"
  best = sorted({(s["best_validation"]["step"], s["steps"]) for s in summaries if "best_validation" in s})
  return f"{why}; best at " + ", ".join(f"{b:,} of {n:,}" for b, n in best) if best else "-"


def vit_sweep(table: str, base: Path) -> str:
  """One vision table: top-1 test accuracy (%) on Fashion-MNIST beside the paper's ImageNet-100 top-1."""
  body = []
  for row in _rows("vit", table, ("DeiT", "Primal.+DeiT")):
    labels = dict(row.cell.labels)
    body.append([labels["model"], _setting(labels, ("dataset", "model")), params(row), _paper(row)])
    body[-1] += [mean_std(row), ksvd_ratio(row), converged(row), _per_run(row), ran_on(row), provenance(row)]
  header = ["model", "setting", "params", "paper (ImageNet-100 top-1)", "ours (Fashion-MNIST top-1)", KSVD_RATIO]
  header += ["converged", "time/run", "ran on", "code"]
  return markdown.table(header, body, numeric_from=2)


def lra_sweep(table: str, base: Path) -> str:
  """One Table 2 task of experiments/sweeps/lra.py: test accuracy (%) at the best validation evaluation of the
  `short` runs (`listops_release`: the release's schedule, the header says which), beside the paper's converged
  number (its Image column is CIFAR-10), in the paper's column order."""
  from experiments.engine.spec import load_sweep

  order = ("Trans.", "Reformer", "Performer", "Linformer", "Nystromformer", "Longformer", "YOSO-E", "PrimalFormer")
  sweep = load_sweep(SWEEPS / "lra.py")
  body = []
  for row in _rows("lra", table, (*order, "Primal.+Trans.")):
    labels = dict(row.cell.labels)
    body.append([labels["dataset"], labels["model"], params(row), _paper(row), mean_std(row), ksvd_ratio(row)])
    body[-1] += [learned_seeds(sweep, row), converged(row), _per_run(row), ran_on(row), provenance(row)]
  release = table in {run.cell.table for run in sweep.runs if ",short" not in run.config}  # no `short`: the release's
  steps = {dict(run.cell.labels).get("steps") for run in sweep.runs if run.cell.table == table} - {None}
  schedule = "the release's schedule" if release else (f"{', '.join(sorted(steps))} steps" if steps else "`short`")
  header = ["task", "model", "params", "paper (Table 2)", f"ours ({schedule}, test at best validation)", KSVD_RATIO]
  header += ["learned", "converged", "time/run", "ran on", "code"]
  return markdown.table(header, body, numeric_from=2)


def learned_seeds(sweep, row) -> str:
  """'3 of 3' seeds that learned (`experiments.engine.paired.learned`: best validation accuracy above the table's
  chance level + the sweep's margin), with the learning rate(s) the runs tried where not every seed learned: such a
  row takes part in no verdict. '-' where the table sets no chance level."""
  from experiments.engine.paired import learned

  flags = learned(sweep, row)
  if flags is None:
    return "-"
  text = f"{sum(flags.values())} of {len(flags)}"
  if all(flags.values()):
    return text
  rates = set()
  for source in row.sources:
    record = read_json(Path(source) / "result.json", "a run's record")
    rate = (record.get("config") or {}).get("optimizer", {}).get("learning_rate")
    rates.add("not recorded" if rate is None else f"{rate:g}")
  lr = ", ".join(sorted(rates))
  return f"{text}: did not learn at the rate tried (lr {lr})" if not any(flags.values()) else f"{text} at lr {lr}"


def training_tokens_per_second(run_dir: Path) -> float:
  """Median training throughput of a run in tokens per second, from its metrics.jsonl and config.json.

  Uses the intervals between consecutive logged training steps, leaving out the first (it includes
  compilation) and any interval with an evaluation in it; tokens per step = batch_size * seq_len.
  """
  config = read_json(run_dir / "config.json", "a run's config")
  tokens_per_step = int(config["data"]["batch_size"]) * int(config["data"]["seq_len"])
  records = []
  for number, line in enumerate((run_dir / "metrics.jsonl").read_text().splitlines(), 1):
    try:
      records += [json.loads(line)] if line.strip() else []
    except json.JSONDecodeError as err:
      raise DamagedFileError(f"{run_dir / 'metrics.jsonl'}, line {number}, is damaged ({err})") from None
  rates, previous = [], None
  for record in records:
    if record["prefix"] != "train":
      previous = None  # an evaluation ran since the previous training record
      continue
    if previous is not None and record["step"] > previous["step"]:
      seconds = record["wall_time"] - previous["wall_time"]
      rates.append((record["step"] - previous["step"]) * tokens_per_step / seconds)
    previous = record
  if len(rates) < 2:
    raise ValueError(f"{run_dir / 'metrics.jsonl'}: too few logged training intervals for a throughput")
  return float(np.median(rates[1:]))


def lm_sweep(table: str, base: Path) -> str:
  """One language-modelling table: test bits per byte beside the WikiText-103 test perplexity that the release's
  README reports (word level, a different scale: direction only; the paper has no language-modelling
  experiment). The runs' own throughput is not shown: they ran on different machines beside other jobs
  (`lm_throughput` measures it side by side)."""
  body = []
  from experiments.sweeps.lm import MODELS

  for row in _rows("lm", table, [label for label, _, _ in MODELS]):
    labels = dict(row.cell.labels)
    body.append([labels["model"], _setting(labels, ("model",)), params(row), _paper(row)])
    body[-1] += [mean_std(row, digits=3), ksvd_ratio(row), _per_run(row), ran_on(row), provenance(row)]
  header = ["model", "setting", "params", "release README (WikiText-103 ppl)", "ours (test bits/byte)", KSVD_RATIO]
  header += ["time/run", "ran on", "code"]
  return markdown.table(header, body, numeric_from=2)


def lm_eta(base: Path) -> str:
  """The eta table of experiments/sweeps/lm.py (`eta_table`): its eta 0 and release rows are the eta0 and enwiki
  tables' runs (the same configs), recorded only there."""
  from experiments.engine.spec import load_sweep

  def source(model: str, eta: str):
    if eta == "0":
      return "eta0", (("model", model), ("eta", "0.0"))
    return ("enwiki", (("model", model),)) if "release" in eta else None

  sweep = load_sweep(SWEEPS / "lm.py")
  table = eta_table(sweep_folder("lm"), sweep, source, "test bits/byte", digits=3)
  calibration = []
  for model in ("primal_plus", "primalformer"):  # the 2-step runs the calibrated etas were read from
    path = common.RESULTS / "lm" / "eta_calibration" / model / "summary.json"
    start = read_json(path, "an eta calibration run's summary")["ksvd_ratio"]["start"]
    calibration.append(f"{model} {start['ratio']:.2g} at eta {start['eta']:g} ({link(path, base, 'summary.json')})")
  return f"{table}\n\neta x KSVD / task at step 1 in the 2-step calibration runs: {'; '.join(calibration)}."


def eta_table(folder: Path, sweep, source, value: str, digits: int = 1) -> str:
  """A sweep's `eta` table (cells labelled model and eta): the value over seeds, eta x KSVD / task at step 1 and
  at the last step, and the paired difference against eta = 0 of the same model (`sweep.baselines["eta"]`).

  `source(model, eta)` names the (table, labels) whose finished runs stand for that row (the same configs,
  trained for another table before this one existed and recorded only there), or None for the eta table's own
  records; a sourced row ignores the eta table's own records of it, so no run counts twice."""

  from experiments.engine.aggregate import stored_rows
  from experiments.engine.paired import comparisons, paired_note, paired_table
  from experiments.engine.spec import Cell
  from experiments.tables.text_plot import forest_table

  planned = [r for r in sweep.runs if r.cell.table == "eta"]
  protocol, full = planned[0].protocol, len({r.seed for r in planned})
  stored = {(row.cell.table, row.cell.labels): row for row in stored_rows(folder) if row.protocol == protocol}
  rows = {}
  for cell in dict.fromkeys(r.cell for r in planned):
    labels = dict(cell.labels)
    found = stored.get(source(labels["model"], labels["eta"]) or ("eta", cell.labels))
    if found is not None:
      rows[cell.labels] = dataclasses.replace(found, cell=Cell("eta", cell.labels))
  if not rows:
    raise ValueError(f"no finished eta runs in {folder / 'runs'}")
  note_rows(rows.values())
  body = []
  for labels, row in rows.items():
    start, end = mean_ratio(row, "start"), mean_ratio(row, "end")
    body.append([*dict(labels).values(), mean_std(row, digits=digits, full=full), start, end])
  header = ["model", "eta", value, "eta x KSVD / task, step 1", "at the last step"]
  means = markdown.table(header, body, numeric_from=2)
  paired = paired_table(sweep, list(rows.values()), "eta")
  forest = forest_table(comparisons(sweep, list(rows.values()), "eta"), sweep.digits, "0")  # the same rows' plot
  text = f"{means}\n\nPaired differences by seed against eta = 0 of the same model:\n\n{paired}\n\n{paired_note(sweep)}"
  return f"{text}\n\n{forest}"


def lm_throughput(name: str, base: Path) -> str:
  """Training tokens/s of the LM models measured one after another on one machine, nothing else running:
  `experiments/results/lm/<name>/<model>/` are short runs of the same config (see docs/results.md)."""
  from experiments.sweeps.lm import MODELS

  folder = common.RESULTS / "lm" / name
  body, reference = [], None
  for label, model, _ in MODELS:
    run_dir = folder / model
    if not (run_dir / "metrics.jsonl").exists():
      continue
    rate = training_tokens_per_second(run_dir)
    reference = reference or rate
    summary = read_json(run_dir / "summary.json", "a run's summary")
    body.append([label, f"{rate:,.0f}", f"{rate / reference:.2f}", run_device(run_dir), summary["host_allocator"]])
  if not body:
    raise ValueError(f"no throughput runs in {folder}")
  return markdown.table(["model", "train tokens/s", "vs softmax", "device", "allocator"], body)


# Families whose sweep records sit under another folder name (experiments/sweeps/uea.py writes uea_table1/).
RECORD_FOLDERS = {"uea": "uea_table1"}


def sweep_folder(family: str) -> Path:
  """A family's sweep directory: experiments/results/<family>/sweep, or experiments/results/<family> itself where
  its runs sit there (uea, under its `RECORD_FOLDERS` name)."""
  folder = common.RESULTS / RECORD_FOLDERS.get(family, family)
  return folder / "sweep" if (folder / "sweep").is_dir() else folder
