"""The docs tables of the UEA sweep (experiments/results/uea_table1/runs/*/result.json), the LRA records
(experiments/results/lra*/), the spectra (experiments/results/spectrum_<name>/) and the LRA parameter counts
(from the model code, `experiments.lra_params`)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

from experiments.engine import stats
from experiments.tables import common
from experiments.tables.common import link, minutes, pct
from experiments.tables.ksvd_ratio import KSVD_RATIO, ksvd_ratio
from experiments.tables.sweeps import mean_std, params
from primal_jax import markdown
from primal_jax.atomic_files import read_json

# Paper Table 2 (LRA test accuracy, %): task -> model -> accuracy. Image is CIFAR-10 there.
PAPER_TABLE2 = {
  "listops": {"softmax": 37.1, "primalformer": 37.3, "primal_plus": 37.3},
  "text": {"softmax": 65.0, "primalformer": 61.2, "primal_plus": 65.4},
  "retrieval": {"softmax": 79.4, "primalformer": 77.8, "primal_plus": 81.0},
  "image": {"softmax": 38.2, "primalformer": 43.0, "primal_plus": 43.9},
  "pathfinder": {"softmax": 74.2, "primalformer": 68.3, "primal_plus": 74.3},
}
MODEL_NAMES = {"softmax": "Trans. (softmax)", "primalformer": "PrimalFormer", "primal_plus": "Primal.+Trans."}
# --- UEA (the sweep's run records, experiments/results/uea_table1/)

TABLE1_DIR = "uea_table1"  # the UEA sweep's runs (experiments/sweeps/uea.py), with provenance


UEA_DOCS_ARG = "table1_seeds=10"  # the grid the docs show: Table 1's three models at 10 seeds on JapaneseVowels


def uea_sweep():
  from experiments.engine.spec import load_sweep

  return load_sweep(f"{Path(__file__).resolve().parents[1] / 'sweeps' / 'uea.py'}:{UEA_DOCS_ARG}")


def _planned_rows(table: str):
  """The sweep, its runs of `table` and their finished rows, looked up by the sweep's plan rather than by the
  cells their records name: a config shared by two tables was trained once, for the table listed first, and its
  record names only the tables planned then."""
  import dataclasses

  from experiments.engine.aggregate import aggregate

  sweep = uea_sweep()
  folder = common.RESULTS / TABLE1_DIR
  mine = dataclasses.replace(sweep, runs=tuple(r for r in sweep.runs if r.cell.table == table))
  rows = [row for row in aggregate(mine, folder) if row.n]
  if not rows:
    raise ValueError(f"no finished {table} runs in {folder / 'runs'}")
  return sweep, mine, common.note_rows(rows)


_RATIO_HEADERS = (f"{KSVD_RATIO}, honest", "release")


def _uea_ablation(table: str, columns: Sequence[str]) -> str:
  """An ablation table of the UEA sweep (table6, table8): mean ± std per protocol, then the paired differences
  against its baseline row (`BASELINES` of experiments/sweeps/uea.py); runs found by `_planned_rows`."""
  from experiments.engine.paired import paired_note, paired_table

  sweep, mine, rows = _planned_rows(table)
  full = len({r.seed for r in mine.runs})
  by_cell = {(row.cell, row.protocol): row for row in rows}
  body = []
  for cell in dict.fromkeys(r.cell for r in mine.runs):
    honest, release = by_cell.get((cell, "honest")), by_cell.get((cell, "release"))
    paper = "-" if cell.paper is None else f"{cell.paper:.1f}"
    body.append([*dict(cell.labels).values(), paper, mean_std(honest, full=full), mean_std(release, full=full)])
    body[-1] += [ksvd_ratio(honest), ksvd_ratio(release)]
  header = [*columns, "paper", "ours, honest protocol", "ours, release protocol", *_RATIO_HEADERS]
  means = markdown.table(header, body, numeric_from=len(columns))
  column, value = sweep.baselines[table]
  paired = paired_table(sweep, rows, table)
  if not paired:
    return f"{means}\n\nNo row is paired with its {column} = {value} row yet."
  return f"{means}\n\nPaired differences by seed against {column} = {value}:\n\n{paired}\n\n{paired_note(sweep)}"


def uea_table1_all(base: Path) -> str:
  """Paper Table 1 with every mechanism (table1_all): mean ± std over seeds per protocol, then the paired
  differences by seed against Trans. of the same dataset and protocol (verdicts: experiments.engine.paired)."""
  from experiments.engine.paired import paired_note, paired_table

  sweep, mine, found = _planned_rows("table1_all")
  full = len({r.seed for r in mine.runs})  # the most seeds a row is planned with; each row says its own
  rows = {(row.cell.labels, row.protocol): row for row in found}
  body = []
  for cell in dict.fromkeys(r.cell for r in mine.runs):
    labels = dict(cell.labels)
    honest, release = rows.get((cell.labels, "honest")), rows.get((cell.labels, "release"))
    paper = "-" if cell.paper is None else f"{cell.paper:.1f}"
    honest_text, release_text = (mean_std(r, full=r.planned if r else full) for r in (honest, release))
    body.append([labels["dataset"], labels["model"], params(honest or release), paper, honest_text, release_text])
    body[-1] += [ksvd_ratio(honest), ksvd_ratio(release)]
  header = ["dataset", "model", "params", "paper", "ours, honest protocol", "ours, release protocol", *_RATIO_HEADERS]
  means = markdown.table(header, body, numeric_from=2)
  paired = paired_table(sweep, found, "table1_all")
  return f"{means}\n\nPaired differences by seed against Trans.:\n\n{paired}\n\n{paired_note(sweep)}"


def uea_eta(base: Path) -> str:
  """The eta table of experiments/sweeps/uea.py (`sweeps.eta_table`): its release-eta rows are table1_all's
  JapaneseVowels honest runs (the same configs), which runs made before the eta table existed record only there."""
  from experiments.tables.sweeps import eta_table

  def source(model: str, eta: str):
    return ("table1_all", (("dataset", "JapaneseVowels"), ("model", model))) if "release" in eta else None

  return eta_table(common.RESULTS / TABLE1_DIR, uea_sweep(), source, "test accuracy (%)")


def uea_table6(base: Path) -> str:
  return _uea_ablation("table6", ["s", "eta"])


def uea_table8(base: Path) -> str:
  return _uea_ablation("table8", ["model", "data-dependent W_e, W_r"])


# --- LRA


def _load(path: Path) -> dict:
  return read_json(path, "a result record")


def _seed(command: str) -> int:
  found = re.search(r"--config\.seed=(\d+)", command)
  return int(found.group(1)) if found else 0


def _at(entry: dict, key: str = "accuracy") -> str:
  return f"{pct(entry[key])} (step {entry['step']:,})"


def listops_paper(base: Path) -> str:
  files = sorted((common.RESULTS / "lra").glob("listops_primalformer_paper_schedule*.json"))
  body = []
  for path in sorted(files, key=lambda p: _seed(_load(p)["command"])):
    record = _load(path)
    wall = minutes(record["wall_s"]) if "wall_s" in record else "-"
    body.append(
      [
        link(path, base, f"seed {_seed(record['command'])}"),
        _at(record["test_at_best_validation"]),
        _at(record["final"], "test_accuracy"),
        _at(record["best_test"]),
        wall,
        f"{record['paper_test_accuracy']:.1f}",
      ]
    )
  header = ["run", "test at best validation", "test after the last step", "best test (picked on test)", "wall time"]
  return markdown.table([*header, "paper"], body)


def listops_paper_evaluations(base: Path) -> str:
  records = sorted(
    (_load(p) for p in (common.RESULTS / "lra").glob("listops_primalformer_paper_schedule*.json")),
    key=lambda r: _seed(r["command"]),
  )
  steps = sorted({e["step"] for r in records for e in r["evaluations"]})
  body = []
  for step in steps:
    row = [f"{step:,}"]
    for record in records:
      entry = next((e for e in record["evaluations"] if e["step"] == step), None)
      row.append("-" if entry is None else f"{pct(entry['validation/accuracy'])} / {pct(entry['test/accuracy'])}")
    body.append(row)
  return markdown.table(["step", *(f"seed {_seed(r['command'])}: validation / test" for r in records)], body)


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
    link(path, base, path.stem),
    _task(record),
    model,
    _data_label(_task(record), record["data"]),
    f"{record['steps']:,} x {schedule['batch_size']}, lr {schedule['learning_rate']:g}",
    _at(record["test_at_best_validation"]),
    minutes(record["wall_s"]),
  ]


def lra_short(base: Path) -> str:
  body = []
  for path in sorted((common.RESULTS / "lra_short").glob("*.json")):
    record = _load(path)
    paper = PAPER_TABLE2.get(_task(record), {}).get(record["model"])
    body.append([*_training_row(path, base, record), "-" if paper is None else f"{paper:.1f}"])
  header = ["record", "task", "model", "data", "steps x batch, lr", "test at best validation", "wall time", "paper"]
  return markdown.table(header, body, numeric_from=5)


def pathfinder_trials(base: Path) -> str:
  body = []
  for path in sorted((common.RESULTS / "lra_short" / "pathfinder_trials").glob("*.json")):
    record = _load(path)
    if "history" in record:  # experiments.pathfinder_learnability: a conv net, tested every 100 steps
      geometry = record["geometry"]
      data = _data_label("pathfinder", {"difficulty": "easy", **geometry})
      last = record["history"][-1]
      body.append(
        [
          link(path, base, path.stem),
          "pathfinder",
          "conv net",
          data,
          f"{record['steps']:,} x {record['batch_size']}, lr {record['learning_rate']:g}",
          f"{pct(last['test_accuracy'])} (step {last['step']:,}, last)",
          minutes(record["data_s"] + record["train_s"]),
        ]
      )
    else:
      body.append(_training_row(path, base, record))
  header = ["record", "task", "model", "data", "steps x batch, lr", "test accuracy", "wall time"]
  return markdown.table(header, body, numeric_from=5)


def lra_params(base: Path) -> str:
  from experiments import lra_params as params

  return params.table()


def spectrum(name: str, base: Path) -> str:
  path = common.RESULTS / f"spectrum_{name}" / "spectrum.json"
  record = _load(path)
  blocks = sorted({re.search(r"block_(\d+)", layer["name"]).group(1) for r in record["runs"] for layer in r["layers"]})
  body = []
  for run in record["runs"]:
    by_block = {re.search(r"block_(\d+)", layer["name"]).group(1): layer for layer in run["layers"]}
    seed = f" (seed {run['seed']})" if "seed" in run else ""  # recorded since runs form arms
    row = [run["label"] + seed, f"{run['step']:,}"]
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
    f"(mean length {length:,.1f}); {link(path, base, 'spectrum.json')}."
  )
  return markdown.table(header, body, numeric_from=1) + "\n\n" + caption


def _spread(stat: dict) -> str:
  """'mean ± std' over models (the mean alone for one model)."""
  return f"{stat['mean']:.2f}" if stat["std"] is None else f"{stat['mean']:.2f} ± {stat['std']:.2f}"


def holm_spectrum_entries(entries: list[dict], confidence: float) -> list[dict]:
  """Each stored paired entry of one spectrum table (n, mean, std of the per-seed differences arm - reference)
  with its paired t test's p, Holm's adjusted p over the table's entries (one family), the interval at its Holm
  step's level and the corrected verdict: "fewer" / "more" components where the adjusted p is <= 1 - confidence,
  "unresolved" otherwise (the records keep the raw 95% intervals; nothing is recomputed from the spectra)."""
  p_values = [stats.summary_p_value(e["n"], e["mean"], e["std"]) for e in entries]
  adjusted = stats.holm(p_values)
  levels = stats.holm_confidences(p_values, confidence)
  out = []
  for e, p, p_holm, level in zip(entries, p_values, adjusted, levels, strict=True):
    low, high = stats.summary_interval(e["n"], e["mean"], e["std"], level)
    verdict = ("fewer" if e["mean"] < 0 else "more") if p_holm <= 1 - confidence else "unresolved"
    out.append(e | {"p": p, "p_holm": float(p_holm), "holm_low": low, "holm_high": high, "holm_verdict": verdict})
  return out


def _difference(entry: dict | None) -> list[str]:
  """'+0.50 [-0.10, +1.10]' (the raw interval), the Holm interval and the corrected verdict of one paired entry;
  '-' where the layer was not paired."""
  if entry is None:
    return ["-", "-", "-"]
  mean, low, high = (markdown.fixed(entry[k], 2, "+") for k in ("mean", "low", "high"))
  if math.isnan(entry["holm_low"]):
    corrected = "-"
  else:
    corrected = f"[{markdown.fixed(entry['holm_low'], 2, '+')}, {markdown.fixed(entry['holm_high'], 2, '+')}]"
  return [f"{mean} [{low}, {high}]", corrected, entry["holm_verdict"]]


def spectrum_arms(name: str, base: Path) -> str:
  """`spectrum_arms:<name>`: experiments/results/spectrum_<name>/spectrum.json's arms (runs sharing a label), per
  layer the components for 90% / 99% of the energy as mean ± std over the arm's models, and each arm's paired
  difference by seed against each reference arm (`experiments.spectrum_arms`)."""
  path = common.RESULTS / f"spectrum_{name}" / "spectrum.json"
  record = _load(path)
  if "arms" not in record:
    raise ValueError(f"spectrum_arms:{name}: {path} has no arms section (written before arms); use spectrum:{name}")
  section = record["arms"]
  body = []
  for arm, blocks in section["summary"].items():
    for block, s in blocks.items():
      seeds = ", ".join("-" if seed is None else str(seed) for seed in s["seeds"])
      row = [arm, block, s["kind"], s["n"], seeds, _spread(s["components_90"]), _spread(s["components_99"])]
      body.append(row)
  header = ["arm", "layer", "kind", "models", "seeds", "90%: mean ± std", "99%: mean ± std"]
  text = markdown.table(header, body, aligns=["l", "l", "l", "r", "l", "r", "r"])
  over = f"each model's mean over {record['num_examples']} {record['split']} sequences"
  if not section["paired"]:
    why = "not paired (--nopaired)" if section["paired"] is None else "nothing paired (one arm, or no shared layer)"
    source = link(path, base, "spectrum.json")
    return f"{text}\n\nComponents for 90% / 99% of the energy ({over}), over the arm's models; {why}; {source}."
  corrected = holm_spectrum_entries(section["paired"], section["confidence"])
  found = {(p["arm"], p["reference"], p["layer"], p["stat"]): p for p in corrected}
  pairs = list(dict.fromkeys(key[:3] for key in found))
  rows = []
  for arm, reference, block in pairs:
    k90, k99 = (found.get((arm, reference, block, stat)) for stat in ("components_90", "components_99"))
    n = (k90 or k99)["n"]
    rows.append([arm, reference, block, n, *_difference(k90), *_difference(k99)])
  confidence = f"{100 * section['confidence']:g}%"
  header = ["arm", "vs", "layer", "pairs", f"90%: diff. [{confidence} CI]", "Holm CI", "verdict"]
  header += [f"99%: diff. [{confidence} CI]", "Holm CI", "verdict"]
  paired = markdown.table(header, rows, aligns=["l", "l", "l", "r", "r", "r", "l", "r", "r", "l"])
  caption = (
    f"Components for 90% / 99% of the energy ({over}): mean ± sample std over the arm's models, layers matched by "
    f"block. Differences arm - reference paired by seed with their Student-t {confidence} interval; the table's "
    f"{len(corrected)} comparisons (both energy levels) are one family, Holm-corrected (Holm CI: the interval at "
    f"the comparison's Holm step level): fewer / more where Holm's adjusted p is <= {1 - section['confidence']:.2g}, "
    f"unresolved otherwise; {link(path, base, 'spectrum.json')}."
  )
  return f"{text}\n\n{paired}\n\n{caption}"
