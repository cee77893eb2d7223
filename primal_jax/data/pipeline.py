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

PAD_INDEX = -1
# Separate streams of randomness for the per-epoch orders and the validation split drawn from one seed.
TRAIN_ORDER_STREAM = 1
VALIDATION_SPLIT_STREAM = 2
# Batches are prefetched by a few threads; kept small since one UEA batch can hold ~10 MB (PEMS-SF).
DEFAULT_READ_OPTIONS = grain.ReadOptions(num_threads=4, prefetch_buffer_size=8)

Example = Mapping[str, Any]
Transform = Callable[[Example], Example]


def check_nonnegative_int(value: Any, name: str) -> int:
  if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
    raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
  return int(value)


def check_positive_int(value: Any, name: str) -> int:
  if check_nonnegative_int(value, name) == 0:
    raise ValueError(f"{name} must be a positive integer, got {value!r}")
  return int(value)


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
class Collate:
  """Stacks (position, example or None) pairs into a batch of fixed shape [b, seq_len, C].

  A padding entry (None) becomes one zero time step with mask True, label 0,
  weight 0 and index -1: weight 0 removes it from every weighted loss and
  metric, and its one unmasked step keeps masked pooling and attention from
  dividing by zero (as `ts_format.pad_batch` refuses empty series). Series
  longer than `seq_len` keep their first `seq_len` steps.
  """

  seq_len: int
  num_features: int

  def __post_init__(self) -> None:
    check_positive_int(self.seq_len, "seq_len")
    check_positive_int(self.num_features, "num_features")

  def __call__(self, items: Sequence[tuple[int, Example | None]]) -> dict[str, np.ndarray]:
    b = len(items)
    inputs = np.zeros((b, self.seq_len, self.num_features), dtype=np.float32)  # [b, seq_len, C]
    mask = np.zeros((b, self.seq_len), dtype=bool)  # [b, seq_len], True at real steps
    label = np.zeros(b, dtype=np.int32)  # [b]
    weight = np.zeros(b, dtype=np.float32)  # [b]
    index = np.full(b, PAD_INDEX, dtype=np.int64)  # [b]
    for row, (position, example) in enumerate(items):
      if example is None:
        mask[row, 0] = True
        continue
      values = np.asarray(example["values"])  # [length, C]
      index[row] = int(example.get("index", position))
      if values.ndim != 2 or values.shape[1] != self.num_features or values.shape[0] == 0:
        raise ValueError(
          f"example {index[row]}: values must have shape [length >= 1, {self.num_features}], got {values.shape}"
        )
      if not np.isfinite(values).all():
        raise ValueError(f"example {index[row]} has NaN or infinite values; they must not reach the model")
      n = min(values.shape[0], self.seq_len)
      inputs[row, :n] = values[:n]
      mask[row, :n] = True
      label[row] = int(example["label"])
      weight[row] = 1.0
    return {"inputs": inputs, "mask": mask, "label": label, "weight": weight, "index": index}


@dataclasses.dataclass(frozen=True)
class TokenCollate:
  """Stacks (position, example or None) pairs of token sequences into fixed-shape batches.

  Examples are {"tokens": int [length], "label": int, "index": int} (plus
  "tokens2" for two-sequence tasks such as LRA retrieval). Batches:
  inputs int32 [b, seq_len] (0 past the end: id 0 is reserved for padding),
  mask bool [b, seq_len], label, weight, index as in `Collate` (and inputs2,
  mask2). A padding entry keeps one unmasked position, as in `Collate`.
  """

  seq_len: int
  vocab_size: int
  pairs: bool = False

  def __post_init__(self) -> None:
    check_positive_int(self.seq_len, "seq_len")
    check_positive_int(self.vocab_size, "vocab_size")

  def _fill(self, tokens, row: int, name: str, inputs: np.ndarray, mask: np.ndarray, example_id: int) -> None:
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.shape[0] == 0 or not np.issubdtype(tokens.dtype, np.integer):
      raise ValueError(f"example {example_id}: {name} must be a non-empty 1-D integer array, got {tokens.shape}")
    if tokens.min() < 0 or tokens.max() >= self.vocab_size:
      raise ValueError(f"example {example_id}: {name} ids must lie in [0, {self.vocab_size}), got {tokens.min()}..")
    n = min(tokens.shape[0], self.seq_len)
    inputs[row, :n] = tokens[:n]
    mask[row, :n] = True

  def __call__(self, items: Sequence[tuple[int, Example | None]]) -> dict[str, np.ndarray]:
    b = len(items)
    names = ("tokens", "tokens2") if self.pairs else ("tokens",)
    inputs = {k: np.zeros((b, self.seq_len), dtype=np.int32) for k in names}  # [b, seq_len]
    masks = {k: np.zeros((b, self.seq_len), dtype=bool) for k in names}  # [b, seq_len]
    label = np.zeros(b, dtype=np.int32)
    weight = np.zeros(b, dtype=np.float32)
    index = np.full(b, PAD_INDEX, dtype=np.int64)
    for row, (position, example) in enumerate(items):
      if example is None:
        for k in names:
          masks[k][row, 0] = True
        continue
      index[row] = int(example.get("index", position))
      for k in names:
        self._fill(example[k], row, k, inputs[k], masks[k], int(index[row]))
      label[row] = int(example["label"])
      weight[row] = 1.0
    batch = {"inputs": inputs["tokens"], "mask": masks["tokens"]}
    if self.pairs:
      batch.update(inputs2=inputs["tokens2"], mask2=masks["tokens2"])
    return {**batch, "label": label, "weight": weight, "index": index}


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
  collate: Collate,
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
