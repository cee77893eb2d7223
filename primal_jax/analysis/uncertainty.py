"""Uncertainty metrics of KEP-SVGP's evaluation (failure prediction, calibration), as its authors compute them.

Every function takes host arrays (NumPy, or JAX arrays converted with `np.asarray`) and returns a Python float.
The definitions follow `CIFAR/utils/metrics.py` of the KEP-SVGP release (Chen et al., ICML 2024), which calls
scikit-learn's `roc_curve`, `precision_recall_curve`, `auc` and `average_precision_score` and torch for the ECE
and the NLL; they are written here in NumPy (scikit-learn is not a dependency of this package) and checked
against the golden case `kep_metrics` of the authors' code, and against scikit-learn itself where it is
installed (tests/test_uncertainty_metrics.py):

* confidence = max softmax probability, correct = (argmax == label); the "positive" class of the ROC and of
  AUPR-success is a correct prediction, that of AUPR-error a wrong one (scored by -confidence).
* AURC: stable descending sort of the confidences (tied confidences keep their index order), risk_k = errors
  among the first k / k, AURC = mean_k risk_k; E-AURC = AURC - (r + (1 - r) ln(1 - r)), r the error rate (NaN
  when every prediction is wrong, as in the release).
* ROC: one point per distinct confidence, reduced as scikit-learn's `drop_intermediate=True` does; AUROC is its
  trapezoidal area and FPR at 95% TPR is read off that reduced curve (first point nearest to TPR 0.95).
* AUPR-success: trapezoidal area under the success precision-recall curve; AUPR-error: average precision (step
  sum) of the errors. The release's tables call the latter "AUPR".
* ECE: 15 bins with torch's float32 `linspace(0, 1, 16)` edges, bins (lo, hi], float32 sums.
* NLL: mean -log_softmax(logits)[label] in float32; Brier: mean over samples of the squared error summed over
  classes (float64).
"""

from __future__ import annotations

import dataclasses

import numpy as np

ECE_BINS = 15


def _check_probs(probs, name: str = "probs") -> np.ndarray:
  probs = np.asarray(probs)
  if probs.ndim != 2 or probs.shape[0] == 0 or probs.shape[1] < 2:
    raise ValueError(f"{name} must be [n >= 1, classes >= 2], got shape {probs.shape}")
  if not np.all(np.isfinite(probs)):
    raise ValueError(f"{name} must be finite")
  return probs


def _check_labels(labels, n: int, classes: int) -> np.ndarray:
  labels = np.asarray(labels)
  if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"labels must be [{n}] integers, got shape {labels.shape} dtype {labels.dtype}")
  if labels.min() < 0 or labels.max() >= classes:
    raise ValueError(f"labels must lie in [0, {classes}), got values in [{labels.min()}, {labels.max()}]")
  return labels


def _check_scores(confidence, correct) -> tuple[np.ndarray, np.ndarray]:
  confidence, correct = np.asarray(confidence), np.asarray(correct)
  if confidence.ndim != 1 or confidence.shape != correct.shape or confidence.size == 0:
    raise ValueError(f"confidence and correct must be [n >= 1] each, got shapes {confidence.shape} and {correct.shape}")
  if not np.all(np.isfinite(confidence)):
    raise ValueError("confidence must be finite")
  return confidence, correct.astype(bool)


def confidence_and_correct(probs, labels) -> tuple[np.ndarray, np.ndarray]:
  """(max probability [n], argmax == label [n] bool); ties in a row resolve to the first class (as torch.max)."""
  probs = _check_probs(probs)
  labels = _check_labels(labels, probs.shape[0], probs.shape[1])
  return probs.max(axis=1), probs.argmax(axis=1) == labels


def risk_curve(confidence, correct) -> np.ndarray:
  """[n] risk_k = errors among the k most confident / k (stable descending sort: ties keep index order)."""
  confidence, correct = _check_scores(confidence, correct)
  order = np.argsort(-confidence, kind="stable")
  wrong = (~correct[order]).astype(np.float64)
  return np.cumsum(wrong) / np.arange(1, wrong.size + 1)


