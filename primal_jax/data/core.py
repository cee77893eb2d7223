"""The types every task shares: `DatasetInfo`, `InputPipeline` and the collators that build its batches.

A task module turns its data into random-access sources of examples and
returns an `InputPipeline` over them; `registry` maps task names to those
factories. The pipeline itself only orders, slices per host and collates (see
`pipeline` for why the order is computed from (seed, epoch) alone), so every
task gets the same multi-host and padding behaviour:

  * the last global batch of a pass is filled with padding rows of weight 0;
  * each host gets rows [p * b, (p + 1) * b) of every global batch, b = global batch / process_count.

Collators fix the batch layout. `Collate`: real-valued series (UEA),
`TokenCollate`: token sequences (LRA), `text_bytes.NextTokenCollate`: next-byte
windows (language modelling).
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from primal_jax.data import pipeline
from primal_jax.data.checks import check_nonnegative_int, check_positive_int, config_get
from primal_jax.data.pipeline import PAD_INDEX, Example

# evaluate_split(apply_fn, params, split) -> metrics (with "count"): how a task that measures a split itself
# (offline RL: rollouts in the environment) evaluates it, instead of eval batches and the objective's sums.
SplitEvaluator = Callable[[Callable[..., Any], Any, str], dict[str, float]]


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What a model and a train loop need to know about a task's data."""

  name: str
  num_classes: int
  num_features: int  # C, channels per time step
  seq_len: int  # every batch is padded/truncated to this length
  max_length: int  # longest series over all splits (> seq_len means truncation)
  split_sizes: Mapping[str, int]  # real examples per split: "train", "test", and "validation" if carved out
  class_names: tuple[str, ...]
  # Token tasks: ids lie in [0, vocab_size); the LRA tasks reserve 0 for padding, text_bytes uses all 256
  # byte values and marks padding by weight 0 alone. 0 for real-valued inputs.
  vocab_size: int = 0


@dataclasses.dataclass(frozen=True)
class InputPipeline:
  """Per-host train and eval batches of one task; every method is deterministic given the config.

  Attributes:
    info: the task's DatasetInfo.
    sources: split name -> random-access source of examples.
    transform: applied to every example before collation (normalisation), or None.
    batch_size, eval_batch_size: GLOBAL batch sizes (all hosts together).
    seed: fixes the per-epoch orders.
  """

  info: DatasetInfo
  sources: Mapping[str, Sequence[Example]]
  transform: pipeline.Transform | None
  batch_size: int
  eval_batch_size: int
  seed: int
  process_index: int = 0
  process_count: int = 1
  collate: Any = None  # examples -> batch; default `Collate(seq_len, num_features)`
  # Training-time augmentation: augment(example, rng) -> example, rng a NumPy Generator seeded by
  # (seed, epoch, example index), so an example's augmentation depends on nothing else (batch, host count,
  # resumption). Evaluation splits are never augmented.
  augment: Any = None
  # Training-time batch mixing: mix(batch, rng) -> batch (Mixup/CutMix with soft "label_probs"), rng seeded
  # by (seed, epoch, batch index in the epoch, process index), so a resumed epoch mixes its batches alike.
  batch_mix: Any = None
  # A task that evaluates splits itself (`SplitEvaluator`); None: the train loop evaluates `eval_batches`.
  evaluate_split: SplitEvaluator | None = None

  def __post_init__(self) -> None:
    pipeline.local_batch_size(self.batch_size, self.process_count)  # validates divisibility
    pipeline.local_batch_size(self.eval_batch_size, self.process_count)
    if not 0 <= self.process_index < self.process_count:
      raise ValueError(f"process_index must lie in [0, {self.process_count}), got {self.process_index}")

  @property
  def steps_per_epoch(self) -> int:
    """Global batches per training epoch (the last one padded)."""
    return math.ceil(len(self.sources["train"]) / self.batch_size)

  @property
  def eval_splits(self) -> tuple[str, ...]:
    return tuple(self.sources)

  def num_eval_batches(self, split: str) -> int:
    return math.ceil(len(self._source(split)) / self.eval_batch_size)

  def _source(self, split: str) -> Sequence[Example]:
    if split not in self.sources:
      raise ValueError(f"split must be one of {', '.join(self.sources)}, got {split!r}")
    return self.sources[split]

  def _batches(
    self, split: str, order: np.ndarray, global_batch: int, epoch: int | None = None
  ) -> Iterator[dict[str, np.ndarray]]:
    rows = pipeline.host_rows(order, global_batch, self.process_index, self.process_count)
    local = pipeline.local_batch_size(global_batch, self.process_count)
    collate = self.collate or Collate(self.info.seq_len, self.info.num_features)
    source = self._source(split)
    if epoch is not None and self.augment is not None:
      source = Augmented(source, self.augment, self.seed, epoch)
    yield from pipeline.iterate(pipeline.batch_dataset(source, rows, local, collate, self.transform))

  def train_batches(self, epoch: int, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """The `steps_per_epoch` local batches of training epoch `epoch`, each example exactly once.

    `start` > 0 begins at that batch of the epoch: a resumed run skips the batches it consumed by their
    position in the epoch's order, without reading or collating them.
    """
    if isinstance(start, bool) or not isinstance(start, int | np.integer) or not 0 <= start <= self.steps_per_epoch:
      raise ValueError(f"start must be an integer in [0, steps_per_epoch={self.steps_per_epoch}], got {start!r}")
    order = pipeline.train_order(len(self.sources["train"]), self.batch_size, seed=self.seed, epoch=epoch)
    batches = self._batches("train", order[int(start) * self.batch_size :], self.batch_size, epoch=int(epoch))
    if self.batch_mix is None:
      return batches
    return (
      self.batch_mix(batch, np.random.default_rng([self.seed, int(epoch), int(start) + i, self.process_index]))
      for i, batch in enumerate(batches)
    )

  def eval_batches(self, split: str) -> Iterator[dict[str, np.ndarray]]:
    """The `num_eval_batches(split)` local batches of `split`, in file order, each example exactly once."""
    order = pipeline.eval_order(len(self._source(split)), self.eval_batch_size)
    return self._batches(split, order, self.eval_batch_size)


@dataclasses.dataclass(frozen=True, eq=False)
class Augmented(Sequence):
  """`source` with `augment(example, rng)` applied, rng = Generator(PCG64([seed, epoch, position]))."""

  source: Sequence[Example]
  augment: Any
  seed: int
  epoch: int

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, i):
    i = int(i)
    return self.augment(self.source[i], np.random.default_rng([self.seed, self.epoch, i]))


def pipeline_from_config(
  data_config: Any, info: DatasetInfo, splits: Mapping[str, Sequence[Example]], collate: Any, *,
  process_index: int = 0, process_count: int = 1, augment: Any = None, batch_mix: Any = None,
) -> InputPipeline:  # fmt: skip
  """The InputPipeline of a task whose splits are built: batch sizes and seed read from `data_config`."""
  return InputPipeline(
    info=info,
    sources=types.MappingProxyType(dict(splits)),
    transform=None,
    batch_size=config_get(data_config, "batch_size"),
    eval_batch_size=config_get(data_config, "eval_batch_size"),
    seed=check_nonnegative_int(config_get(data_config, "seed", 0), "seed"),
    process_index=process_index,
    process_count=process_count,
    collate=collate,
    augment=augment,
    batch_mix=batch_mix,
  )


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
