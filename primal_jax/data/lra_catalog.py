"""What the Long Range Arena input pipelines share: byte tokens, TFDS catalog data sources, LRA's splits.

The three modules built on this one are `lra_image` (Image: CIFAR-10 in
grayscale, or Fashion-MNIST offline), `lra_text` (Text: byte-level IMDB) and
`lra_retrieval` (Retrieval: byte-level AAN pairs). They turn their data into
token examples {"tokens": int32 [length], "label": int, "index": int} (plus
"tokens2" for pairs) and hand them to `token_tasks.token_pipeline`.

Token ids follow LRA's encoders, which reserve id 0 for padding:
`tfds.deprecated.text.ByteTextEncoder` (Text, Retrieval) maps byte b to b + 1,
and the same shift is applied to pixel values (Image), so every task here has
vocabulary size 257. (LRA's image task fed raw pixels 0..255 with no padding
id; the shift only renames the embedding rows.)

TFDS catalog datasets are read with `builder.as_data_source(split)` from
ArrayRecord files, the one TFDS format readable with numpy alone, which is what
`tfds.data_source(name, builder_kwargs={"file_format": "array_record"})` does;
`tfds.load`/`as_dataset` would need TensorFlow and are never used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from primal_jax.data.cache import DatasetFetchError, default_data_dir
from primal_jax.data.checks import check_fraction, check_nonnegative_int, check_positive_int, config_get, require_keys
from primal_jax.data.pipeline import Example, Subset
from primal_jax.errors import MissingFileError

# Ids 1..256 are a byte (or pixel) value + 1; id 0 is padding.
BYTE_VOCAB_SIZE = 257
# LRA's maximum length for the byte-level Text and Retrieval tasks (per document), as in the
# Primal-Attention release (inherited from the Nystromformer LRA code).
TEXT_MAX_LENGTH = 4000
ARRAY_RECORD = "array_record"


def byte_tokens(text: bytes | str, max_length: int) -> np.ndarray:
  """int32 [min(len(bytes), max_length)]: the first `max_length` bytes of `text` (UTF-8 if str), each + 1.

  Exactly LRA's `ByteTextEncoder().encode(s)[:max_length]` (one id per byte,
  so truncating bytes first gives the same ids). An empty text becomes one
  padding id, [0]: LRA fed such a document as all padding, and the collator
  needs one position to keep masked pooling defined.
  """
  max_length = check_positive_int(max_length, "max_length")
  data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
  if not data:
    return np.zeros(1, dtype=np.int32)
  return np.frombuffer(data[:max_length], dtype=np.uint8).astype(np.int32) + 1


def config_value(data_config: Any, key: str, default: Any = None) -> Any:
  """`data_config.<key>` (a ConfigDict, dict or plain object); `default` when absent, None or an empty string.

  An empty string counts as absent because ConfigDict fields declared for an optional path default to "".
  """
  value = config_get(data_config, key, default)
  if value is None or (isinstance(value, str) and not value):
    return default
  return value


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


def _prepare_instructions(name: str, data_dir: Path) -> str:
  return (
    f"Prepare it once where TensorFlow and the network are available, e.g. `pip install tensorflow-cpu "
    f"importlib_resources && tfds build {name} --file_format={ARRAY_RECORD} --data_dir={data_dir}` (or copy a "
    f"prepared `{name}/` folder there); reading it back needs neither. Fashion-MNIST (dataset='fashion_mnist') "
    "needs no network beyond the Debian package registry."
  )


def catalog_splits(
  name: str, splits: Sequence[str], data_dir: str | Path | None = None, *, download: bool = True
) -> dict[str, Sequence[Example]]:
  """{split: random-access data source} of a TFDS catalog dataset, prepared as ArrayRecord under `data_dir`.

  Equivalent to `tfds.data_source(name, split=split, data_dir=data_dir,
  download=download, builder_kwargs={"file_format": "array_record"})`, which
  is spelled out so a missing dataset gets a message saying how to obtain it.
  The file format is passed explicitly because `tfds.data_source` defaults to
  ArrayRecord only when neither data_dir nor builder_kwargs are given.

  Raises:
    FileNotFoundError: not prepared under data_dir and download=False.
    DatasetFetchError: preparing failed, e.g. for want of TensorFlow (the
      catalog's CIFAR-10 reader and PNG encoder use it) or of the network.
  """
  import tensorflow_datasets as tfds  # imported only by the catalog datasets

  data_dir = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
  builder = tfds.builder(name, data_dir=str(data_dir), file_format=ARRAY_RECORD)
  if not builder.is_prepared():
    if not download:
      raise MissingFileError(
        f"TFDS dataset {name!r} is not prepared under {data_dir} and download=False. Set download=True to "
        f"download and prepare it there. {_prepare_instructions(name, data_dir)}"
      )
    try:
      builder.download_and_prepare()
    except Exception as e:  # re-raised with what to do; the cause stays chained
      raise DatasetFetchError(
        f"could not download and prepare TFDS dataset {name!r} into {data_dir}: {type(e).__name__}: {e}. "
        f"{_prepare_instructions(name, data_dir)}"
      ) from e
  return {split: builder.as_data_source(split) for split in splits}


@dataclasses.dataclass(frozen=True)
class LraSettings:
  """The data_config keys the LRA pipelines read, with each task's defaults filled in."""

  dataset: str
  source: str | None  # a local directory or file source (AAN tsv files, Fashion-MNIST idx files)
  data_dir: Path  # TFDS data_dir of catalog datasets
  seq_len: int  # 0 = the task's natural length
  val_fraction: float
  download: bool


def lra_settings(data_config: Any, task: str, *, dataset: str, seq_len: int, val_fraction: float) -> LraSettings:
  """Reads and checks the optional keys; `dataset`, `seq_len` and `val_fraction` are the task's defaults."""
  require_keys(data_config, ("batch_size", "eval_batch_size"), task)  # named up front, not deep in InputPipeline
  source = config_value(data_config, "source")
  data_dir = config_value(data_config, "data_dir")
  return LraSettings(
    dataset=str(config_value(data_config, "dataset", dataset)),
    source=str(source) if source is not None else None,
    data_dir=Path(data_dir).expanduser() if data_dir is not None else default_data_dir(),
    seq_len=check_nonnegative_int(config_value(data_config, "seq_len", seq_len), "seq_len"),
    val_fraction=check_fraction(config_value(data_config, "val_fraction", val_fraction), "val_fraction"),
    download=bool(config_value(data_config, "download", True)),
  )