def aurc_eaurc(confidence, correct) -> tuple[float, float]:
  """(AURC, E-AURC) of the risk-coverage curve; E-AURC is NaN when every prediction is wrong."""
  risk = risk_curve(confidence, correct)
  aurc = float(np.sum(risk) / risk.size)
  r = risk[-1]
  with np.errstate(divide="ignore", invalid="ignore"):
    optimal = r + (1.0 - r) * np.log(1.0 - r) if r < 1.0 else np.nan
  return aurc, float(aurc - optimal)


def _binary_clf_curve(positive, score) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(false positives, true positives, thresholds) per distinct score, descending (scikit-learn's rule)."""
  order = np.argsort(score, kind="mergesort")[::-1]
  score, positive = score[order], positive[order].astype(np.float64)
  distinct = np.where(np.diff(score))[0]
  idx = np.r_[distinct, positive.size - 1]
  tps = np.cumsum(positive)[idx]
  fps = 1 + idx - tps
  return fps, tps, score[idx]


def roc_curve(confidence, correct, drop_intermediate: bool = True) -> tuple[np.ndarray, np.ndarray]:
  """(fpr, tpr) of correct predictions scored by confidence, as `sklearn.metrics.roc_curve`.

  Needs at least one correct and one wrong prediction (otherwise one of the rates is undefined).
  """
  confidence, correct = _check_scores(confidence, correct)
  if correct.all() or not correct.any():
    raise ValueError("roc_curve needs both correct and wrong predictions (one rate is 0/0 otherwise)")
  fps, tps, _ = _binary_clf_curve(correct, confidence)
  if drop_intermediate and fps.size > 2:
    keep = np.where(np.r_[True, np.logical_or(np.diff(fps, 2), np.diff(tps, 2)), True])[0]
    fps, tps = fps[keep], tps[keep]
  fps, tps = np.r_[0.0, fps], np.r_[0.0, tps]
  return fps / fps[-1], tps / tps[-1]


def precision_recall_curve(positive, score) -> tuple[np.ndarray, np.ndarray]:
  """(precision, recall), recall decreasing, ending at (1, 0), as `sklearn.metrics.precision_recall_curve`."""
  score, positive = _check_scores(score, positive)
  if not positive.any():
    raise ValueError("precision_recall_curve needs at least one positive (recall is 0/0 otherwise)")
  fps, tps, _ = _binary_clf_curve(positive, score)
  precision = tps / (tps + fps)
  recall = tps / tps[-1]
  return np.r_[precision[::-1], 1.0], np.r_[recall[::-1], 0.0]


def _trapezoid_area(x, y) -> float:
  """sklearn.metrics.auc: trapezoidal area for x monotonic in either direction."""
  area = float(np.trapezoid(y, x))
  return -area if np.all(np.diff(x) <= 0) else area


def auroc(confidence, correct) -> float:
  fpr, tpr = roc_curve(confidence, correct)
  return _trapezoid_area(fpr, tpr)


def fpr_at_95_tpr(confidence, correct) -> float:
  """FPR at the point of the reduced ROC curve whose TPR is nearest to 0.95 (first on ties)."""
  fpr, tpr = roc_curve(confidence, correct)
  return float(fpr[np.argmin(np.abs(tpr - 0.95))])


def aupr_success(confidence, correct) -> float:
  """Trapezoidal area under the precision-recall curve of correct predictions scored by confidence."""
  precision, recall = precision_recall_curve(correct, confidence)
  return _trapezoid_area(recall, precision)


def aupr_error(confidence, correct) -> float:
  """Average precision of the errors scored by -confidence (`average_precision_score`; "AUPR" in the tables)."""
  confidence, correct = _check_scores(confidence, correct)
  precision, recall = precision_recall_curve(~correct, -confidence)
  return float(-np.sum(np.diff(recall) * precision[:-1]))


def ece_bin_edges(bins: int = ECE_BINS) -> np.ndarray:
  """[bins + 1] float32 edges as `torch.linspace(0, 1, bins + 1)` computes them (not float32(k / bins))."""
  if not isinstance(bins, (int, np.integer)) or bins < 1:
    raise ValueError(f"bins must be an integer >= 1, got {bins!r}")
  if bins == 1:
    return np.array([0.0, 1.0], np.float32)
  # torch: float32 step; i * step below halfway, 1 - step * (bins - i) above it as one fused multiply-add (the
  # product is exact in float64 and the result rounded once to float32).
  step = np.float64(np.float32(1.0) / np.float32(bins))
  i = np.arange(bins + 1, dtype=np.float64)
  half = (bins + 1) // 2
  values = np.where(i < half, step * i, 1.0 - step * (bins - i))
  return values.astype(np.float32)


@dataclasses.dataclass(frozen=True)
class ReliabilityBins:
  """Per-bin counts, accuracies and mean confidences (a reliability diagram); empty bins hold NaN."""

  edges: np.ndarray
  count: np.ndarray
  accuracy: np.ndarray
  confidence: np.ndarray


def reliability_bins(confidence, correct, bins: int = ECE_BINS) -> ReliabilityBins:
  """Bins (lo, hi] over float32 confidences with torch's edges; float32 means as the release computes them."""
  confidence, correct = _check_scores(confidence, correct)
  conf32 = confidence.astype(np.float32)
  edges = ece_bin_edges(bins)
  count = np.zeros(bins, np.int64)
  acc = np.full(bins, np.nan)
  mean_conf = np.full(bins, np.nan)
  for b in range(bins):
    member = (conf32 > edges[b]) & (conf32 <= edges[b + 1])
    count[b] = member.sum()
    if count[b]:
      acc[b] = np.mean(correct[member].astype(np.float32), dtype=np.float32)
      mean_conf[b] = np.mean(conf32[member], dtype=np.float32)
  return ReliabilityBins(edges, count, acc, mean_conf)


def expected_calibration_error(confidence, correct, bins: int = ECE_BINS) -> float:
  """``sum_b |mean conf_b - accuracy_b| n_b / n``, accumulated in float32 as the release does."""
  rel = reliability_bins(confidence, correct, bins)
  n = np.float32(np.asarray(confidence).size)
  ece = np.float32(0.0)
  for b in np.flatnonzero(rel.count):
    gap = np.abs(np.float32(rel.confidence[b]) - np.float32(rel.accuracy[b]))
    ece = np.float32(ece + gap * (np.float32(rel.count[b]) / n))
  return float(ece)


def negative_log_likelihood(logits, labels) -> float:
  """-mean_i log_softmax(logits)[i, label_i] in float32 (logits, not probabilities, as the release)."""
  logits = _check_probs(logits, "logits").astype(np.float32)
  labels = _check_labels(labels, logits.shape[0], logits.shape[1])
  shifted = logits - logits.max(axis=1, keepdims=True)
  log_probs = shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True))
  return float(-np.mean(log_probs[np.arange(labels.size), labels], dtype=np.float32))


