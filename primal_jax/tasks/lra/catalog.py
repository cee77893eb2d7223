"""What the Long Range Arena input pipelines share: byte tokens and the data_config keys they read.

The three modules built on this one are `image` (Image: CIFAR-10 in
grayscale, or Fashion-MNIST offline), `text` (Text: byte-level IMDB) and
`retrieval` (Retrieval: byte-level AAN pairs). They turn their data into
token examples {"tokens": int32 [length], "label": int, "index": int} (plus
"tokens2" for pairs) and hand them to `tokens.token_pipeline`. TFDS catalog
data (CIFAR-10, IMDB) comes from `primal_jax.data.sources.tfds_catalog`, LRA's
validation split (the tail of train) from `primal_jax.data.splits.holdout_tail`.

Token ids follow LRA's encoders, which reserve id 0 for padding:
`tfds.deprecated.text.ByteTextEncoder` (Text, Retrieval) maps byte b to b + 1,
and the same shift is applied to pixel values (Image), so every task here has
vocabulary size 257. (LRA's image task fed raw pixels 0..255 with no padding
id; the shift only renames the embedding rows.)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from primal_jax.data.cache import default_data_dir
from primal_jax.data.checks import check_fraction, check_nonnegative_int, check_positive_int, config_get, require_keys

# Ids 1..256 are a byte (or pixel) value + 1; id 0 is padding.
BYTE_VOCAB_SIZE = 257
# LRA's maximum length for the byte-level Text and Retrieval tasks (per document), as in the
# Primal-Attention release (inherited from the Nystromformer LRA code).
TEXT_MAX_LENGTH = 4000


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
