"""Temperature scaling (Guo et al., 2017): one scalar T > 0 dividing the logits, fitted by the NLL of a held-out
split, the model's other parameters unchanged (so accuracy is unchanged)."""

from __future__ import annotations

import numpy as np
from scipy import optimize, special

LOG_T_BOUNDS = (-4.0, 4.0)  # T in [e^-4, e^4] ~ [0.018, 54.6]


def scaled_nll(logits, labels, temperature: float) -> float:
  """Mean -log softmax(logits / T)[label], float64."""
  z = np.asarray(logits, np.float64) / float(temperature)
  log_probs = z - special.logsumexp(z, axis=1, keepdims=True)
  return float(-np.mean(log_probs[np.arange(len(labels)), np.asarray(labels)]))


def fit_temperature(logits, labels) -> float:
  """argmin_T NLL(logits / T) over log T in `LOG_T_BOUNDS` (scipy's bounded Brent search; the NLL is convex in
  1/T, so the minimum found is the global one within the bounds)."""
  logits, labels = np.asarray(logits), np.asarray(labels)
  if logits.ndim != 2 or labels.shape != (logits.shape[0],) or logits.shape[0] == 0:
    raise ValueError(f"logits must be [n >= 1, classes] and labels [n], got {logits.shape} and {labels.shape}")
  if not np.all(np.isfinite(logits)):
    raise ValueError("logits must be finite to fit a temperature")
  found = optimize.minimize_scalar(
    lambda log_t: scaled_nll(logits, labels, np.exp(log_t)), bounds=LOG_T_BOUNDS, method="bounded",
    options={"xatol": 1e-6},
  )  # fmt: skip
  return float(np.exp(found.x))
