"""Uncertainty metrics (primal_jax.analysis.uncertainty) against the KEP-SVGP release's golden case `kep_metrics`.

The golden case is the authors' `CIFAR/utils/metrics.py` (scikit-learn 1.9.1, torch) on 200 fixed predictions with
tied confidences and confidences exactly on ECE bin edges; the README's suggested tolerances apply (1e-12 absolute
for the float64 metrics, 1e-6 relative for the float32 ECE and NLL).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

from primal_jax.analysis import uncertainty as U

REPO = Path(__file__).resolve().parents[1]
REFERENCE = Path(os.environ.get("PRIMAL_JAX_REFERENCE_DIR", REPO.parent / "shared" / "reference")) / "kep_svgp"
CASE = REFERENCE / "kep_metrics.npz"
needs_case = pytest.mark.skipif(not CASE.exists(), reason=f"golden case {CASE} not found")


@pytest.fixture(scope="module")
def golden():
  return dict(np.load(CASE))


@needs_case
def test_every_metric_matches_the_authors_code(golden):
  ours = U.uncertainty_metrics(golden["softmax"], golden["labels"], golden["logits"])
  assert ours["acc"] * 100 == pytest.approx(float(golden["acc"]), abs=1e-12)
  for key in ("aurc", "eaurc", "auroc", "aupr_success", "aupr_err", "fpr95", "brier"):
    assert abs(ours[key] - float(golden[key])) <= 1e-12, key
  for key in ("ece", "nll"):
    assert abs(ours[key] - float(golden[key])) <= 1e-6 * abs(float(golden[key])), key


@needs_case
def test_intermediate_curves_match(golden):
  conf, correct = U.confidence_and_correct(golden["softmax"], golden["labels"])
  np.testing.assert_array_equal(conf, golden["inter/confidence"])
  np.testing.assert_array_equal(correct, golden["inter/correct"].astype(bool))
  np.testing.assert_allclose(U.risk_curve(conf, correct), golden["inter/risk"], rtol=0, atol=1e-15)
  fpr, tpr = U.roc_curve(conf, correct)
  np.testing.assert_array_equal(fpr, golden["inter/roc_fpr"])
  np.testing.assert_array_equal(tpr, golden["inter/roc_tpr"])
  precision, recall = U.precision_recall_curve(correct, conf)
  np.testing.assert_allclose(precision, golden["inter/pr_precision"], rtol=0, atol=1e-15)
  np.testing.assert_array_equal(recall, golden["inter/pr_recall"])


@needs_case
def test_ece_bins_use_torch_linspace_edges(golden):
  edges = U.ece_bin_edges(15)
  np.testing.assert_array_equal(edges, golden["inter/ece_bin_edges"])
  # The naive float32(k / 15) edges differ (the README lists edges 3, 6, 7, 8, 9, 10); the golden ECE needs torch's.
  assert not np.array_equal(edges, (np.arange(16) / 15).astype(np.float32))
  conf, correct = U.confidence_and_correct(golden["softmax"], golden["labels"])
  bins = U.reliability_bins(conf, correct)
  np.testing.assert_array_equal(bins.count, golden["inter/ece_bin_count"])
  full = bins.count > 0
  np.testing.assert_allclose(bins.accuracy[full], golden["inter/ece_bin_acc"][full], rtol=1e-6)
  np.testing.assert_allclose(bins.confidence[full], golden["inter/ece_bin_conf"][full], rtol=1e-6)
  assert np.all(np.isnan(bins.accuracy[~full]))


def test_ece_edges_for_other_bin_counts_are_within_one_ulp_of_k_over_bins():
  for bins in (1, 2, 7, 10, 20):
    edges = U.ece_bin_edges(bins)
    exact = np.arange(bins + 1) / bins
    assert edges[0] == 0 and edges[-1] == 1 and np.all(np.diff(edges) > 0)
    assert np.all(np.abs(edges - exact) <= np.spacing(np.float32(1.0)))


def test_aurc_hand_computed_and_ties_in_index_order():
  conf = np.array([0.9, 0.8, 0.8, 0.6])
  correct = np.array([True, False, True, False])
  # Stable descending order 0, 1, 2, 3: risks 0, 1/2, 1/3, 2/4.
  aurc, eaurc = U.aurc_eaurc(conf, correct)
  assert aurc == pytest.approx((0 + 1 / 2 + 1 / 3 + 1 / 2) / 4, abs=1e-15)
  r = 0.5
  assert eaurc == pytest.approx(aurc - (r + (1 - r) * math.log(1 - r)), abs=1e-15)
  # E-AURC subtracts the continuous optimum r + (1 - r) ln(1 - r), not the finite-n one: a perfect ranking of
  # 4 samples (risks 0, 0, 1/3, 2/4) keeps a positive E-AURC.
  a0, e0 = U.aurc_eaurc(np.array([0.9, 0.8, 0.7, 0.6]), np.array([True, True, False, False]))
  assert a0 == pytest.approx((1 / 3 + 1 / 2) / 4, abs=1e-15)
  assert e0 == pytest.approx(a0 - (0.5 + 0.5 * math.log(0.5)), abs=1e-15)
  # Every prediction wrong: E-AURC is NaN (as in the release), AURC is 1.
  a1, e1 = U.aurc_eaurc(conf, np.zeros(4, bool))
  assert a1 == 1.0 and math.isnan(e1)


def test_hand_computed_roc_pr_and_scores():
  conf = np.array([0.9, 0.7, 0.6, 0.4])
  correct = np.array([True, False, True, False])
  # Perfectly separable would be 1; here pairs (correct > wrong): (0.9>0.7),(0.9>0.4),(0.6>0.4) of 4 = 0.75.
  assert U.auroc(conf, correct) == pytest.approx(0.75, abs=1e-15)
  # Errors scored by -conf: ranks 0.4 (err), 0.6 (ok), 0.7 (err), 0.9 (ok): AP = 1/2 * 1 + 1/2 * 2/3.
  assert U.aupr_error(conf, correct) == pytest.approx(0.5 + 1 / 3, abs=1e-15)
  probs = np.array([[0.7, 0.3], [0.2, 0.8]])
  labels = np.array([0, 0])
  assert U.brier_score(probs, labels) == pytest.approx((0.09 + 0.09 + 0.64 + 0.64) / 2, abs=1e-15)
  logits = np.log(probs)
  assert U.negative_log_likelihood(logits, labels) == pytest.approx(-(math.log(0.7) + math.log(0.2)) / 2, rel=1e-6)


@pytest.mark.parametrize(
  "call, message",
  [
    (lambda: U.uncertainty_metrics(np.ones((3,)), np.zeros(3, int)), "probs must be"),
    (lambda: U.uncertainty_metrics(np.ones((3, 2)) / 2, np.array([0, 1, 2])), "labels must lie"),
    (lambda: U.uncertainty_metrics(np.ones((3, 2)) / 2, np.zeros(3)), "labels must be"),
    (lambda: U.roc_curve(np.array([0.5, 0.6]), np.array([True, True])), "both correct and wrong"),
    (lambda: U.ece_bin_edges(0), "bins must be"),
    (lambda: U.risk_curve(np.array([np.nan]), np.array([True])), "confidence must be finite"),
  ],
)
def test_bad_inputs_are_refused(call, message):
  with pytest.raises(ValueError, match=message):
    call()


def test_undefined_metrics_are_nan_by_name():
  probs = np.array([[0.9, 0.1], [0.2, 0.8]])
  out = U.uncertainty_metrics(probs, np.array([0, 1]))
  assert out["acc"] == 1.0 and math.isnan(out["auroc"]) and math.isnan(out["aupr_err"]) and math.isnan(out["fpr95"])
  assert out["aupr_success"] == pytest.approx(1.0)


def test_matches_scikit_learn_on_random_predictions():
  metrics = pytest.importorskip("sklearn.metrics")
  rng = np.random.default_rng(3)
  conf = np.round(rng.uniform(0.3, 1.0, 300), 2)  # rounding makes ties
  correct = rng.uniform(size=300) < conf
  fpr, tpr, _ = metrics.roc_curve(correct, conf)
  ours_fpr, ours_tpr = U.roc_curve(conf, correct)
  np.testing.assert_array_equal(ours_fpr, fpr)
  np.testing.assert_array_equal(ours_tpr, tpr)
  assert U.auroc(conf, correct) == pytest.approx(metrics.roc_auc_score(correct, conf), abs=1e-12)
  precision, recall, _ = metrics.precision_recall_curve(correct, conf)
  assert U.aupr_success(conf, correct) == pytest.approx(metrics.auc(recall, precision), abs=1e-12)
  assert U.aupr_error(conf, correct) == pytest.approx(metrics.average_precision_score(~correct, -conf), abs=1e-12)
