"""LRA Text: byte-level IMDB sentiment classification (2 classes, 25,000 / 25,000 reviews).

LRA's `text_classification/input_pipeline.py` reads the TFDS `imdb_reviews`
train and test splits, encodes each review with
`tfds.deprecated.text.ByteTextEncoder` (byte b -> id b + 1, 0 = padding,
vocabulary 257) and keeps the first `max_length` ids; the Primal-Attention
release uses max_length 4,000 (its LRA data scripts come from Nystromformer's).
IMDB has no validation split, and LRA evaluates on the test split for both
("use test set for validation because IMDb doesn't have val set"); that is the
default here too, so "validation" and "test" are the same 25,000 reviews unless
`val_fraction` > 0 holds out the tail of train instead.

The reviews come from the TFDS catalog as ArrayRecord (`primal_jax.data.sources.tfds_catalog`);
preparing them needs the network once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from primal_jax.data.checks import check_positive_int
from primal_jax.data.core import InputPipeline
from primal_jax.data.pipeline import Example
from primal_jax.data.sources.tfds_catalog import catalog_splits
from primal_jax.data.splits import holdout_tail
from primal_jax.tasks.lra.catalog import (
  BYTE_VOCAB_SIZE,
  TEXT_MAX_LENGTH,
  byte_tokens,
  lra_settings,
)
from primal_jax.tasks.lra.tokens import token_pipeline

TEXT_DATASETS: tuple[str, ...] = ("imdb_reviews",)
IMDB_CLASSES: tuple[str, ...] = ("neg", "pos")  # the catalog's ClassLabel names


@dataclasses.dataclass(frozen=True, eq=False)
class CatalogTextSource(Sequence):
  """Token examples of a TFDS text data source ({"text": bytes or str, "label": int}): bytes + 1, truncated."""

  source: Sequence[Example]
  max_length: int

  def __post_init__(self) -> None:
    check_positive_int(self.max_length, "max_length")

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, i):  # integer indices only, as the pipeline uses them
    i = int(i)
    example = self.source[i]
    return {"tokens": byte_tokens(example["text"], self.max_length), "label": int(example["label"]), "index": i}


def text_splits(train: Sequence[Example], test: Sequence[Example], val_fraction: float) -> dict[str, Sequence]:
  """LRA's splits: validation is the test split (fraction 0), or else the tail of train."""
  if val_fraction == 0.0:
    return {"train": train, "validation": test, "test": test}
  train_part, validation = holdout_tail(train, val_fraction)
  return {"train": train_part, "validation": validation, "test": test}


def make_lra_text_pipeline(data_config: Any, *, process_index: int = 0, process_count: int = 1) -> InputPipeline:
  """The LRA Text task's InputPipeline: batches of inputs int32 [b, seq_len] in [0, 257), 2 classes.

  data_config keys (besides batch_size, eval_batch_size, seed):
    dataset: "imdb_reviews" (the default and only choice).
    data_dir: the TFDS data_dir (default <default_cache_dir()>/tfds).
    download: download and prepare imdb_reviews if absent (default True).
    seq_len: bytes kept per review (default 4,000, the release's; 0 means that too).
    val_fraction: 0 (default) = validate on the test split as LRA; > 0 = the tail of train.
  """
  cfg = lra_settings(data_config, "lra_text", dataset="imdb_reviews", seq_len=TEXT_MAX_LENGTH, val_fraction=0.0)
  if cfg.dataset not in TEXT_DATASETS:
    raise ValueError(f"dataset must be one of {', '.join(TEXT_DATASETS)} for the lra_text task, got {cfg.dataset!r}")
  seq_len = cfg.seq_len or TEXT_MAX_LENGTH
  sources = catalog_splits(cfg.dataset, ("train", "test"), cfg.data_dir, download=cfg.download)
  train, test = (CatalogTextSource(sources[split], seq_len) for split in ("train", "test"))
  return token_pipeline(
    cfg.dataset,
    text_splits(train, test, cfg.val_fraction),
    IMDB_CLASSES,
    BYTE_VOCAB_SIZE,
    data_config,
    seq_len=seq_len,
    process_index=process_index,
    process_count=process_count,
  )
