"""The uncertainty benchmark's docs tables and text plots (docs/uncertainty.md), from the run records of
experiments/sweeps/uncertainty.py committed in experiments/results/uncertainty/sweep/ (each run's uncertainty.json
and, in the first member's run directory, each deep ensemble's ensemble.json).

`uncertainty:<name>`:
  test            failure prediction and calibration on the test split, mean ± std over seeds, per method
  shift           the same under the corruptions: accuracy and ECE at each severity, mean over the five kinds
  ood             OOD detection of the 8 x 8 digits against the test split
  paired:<group>  paired differences by seed against softmax MSP of every metric of a group (test, shift, ood);
                  each metric's comparisons are one Holm family (`experiments.engine.paired.comparisons`)
  forest:<metric> the forest plot of one metric's paired differences (`experiments.tables.forest`)
  reliability, risk_coverage, severity   text plots (`experiments.tables.text_plot`)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from experiments.engine.paired import comparisons
from experiments.engine.rows import Cell, Row
from experiments.engine.spec import Sweep
from experiments.tables.common import RESULTS
from experiments.tables.forest import forest_table
from experiments.tables.text_plot import text_plot
from primal_jax import markdown
from primal_jax.atomic_files import read_json

FOLDER = RESULTS / "uncertainty" / "sweep"
PROTOCOL = "own_validation"
BASELINE = "Softmax (MSP)"
# (run kind, method) -> label, in the tables' order.
METHODS: Mapping[tuple[str, str], str] = {
  ("softmax", "msp"): BASELINE,
  ("softmax", "temperature"): "Temperature scaling",
  ("softmax", "mc_dropout"): "MC dropout",
  ("ensemble", "ensemble"): "Deep ensemble",
  ("primal_plus", "msp"): "Primal.+ViT (MSP)",
  ("kep_paper", "kep"): "KEP-SVGP, paper form",
  ("kep_release", "kep"): "KEP-SVGP, release form",
  ("kep_paper", "kep_logits"): "KEP-SVGP, paper form, mean logits",
  ("kep_release", "kep_logits"): "KEP-SVGP, release form, mean logits",
}
PLOTTED = {"M": BASELINE, "T": "Temperature scaling", "D": "MC dropout", "E": "Deep ensemble", "P": "Primal.+ViT (MSP)"}
PLOTTED |= {"K": "KEP-SVGP, paper form", "R": "KEP-SVGP, release form"}


@dataclasses.dataclass(frozen=True)
class Metric:
  key: str  # the record's name
  title: str
  scale: float  # shown as value x scale
  digits: int
  higher_is_better: bool


TEST_METRICS = (
  Metric("acc", "Acc. (%)", 100, 2, True),
  Metric("aurc", "AURC (x1e3)", 1000, 1, False),
  Metric("eaurc", "E-AURC (x1e3)", 1000, 1, False),
  Metric("auroc", "AUROC (%)", 100, 2, True),
  Metric("aupr_success", "AUPR-S (%)", 100, 2, True),
  Metric("aupr_err", "AUPR-E (%)", 100, 2, True),
  Metric("fpr95", "FPR95 (%)", 100, 2, False),
  Metric("ece", "ECE (%)", 100, 2, False),
  Metric("nll", "NLL", 1, 3, False),
  Metric("brier", "Brier", 1, 3, False),
)
SHIFT_METRICS = (
  Metric("acc", "Acc. (%)", 100, 2, True),
  Metric("ece", "ECE (%)", 100, 2, False),
  Metric("nll", "NLL", 1, 3, False),
  Metric("auroc", "AUROC (%)", 100, 2, True),
  Metric("aurc", "AURC (x1e3)", 1000, 1, False),
)
OOD_METRICS = (
  Metric("auroc", "AUROC (%)", 100, 2, True),
  Metric("aupr_in", "AUPR-in (%)", 100, 2, True),
  Metric("aupr_out", "AUPR-out (%)", 100, 2, True),
  Metric("fpr95", "FPR95 (%)", 100, 2, False),
)
GROUPS = {"test": TEST_METRICS, "shift": SHIFT_METRICS, "ood": OOD_METRICS}


def load(folder: Path = FOLDER) -> dict[str, dict[int, dict]]:
  """label -> seed -> the method's record ({"test", "corruptions", "ood"}), from every run's uncertainty.json and
  every ensemble.json (seed: its first member's)."""
  found: dict[str, dict[int, dict]] = {}
  for path in sorted(folder.glob("runs/*/uncertainty.json")):
    record = read_json(path, "a run's uncertainty evaluation")
    for method, value in record["methods"].items():
      found.setdefault(METHODS[(record["kind"], method)], {})[record["seed"]] = value
  for path in sorted(folder.glob("runs/*/ensemble.json")):
    record = read_json(path, "an ensemble's uncertainty evaluation")
    found.setdefault(METHODS[("ensemble", "ensemble")], {})[record["members"][0]] = record["methods"]["ensemble"]
  if not found:
    raise ValueError(f"no uncertainty.json under {folder / 'runs'}: run experiments/sweeps/uncertainty.py first")
  return {label: dict(sorted(found[label].items())) for label in METHODS.values() if label in found}


def shift_value(record: dict, key: str, severity: int | None = None) -> float:
  """A metric's mean over the corruption kinds (at one severity, or over all five)."""
  values = [
    by_severity[str(s)][key]
    for by_severity in record["corruptions"].values()
    for s in ([severity] if severity else range(1, 6))
  ]
  return float(np.mean(values))


def value(record: dict, group: str, key: str) -> float:
  if group == "test":
    return record["test"][key]
  if group == "shift":
    return shift_value(record, key)
  return record["ood"][key]


def rows(records: Mapping[str, Mapping[int, dict]], group: str, metric: Metric) -> list[Row]:
  """One `Row` per method (values x metric.scale by seed), the table the engine's paired comparisons read."""
  out = []
  for label, by_seed in records.items():
    seeds = tuple(by_seed)
    values = tuple(metric.scale * value(by_seed[s], group, metric.key) for s in seeds)
    out.append(Row(Cell(metric.key, (("method", label),)), PROTOCOL, values, len(seeds), (), seeds=seeds))
  return out


def _mean_std(values, digits: int) -> str:
  if not values:
    return "-"
  mean = markdown.fixed(float(np.mean(values)), digits)
  return mean if len(values) < 2 else f"{mean} ± {markdown.fixed(float(np.std(values, ddof=1)), digits)}"


def source_line(folder: Path = FOLDER) -> str:
  """Where the numbers come from: the evaluation records, the commits that wrote them and their settings."""
  paths = sorted(folder.glob("runs/*/uncertainty.json")) + sorted(folder.glob("runs/*/ensemble.json"))
  records = [read_json(path, "an uncertainty evaluation") for path in paths]
  commits = sorted({r["provenance"]["commit"][:7] + (" (dirty)" if r["provenance"]["dirty"] else "") for r in records})
  settings = sorted({tuple(sorted(r["settings"].items())) for r in records})
  shown = "; ".join(", ".join(f"{k} {v}" for k, v in s) for s in settings)
  return (
    f"From {len(records)} evaluation records ({len(paths) - len(list(folder.glob('runs/*/ensemble.json')))} runs, "
    f"{len(list(folder.glob('runs/*/ensemble.json')))} ensembles) of commit {', '.join(commits)}; settings: {shown}."
  )


def metric_table(group: str, folder: Path = FOLDER) -> str:
  """Methods x the group's metrics, mean ± sample std over seeds (n seeds per method)."""
  records, metrics = load(folder), GROUPS[group]
  body = []
  for label, by_seed in records.items():
    cells = [_mean_std([m.scale * value(r, group, m.key) for r in by_seed.values()], m.digits) for m in metrics]
    body.append([label, len(by_seed), *cells])
  table = markdown.table(["method", "seeds", *(m.title for m in metrics)], body, numeric_from=1)
  return table if group != "test" else table + "\n\n" + source_line(folder)


def _comparisons(records, group: str, metric: Metric):
  """The comparisons of one metric against softmax MSP: one Holm family over the issue's methods (the "mean logits"
  rows, the authors' prediction from the same draws, are shown in the metric tables but not tested)."""
  records = {label: by_seed for label, by_seed in records.items() if not label.endswith("mean logits")}
  sweep = Sweep(
    (), baselines={metric.key: ("method", BASELINE)}, higher_is_better=metric.higher_is_better, digits=metric.digits
  )
  return comparisons(sweep, rows(records, group, metric), metric.key)


def paired_table(group: str, folder: Path = FOLDER) -> str:
  """Every method minus softmax MSP by seed for each metric of `group`: mean difference, raw 95% and
  Holm-corrected intervals, Holm's p and the verdict; one Holm family per metric."""
  records, body = load(folder), []
  for metric in GROUPS[group]:
    for c in _comparisons(records, group, metric):
      p, holm, d = c.paired, c.corrected or c.paired, metric.digits

      def interval(x, d=d):
        return "-" if math.isnan(x.low) else f"[{markdown.fixed(x.low, d, '+')}, {markdown.fixed(x.high, d, '+')}]"

      p_holm = "-" if math.isnan(c.p_holm) else f"{c.p_holm:.3f}"
      mean = "-" if math.isnan(p.mean) else markdown.fixed(p.mean, d, "+")
      body.append([metric.title, dict(c.row.cell.labels)["method"], p.n, mean, interval(p), interval(holm), p_holm])
      body[-1].append(c.verdict)
  header = ["metric", "method", "pairs", "mean diff.", "95% CI", "Holm CI", "p (Holm)", "verdict"]
  return markdown.table(header, body, aligns=["l", "l"] + ["r"] * 5 + ["l"])


def forest(arg: str, folder: Path = FOLDER) -> str:
  """`forest:<group>:<metric>`: the forest plot of one metric's paired differences against softmax MSP."""
  group, _, key = arg.partition(":")
  metric = next((m for m in GROUPS.get(group, ()) if m.key == key), None)
  if metric is None:
    raise ValueError(f"uncertainty:forest:{arg}: name a group ({', '.join(GROUPS)}) and one of its metrics")
  return forest_table(_comparisons(load(folder), group, metric), metric.digits, "MSP")


def shift_table(folder: Path = FOLDER) -> str:
  """Accuracy and ECE (%) at each severity, mean over the corruption kinds and the seeds; clean = the test split."""
  records = load(folder)
  header = ["method", *(f"{name} {s}" for name in ("acc", "ECE") for s in ("clean", 1, 2, 3, 4, 5))]
  body = []
  for label, by_seed in records.items():
    cells = []
    for key in ("acc", "ece"):
      cells.append(f"{100 * np.mean([r['test'][key] for r in by_seed.values()]):.1f}")
      cells += [f"{100 * np.mean([shift_value(r, key, s) for r in by_seed.values()]):.1f}" for s in range(1, 6)]
    body.append([label, *cells])
  return markdown.table(header, body, numeric_from=1)


def _legend(keys) -> str:
  return "; ".join(f"{k} {PLOTTED[k]}" for k in keys)


PANELS = ("MTDE", "MPKR")  # the softmax model's methods; the baseline beside the other models


def _fenced(series: dict, draw) -> str:
  """Two panels (`PANELS`) of `draw(series subset) -> lines`, side by side in one fenced block, and the key."""
  panels = [draw({k: series[k] for k in keys if k in series}) for keys in PANELS]
  width = max(len(line) for line in panels[0])
  height = max(len(p) for p in panels)
  rows = [
    (panels[0][i] if i < len(panels[0]) else "").ljust(width) + "   " + (panels[1][i] if i < len(panels[1]) else "")
    for i in range(height)
  ]
  key = f"Key: {_legend(k for k in PLOTTED if k in series)}; * two or more on one cell. Left: the softmax "
  key += "model's methods; right: softmax MSP beside the other models."
  return "\n".join(["```text", *(r.rstrip() for r in rows), "```", "", key])


def reliability_plot(folder: Path = FOLDER) -> str:
  """Accuracy against mean confidence per bin (15 bins, pooled over seeds by count), '.' the diagonal."""
  records, series = load(folder), {}
  for key, label in PLOTTED.items():
    if label not in records:
      continue
    bins = [r["test"]["reliability"] for r in records[label].values()]
    count = np.sum([b["count"] for b in bins], axis=0)
    points = []
    for i in np.flatnonzero(count):
      weights = [b["count"][i] for b in bins]
      acc = sum(w * b["accuracy"][i] for w, b in zip(weights, bins, strict=True) if w) / count[i]
      conf = sum(w * b["confidence"][i] for w, b in zip(weights, bins, strict=True) if w) / count[i]
      points.append((conf, acc))
    series[key] = points
  return _fenced(
    series,
    lambda part: text_plot(
      part, x_range=(0.0, 1.0), y_range=(0.0, 1.0), width=40, diagonal=True, x_label="confidence", y_label="acc"
    ),
  )


def risk_coverage_plot(folder: Path = FOLDER) -> str:
  """Selective risk (error rate among the most confident) against coverage, mean over seeds."""
  records, series = load(folder), {}
  for key, label in PLOTTED.items():
    if label in records:
      curves = [r["test"]["risk_coverage"] for r in records[label].values()]
      risk = np.mean([c["risk"] for c in curves], axis=0)
      series[key] = list(zip(curves[0]["coverage"], risk, strict=True))
  top = max(max(y for _, y in points) for points in series.values())
  return _fenced(
    series,
    lambda part: text_plot(
      part, x_range=(0.0, 1.0), y_range=(0.0, top), width=40, x_label="coverage", y_label="risk", digits=3
    ),
  )


def severity_plot(folder: Path = FOLDER) -> str:
  """ECE (%) against corruption severity (0 = the clean test split), mean over kinds and seeds."""
  records, series = load(folder), {}
  for key, label in PLOTTED.items():
    if label in records:
      by_seed = records[label].values()
      clean = 100 * np.mean([r["test"]["ece"] for r in by_seed])
      series[key] = [(0, clean)] + [
        (s, 100 * np.mean([shift_value(r, "ece", s) for r in by_seed])) for s in range(1, 6)
      ]
  top = max(max(y for _, y in points) for points in series.values())
  return _fenced(
    series,
    lambda part: text_plot(
      part, x_range=(0, 5), y_range=(0.0, top), width=36, x_label="severity", y_label="ECE (%)", digits=1
    ),
  )


def docs_table(arg: str, base: Path) -> str:
  """`uncertainty:<name>` (module doc)."""
  del base
  kind, _, rest = arg.partition(":")
  if kind in GROUPS and not rest and kind != "shift":
    return metric_table(kind, FOLDER)
  if kind == "shift" and not rest:
    return metric_table("shift", FOLDER) + "\n\n" + shift_table(FOLDER)
  if kind == "paired" and rest in GROUPS:
    return paired_table(rest, FOLDER)
  if kind == "forest" and rest:
    return forest(rest, FOLDER)
  plots = {"reliability": reliability_plot, "risk_coverage": risk_coverage_plot, "severity": severity_plot}
  if kind in plots and not rest:
    return plots[kind](FOLDER)
  raise ValueError(
    f"unknown table uncertainty:{arg}; known: {', '.join(GROUPS)}, paired:<group>, forest:<group>:<metric>, "
    + ", ".join(plots)
  )
