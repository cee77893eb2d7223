"""Validation splits held out of a training split, shared by the families that have no validation split of their own.

`holdout_tail` is LRA's rule (the tail of train, for data not sorted by class); `validation_split` draws a
stratified share of every class by seed (UEA, image folders sorted by class).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from primal_jax.data import pipeline
from primal_jax.data.checks import check_fraction, check_nonnegative_int
from primal_jax.data.pipeline import Example, Subset


def holdout_tail(source: Sequence[Example], fraction: float) -> tuple[Subset, Subset]:
  """(train, validation): the first and the last round(fraction * n) examples of `source`, in order.

  LRA's split, `tfds.load(name, split="train[:90%]")` and `"train[90%:]"`:
  a contiguous tail rather than a random draw, so the validation set is the
  same as LRA's for CIFAR-10 (45,000 / 5,000) and depends on nothing but the
  data. At least one example lands on each side.
  """
  n = len(source)
  if n < 2:
    raise ValueError(f"a validation split needs at least 2 training examples, got {n}")
  num_val = min(max(round(check_fraction(fraction, "val_fraction") * n), 1), n - 1)
  boundary = n - num_val
  return Subset(source, np.arange(boundary, dtype=np.int64)), Subset(source, np.arange(boundary, n, dtype=np.int64))


def validation_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(train_positions, val_positions), sorted, disjoint, covering range(len(labels)).

  round(fraction * n) cases (at least 1, at most n - 1) go to validation,
  spread over classes in proportion to their sizes (largest remainders first)
  while keeping at least one case of every class in train; only when that is
  impossible are the rest drawn from any class. Depends only on (labels,
  fraction, seed).
  """
  n = len(labels)
  if n < 2:
    raise ValueError(f"a validation split needs at least 2 training cases, got {n}")
  num_val = min(max(round(fraction * n), 1), n - 1)
  rng = np.random.default_rng([check_nonnegative_int(seed, "seed"), pipeline.VALIDATION_SPLIT_STREAM])
  classes, counts = np.unique(labels, return_counts=True)
  quota = fraction * counts
  capacity = np.maximum(counts - 1, 0)
  take = np.minimum(np.floor(quota).astype(np.int64), capacity)
  by_remainder = np.argsort(-(quota - np.floor(quota)), kind="stable")  # largest remainders first
  while take.sum() < num_val and (take < capacity).any():
    for c in by_remainder:
      if take.sum() < num_val and take[c] < capacity[c]:
        take[c] += 1
  shuffled = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
  val = [s[:k] for s, k in zip(shuffled, take, strict=True)]
  short = num_val - int(take.sum())
  if short:  # stratification impossible (too many singleton classes): fill from the remaining cases
    rest = np.concatenate([s[k:] for s, k in zip(shuffled, take, strict=True)])
    val.append(rng.choice(rest, size=short, replace=False))
  val_positions = np.sort(np.concatenate(val)).astype(np.int64)
  train_positions = np.setdiff1d(np.arange(n, dtype=np.int64), val_positions)
  return train_positions, val_positions
