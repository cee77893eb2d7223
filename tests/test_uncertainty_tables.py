"""The uncertainty benchmark's docs tables and text plots (experiments/tables/uncertainty.py, text_plot.py), on run
records written by the family's own evaluation (`evaluate_model`, `write_record`) for known predictors."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest
from scipy import stats as scipy_stats

from experiments.engine import stats
from experiments.tables import uncertainty as tables
from experiments.tables.text_plot import text_plot
from primal_jax.tasks.uncertainty import evaluation

N, CLASSES = 120, 4


def _predictor(seed: int, sharpness: float):
  rng = np.random.default_rng(seed)
  logits = rng.normal(0, 1, (N + 20, CLASSES)) * sharpness

  def predict(images):
    return evaluation.softmax(logits[images[:, 0, 0, 0].astype(int)])

  return predict


def _sets(seed: int):
  rng = np.random.default_rng(100 + seed)
  images = np.arange(N, dtype=np.uint8).reshape(N, 1, 1, 1)
  labels = rng.integers(0, CLASSES, N)
  corrupted = {
    (kind, s): (images[: 40 + s], labels[: 40 + s]) for kind in ("contrast", "pixelate") for s in range(1, 6)
  }
  return evaluation.EvalSets((images, labels), corrupted, np.arange(N, N + 20, dtype=np.uint8).reshape(20, 1, 1, 1))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  root = tmp_path_factory.mktemp("unc")
  settings = evaluation.EvalSettings(risk_points=10)
  for seed in range(3):
    sets = _sets(seed)
    for kind, methods in evaluation.METHODS.items():
      record = {"kind": kind, "seed": seed, "settings": dataclasses.asdict(settings), "methods": {}}
      for i, method in enumerate(methods):
        record["methods"][method] = evaluation.evaluate_model(_predictor(seed, 1 + i + len(kind) / 4), sets, settings)
      evaluation.write_record(root / "runs" / f"{kind}{seed}" / evaluation.RECORD, record)
    ensemble = {
      "members": [seed, seed + 3],
      "settings": dataclasses.asdict(settings),
      "methods": {"ensemble": evaluation.evaluate_model(_predictor(seed, 0.5), sets, settings)},
    }
    evaluation.write_record(root / "runs" / f"softmax{seed}" / evaluation.ENSEMBLE_RECORD, ensemble)
  return root


def test_metric_table_is_mean_and_std_of_the_records(folder):
  records = tables.load(folder)
  assert list(records) == list(tables.METHODS.values())  # every method, in the tables' order
  ece = [100 * records["MC dropout"][s]["test"]["ece"] for s in range(3)]
  line = next(row for row in tables.metric_table("test", folder).splitlines() if row.startswith("| MC dropout |"))
  assert f"{np.mean(ece):.2f} ± {np.std(ece, ddof=1):.2f}" in line
  shift = np.mean(
    [
      r["corruptions"][k][str(s)]["acc"]
      for r in [records[tables.BASELINE][0]]
      for k in ("contrast", "pixelate")
      for s in range(1, 6)
    ]
  )
  assert tables.shift_value(records[tables.BASELINE][0], "acc") == pytest.approx(shift)
  assert tables.source_line(folder).startswith("From 15 evaluation records (12 runs, 3 ensembles) of commit ")


def test_evaluation_records_name_the_devices_they_ran_on(folder):
  record = json.loads((folder / "runs" / "softmax0" / evaluation.RECORD).read_text())
  assert record["provenance"]["devices"]["platform"] == jax.default_backend()


def test_paired_table_against_scipy_and_holm(folder, monkeypatch):
  monkeypatch.setattr(tables, "FOLDER", folder)
  records = tables.load(folder)
  base = [100 * records[tables.BASELINE][s]["ood"]["auroc"] for s in range(3)]
  others = [label for label in records if label != tables.BASELINE and not label.endswith("mean logits")]
  p_values, diffs = [], {}
  for label in others:
    values = [100 * records[label][s]["ood"]["auroc"] for s in range(3)]
    diffs[label] = np.subtract(values, base)
    p_values.append(scipy_stats.ttest_rel(values, base).pvalue)
  adjusted = dict(zip(others, stats.holm(p_values), strict=True))
  table = tables.paired_table("ood", folder)
  assert "mean logits" not in table  # shown in the metric tables, not a tested comparison
  for label in others:
    line = next(row for row in table.splitlines() if row.startswith(f"| AUROC (%) | {label} |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2] == "3" and float(cells[3]) == pytest.approx(np.mean(diffs[label]), abs=0.006)
    assert float(cells[6]) == pytest.approx(adjusted[label], abs=0.0006)
  assert "```text" in tables.docs_table("forest:ood:auroc", folder)


def test_plots_and_names(folder, monkeypatch):
  monkeypatch.setattr(tables, "FOLDER", folder)
  for name in ("reliability", "risk_coverage", "severity"):
    text = tables.docs_table(name, folder)
    assert text.startswith("```text") and "Key: M Softmax (MSP)" in text
  assert "acc clean" in tables.docs_table("shift", folder)
  with pytest.raises(ValueError, match="unknown table uncertainty:nope"):
    tables.docs_table("nope", folder)
  with pytest.raises(ValueError, match="no uncertainty.json"):
    tables.load(folder / "empty")


def test_text_plot_places_points():
  lines = text_plot(
    {"a": [(0.0, 0.0), (1.0, 1.0)], "b": [(1.0, 1.0), (0.5, float("nan"))]},
    x_range=(0, 1),
    y_range=(0, 1),
    width=5,
    height=3,
  )
  assert lines[0] == "1.00 |    *" and lines[2] == "0.00 |a    "  # a and b share (1, 1); nan left out
  with pytest.raises(ValueError, match="one character"):
    text_plot({"ab": []}, x_range=(0, 1), y_range=(0, 1))
