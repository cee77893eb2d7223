"""Deterministic, multi-host batching of variable-length sequences over any random-access source, with grain.

Why an explicit order rather than a sampler per host: the global order of an
epoch is computed from (seed, epoch) alone, identically on every host, padded
to whole global batches, and each host then takes its rows of every global
batch. So a run on N hosts sees exactly the global batches of a run on one
host, in the same order, and nothing is dropped: the last global batch is
filled with padding examples of weight 0 (index -1), never with repeats or by
dropping the remainder, so every example counts exactly once per epoch and
per evaluation pass.

A source is anything with `__len__` and `__getitem__` returning a dict with
`values` ([length, channels] float32), `label` and optionally `index` (an id
kept in the batch; the position in the source when absent): a tfds ArrayRecord
data source, or a plain list of dicts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import grain
import numpy as np

from primal_jax.data.checks import check_nonnegative_int, check_positive_int

PAD_INDEX = -1
# Separate streams of randomness for the per-epoch orders and the validation split drawn from one seed.
TRAIN_ORDER_STREAM = 1
VALIDATION_SPLIT_STREAM = 2
# Batches are prefetched by a few threads; kept small since one UEA batch can hold ~10 MB (PEMS-SF).
DEFAULT_READ_OPTIONS = grain.ReadOptions(num_threads=4, prefetch_buffer_size=8)

Example = Mapping[str, Any]
Transform = Callable[[Example], Example]
# (position, example or None for a padding row) pairs of one local batch -> the batch (`core.Collate` and kin).
Collator = Callable[[Sequence[tuple[int, Example | None]]], Any]


def local_batch_size(global_batch_size: int, process_count: int) -> int:
  """Rows of every global batch that one host gets; the global size must split evenly over hosts."""
  global_batch_size = check_positive_int(global_batch_size, "global_batch_size")
  process_count = check_positive_int(process_count, "process_count")
  if global_batch_size % process_count:
    raise ValueError(
      f"global batch size {global_batch_size} is not divisible by process_count={process_count}; "
      "choose a multiple of the number of hosts"
    )
  return global_batch_size // process_count


def pad_order(order: np.ndarray, global_batch_size: int) -> np.ndarray:
  """[ceil(n / G) * G] int64: `order` followed by PAD_INDEX up to whole global batches."""
  global_batch_size = check_positive_int(global_batch_size, "global_batch_size")
  num_padded = math.ceil(len(order) / global_batch_size) * global_batch_size
  padded = np.full(num_padded, PAD_INDEX, dtype=np.int64)
  padded[: len(order)] = order
  return padded


def train_order(num_examples: int, global_batch_size: int, *, seed: int, epoch: int) -> np.ndarray:
  """[steps * G] int64 global order of one training epoch: a permutation that depends only on (seed, epoch).

  numpy's SeedSequence hashes (seed, stream, epoch), so epochs are unrelated
  permutations (unlike seeding with seed + epoch, where seed s, epoch 1 would
  repeat seed s + 1, epoch 0).
  """
  num_examples = check_positive_int(num_examples, "num_examples")
  seed = check_nonnegative_int(seed, "seed")
  epoch = check_nonnegative_int(epoch, "epoch")
  rng = np.random.default_rng([seed, TRAIN_ORDER_STREAM, epoch])
  return pad_order(rng.permutation(num_examples).astype(np.int64), global_batch_size)


def eval_order(num_examples: int, global_batch_size: int) -> np.ndarray:
  """[steps * G] int64 global order of an evaluation pass: source order, then padding."""
  num_examples = check_positive_int(num_examples, "num_examples")
  return pad_order(np.arange(num_examples, dtype=np.int64), global_batch_size)


def host_rows(order: np.ndarray, global_batch_size: int, process_index: int, process_count: int) -> np.ndarray:
  """[steps * local_b] the rows [p*local_b, (p+1)*local_b) of every global batch of `order`, batch after batch."""
  local_b = local_batch_size(global_batch_size, process_count)
  process_index = check_nonnegative_int(process_index, "process_index")
  if process_index >= process_count:
    raise ValueError(f"process_index must lie in [0, {process_count}), got {process_index}")
  if len(order) % global_batch_size:
    raise ValueError(f"order has {len(order)} entries, not a multiple of global_batch_size={global_batch_size}")
  batches = np.asarray(order).reshape(-1, global_batch_size)  # [steps, G]
  return batches[:, process_index * local_b : (process_index + 1) * local_b].reshape(-1)


@dataclasses.dataclass(frozen=True)
class _Fetch:
  """position -> (position, transformed example), or (-1, None) for padding."""

  source: Sequence[Example]
  transform: Transform | None

  def __call__(self, position: Any) -> tuple[int, Example | None]:
    position = int(position)
    if position == PAD_INDEX:
      return position, None
    example = self.source[position]
    return position, (self.transform(example) if self.transform is not None else example)


def batch_dataset(
  source: Sequence[Example],
  rows: np.ndarray,
  local_batch: int,
  collate: Collator,
  transform: Transform | None = None,
) -> grain.MapDataset:
  """A grain MapDataset whose element i is the i-th local batch of `rows` (positions in `source`, -1 = padding)."""
  local_batch = check_positive_int(local_batch, "local_batch")
  if len(rows) % local_batch:
    raise ValueError(f"rows has {len(rows)} entries, not a multiple of local_batch={local_batch}")
  return grain.MapDataset.source(rows).map(_Fetch(source, transform)).batch(local_batch, batch_fn=collate)


def iterate(dataset: grain.MapDataset, read_options: grain.ReadOptions = DEFAULT_READ_OPTIONS) -> Iterator[Any]:
  """The elements of `dataset` in order, read ahead by a few threads (grain keeps the order)."""
  yield from dataset.to_iter_dataset(read_options)


@dataclasses.dataclass(frozen=True)
class Subset(Sequence):
  """The examples of `source` at `positions`, as a source of its own (a split carved out of another)."""

  source: Sequence[Example]
  positions: np.ndarray  # [n] int64 positions in source

  def __len__(self) -> int:
    return len(self.positions)

  def __getitem__(self, i):  # Sequence's slice form is not needed by the pipeline.
    if isinstance(i, slice):
      raise TypeError("Subset supports integer indices only")
    return self.source[int(self.positions[i])]
