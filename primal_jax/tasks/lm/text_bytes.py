"""Byte-level language modelling on a local file (task "text_bytes"): next-byte windows, enwik8's splits.

`data.source` picks the file: "file" (default) reads `data.path`; "gensim_enwiki" is the embedded default,
6 MB of real English Wikipedia XML (enwik8's format) from the gensim wheel on PyPI (`gensim_enwiki`).
The file is read as raw bytes (UTF-8 text or anything else; no
decoding, so every file is valid) and cut into three contiguous splits by byte
position, in this order, as enwik8's standard 90M / 5M / 5M:

  train       [0, n * 90 // 100)
  validation  [n * 90 // 100, n * 95 // 100)
  test        [n * 95 // 100, n)

Within a split of L bytes, position t predicts byte t + 1, so there are L - 1
targets (no target crosses a split boundary). They are packed into windows of
T = `data.seq_len` positions: window k has inputs bytes [kT, kT + T) and
targets bytes [kT + 1, kT + T + 1) of the split, so consecutive windows are
contiguous and do not overlap, and every byte of the split except the first is
a target exactly once. The last window may be partial; its padding positions
have weight 0. Every split is cut the same way: `DatasetInfo.split_sizes`
counts windows, ceil((L - 1) / T). Training visits the windows of train in an
order fixed by (seed, epoch); evaluation visits a split's windows in order.

Batches (per host, b = global batch / process_count):

  inputs   int32   [b, T]   byte values 0..255 (vocab 256; no id is reserved: weights mark padding)
  targets  int32   [b, T]   the next byte of each position
  weight   float32 [b, T]   1 at real targets, 0 at padding (whole rows of 0 fill the last batch)

The file is memory-mapped, so an enwik9-sized file costs no resident memory
until its windows are read.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from primal_jax.data.checks import check_nonnegative_int, check_positive_int, config_get, require_keys
from primal_jax.data.core import DatasetInfo, InputPipeline, pipeline_from_config
from primal_jax.data.pipeline import Example
from primal_jax.data.sources import gensim_enwiki
from primal_jax.errors import MissingFileError

NAME = "text_bytes"
SOURCES = ("file", "gensim_enwiki")
VOCAB_SIZE = 256
# Split boundaries in percent of the file's bytes (enwik8: 90M / 5M / 5M of 100M).
SPLIT_PERCENT_ENDS: Mapping[str, int] = types.MappingProxyType({"train": 90, "validation": 95, "test": 100})
CLASS_NAMES: tuple[str, ...] = tuple(f"0x{b:02x}" for b in range(VOCAB_SIZE))


def split_bounds(num_bytes: int) -> dict[str, tuple[int, int]]:
  """{split: (begin, end)} byte ranges, contiguous and in file order; see the module docstring."""
  num_bytes = check_nonnegative_int(num_bytes, "num_bytes")
  bounds, begin = {}, 0
  for split, percent in SPLIT_PERCENT_ENDS.items():
    end = num_bytes * percent // 100
    bounds[split] = (begin, end)
    begin = end
  return bounds


def num_windows(num_bytes: int, seq_len: int) -> int:
  """Windows of `seq_len` targets covering the num_bytes - 1 targets of a stream: ceil((num_bytes - 1) / seq_len)."""
  return math.ceil(max(num_bytes - 1, 0) / check_positive_int(seq_len, "seq_len"))


@dataclasses.dataclass(frozen=True, eq=False)
class ByteWindows(Sequence):
  """The next-token windows of one contiguous token stream: item k is {"tokens": [n + 1], "index": k}.

  The stream is uint8 bytes here, int32 word ids in `text_words` (any integer dtype).

  tokens are stream[kT : kT + T + 1] (n = T targets, fewer for the last
  window): inputs are tokens[:-1], targets tokens[1:]. Integer indices only.
  """

  stream: np.ndarray  # [L] uint8 (a view of the file) or int32 token ids
  seq_len: int

  def __post_init__(self) -> None:
    check_positive_int(self.seq_len, "seq_len")
    integer = np.issubdtype(self.stream.dtype, np.integer)
    if self.stream.ndim != 1 or not integer or len(self.stream) < 2:
      raise ValueError(
        f"stream must be integer [L] with L >= 2 (one target), got {self.stream.dtype} {self.stream.shape}"
      )

  def __len__(self) -> int:
    return num_windows(len(self.stream), self.seq_len)

  def __getitem__(self, k):
    if isinstance(k, slice):
      raise TypeError("ByteWindows supports integer indices only")
    k = int(k)
    if not 0 <= k < len(self):
      raise IndexError(f"window {k} out of range for {len(self)} windows")
    begin = k * self.seq_len
    return {"tokens": np.asarray(self.stream[begin : begin + self.seq_len + 1]), "index": k}


@dataclasses.dataclass(frozen=True)
class NextTokenCollate:
  """(position, window or None) pairs -> {"inputs", "targets": int32 [b, T], "weight": float32 [b, T]}.

  A window of n + 1 bytes fills the first n positions of its row; the rest of
  the row, and every row of a padding entry (None), stays 0 with weight 0.
  """

  seq_len: int

  def __post_init__(self) -> None:
    check_positive_int(self.seq_len, "seq_len")

  def __call__(self, items: Sequence[tuple[int, Example | None]]) -> dict[str, np.ndarray]:
    b = len(items)
    inputs = np.zeros((b, self.seq_len), dtype=np.int32)  # [b, T]
    targets = np.zeros((b, self.seq_len), dtype=np.int32)  # [b, T]
    weight = np.zeros((b, self.seq_len), dtype=np.float32)  # [b, T]
    for row, (position, example) in enumerate(items):
      if example is None:
        continue
      tokens = np.asarray(example["tokens"])  # [n + 1]
      n = tokens.shape[0] - 1 if tokens.ndim == 1 else -1
      if not 1 <= n <= self.seq_len:
        raise ValueError(f"window {position}: tokens must be 1-D with 2..{self.seq_len + 1} bytes, got {tokens.shape}")
      inputs[row, :n] = tokens[:-1]
      targets[row, :n] = tokens[1:]
      weight[row, :n] = 1.0
    return {"inputs": inputs, "targets": targets, "weight": weight}


def read_splits(path: str | Path, seq_len: int) -> dict[str, ByteWindows]:
  """{"train", "validation", "test"} windows of the file at `path` (memory-mapped, read-only).

  Raises:
    FileNotFoundError: `path` is not a file.
    ValueError: a split would hold fewer than 2 bytes (no target), i.e. the file is too small.
  """
  path = Path(path).expanduser()
  if not path.is_file():
    raise MissingFileError(f"data.path {str(path)!r} is not a file; text_bytes needs a local text or binary file")
  size = path.stat().st_size
  bounds = split_bounds(size)
  short = {split: end - begin for split, (begin, end) in bounds.items() if end - begin < 2}
  if short:
    raise ValueError(
      f"data.path {str(path)!r} holds {size} bytes, leaving splits {short} with fewer than the 2 bytes that make one "
      "target; text_bytes splits a file 90/5/5 and needs about 40 bytes or more"
    )
  data = np.memmap(path, dtype=np.uint8, mode="r")  # [size]
  return {split: ByteWindows(data[begin:end], seq_len) for split, (begin, end) in bounds.items()}


def source_path(data_config: Any) -> Path:
  """The file `data_config` names: `path` for source "file", the cached gensim Wikipedia XML otherwise."""
  source = config_get(data_config, "source", "file")
  if source not in SOURCES:
    raise ValueError(f"data.source must be one of {SOURCES}, got {source!r}")
  if source == "gensim_enwiki":
    return gensim_enwiki.fetch_enwiki_text()
  path = config_get(data_config, "path")
  if not path:
    raise ValueError("data.path is empty: give a text file, or set data.source='gensim_enwiki' (the embedded text)")
  return Path(path)


def make_text_bytes_pipeline(data_config: Any, *, process_index: int = 0, process_count: int = 1) -> InputPipeline:
  """The text_bytes InputPipeline: next-byte windows of `data_config.path`; see the module docstring.

  data_config keys (attributes or mapping keys): source ("file", the default, or "gensim_enwiki"), path
  (the file, for source "file"), seq_len (T >= 1, targets per window), batch_size, eval_batch_size
  (global), seed (the training order).
  """
  require_keys(data_config, ("path", "seq_len", "batch_size", "eval_batch_size", "seed"), NAME)
  seq_len = check_positive_int(config_get(data_config, "seq_len"), "seq_len")
  check_nonnegative_int(config_get(data_config, "seed"), "seed")  # a clear error before any data is read
  splits = read_splits(source_path(data_config), seq_len)
  info = DatasetInfo(
    name=NAME,
    num_classes=VOCAB_SIZE,
    num_features=1,
    seq_len=seq_len,
    max_length=seq_len,
    split_sizes=types.MappingProxyType({split: len(windows) for split, windows in splits.items()}),
    class_names=CLASS_NAMES,
    vocab_size=VOCAB_SIZE,
  )
  return pipeline_from_config(
    data_config, info, splits, NextTokenCollate(seq_len), process_index=process_index, process_count=process_count
  )