def brier_score(probs, labels) -> float:
  """mean_i sum_c (probs[i, c] - onehot[i, c])^2, in float64."""
  probs = _check_probs(probs).astype(np.float64)
  labels = _check_labels(labels, probs.shape[0], probs.shape[1])
  onehot = np.eye(probs.shape[1])[labels]
  return float(np.mean(np.sum((probs - onehot) ** 2, axis=1)))


def uncertainty_metrics(probs, labels, logits=None, bins: int = ECE_BINS) -> dict[str, float]:
  """Every metric of the release's `valid.py` (unscaled): acc in [0, 1], aurc, eaurc, auroc, aupr_success,
  aupr_err, fpr95, ece, brier, and nll when `logits` are given (the release's NLL reads logits).

  A metric that is undefined on these predictions is NaN, by name: auroc and fpr95 without both correct and
  wrong predictions, aupr_success without a correct one, aupr_err without a wrong one, eaurc when all are wrong.
  """
  confidence, correct = confidence_and_correct(probs, labels)
  aurc, eaurc = aurc_eaurc(confidence, correct)
  both = correct.any() and not correct.all()
  nan = float("nan")
  out = {
    "acc": float(np.mean(correct)),
    "aurc": aurc,
    "eaurc": eaurc,
    "auroc": auroc(confidence, correct) if both else nan,
    "aupr_success": aupr_success(confidence, correct) if correct.any() else nan,
    "aupr_err": aupr_error(confidence, correct) if not correct.all() else nan,
    "fpr95": fpr_at_95_tpr(confidence, correct) if both else nan,
    "ece": expected_calibration_error(confidence, correct, bins),
    "brier": brier_score(probs, labels),
  }
  if logits is not None:
    out["nll"] = negative_log_likelihood(logits, labels)
  return out
