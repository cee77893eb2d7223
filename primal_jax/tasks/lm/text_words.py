"""Word-level language modelling on WikiText-103 (task "text_words"), as fairseq's `transformer_lm` reads it.

`data.path` is the directory of WikiText-103 (or -2), holding `wiki.train.tokens`, `wiki.valid.tokens` and
`wiki.test.tokens` (UTF-8, already tokenised, rare words already `<unk>`). Each line is split on whitespace
and ends with `<eos>` (fairseq-preprocess's convention, so an empty line is one `<eos>`). The vocabulary is
built from the training split alone: `<eos>` and `<unk>` first, then every other word by descending count,
ties alphabetically, so it depends only on the file. A validation or test word outside it becomes `<unk>`
(none in WikiText, whose vocabulary is closed). Each split is one contiguous int32 stream, cut into
windows of `data.seq_len` targets exactly as `text_bytes` cuts bytes (contiguous, non-overlapping; every
token but the first is a target once). The streams and the vocabulary are cached under the cache
directory, keyed by the files' SHA-256, so a second run does not tokenise 100M words again.
"""

from __future__ import annotations

import collections
import json
import types
from pathlib import Path
from typing import Any

import numpy as np

from primal_jax.data.cache import cache_root, key_digest, sha256_file, write_atomically
from primal_jax.data.checks import check_nonnegative_int, check_positive_int, config_get, require_keys
from primal_jax.data.core import DatasetInfo, InputPipeline, pipeline_from_config
from primal_jax.errors import MissingFileError
from primal_jax.tasks.lm.text_bytes import ByteWindows, NextTokenCollate

NAME = "text_words"
SPLIT_FILES = {"train": "wiki.train.tokens", "validation": "wiki.valid.tokens", "test": "wiki.test.tokens"}
EOS, UNK = "<eos>", "<unk>"


def tokenize(text: str) -> list[str]:
  """Whitespace-split words of every line, each line followed by `<eos>`."""
  words: list[str] = []
  for line in text.splitlines():
    words.extend(line.split())
    words.append(EOS)
  return words


def build_vocabulary(words: list[str]) -> list[str]:
  """`<eos>`, `<unk>`, then the other words by descending count, ties alphabetically."""
  counts = collections.Counter(w for w in words if w not in (EOS, UNK))
  return [EOS, UNK, *sorted(counts, key=lambda w: (-counts[w], w))]


def encode(words: list[str], vocabulary: list[str]) -> np.ndarray:
  """int32 ids of `words`; a word outside the vocabulary is `<unk>`."""
  index = {w: i for i, w in enumerate(vocabulary)}
  unk = index[UNK]
  return np.fromiter((index.get(w, unk) for w in words), dtype=np.int32, count=len(words))


def decode(ids, vocabulary: list[str]) -> list[str]:
  return [vocabulary[int(i)] for i in ids]


def load_streams(directory: str | Path, cache_dir: str | Path | None = None) -> tuple[dict[str, np.ndarray], list[str]]:
  """({split: int32 ids}, vocabulary) of a WikiText directory, from the cache when the files are unchanged."""
  directory = Path(directory).expanduser()
  missing = [f for f in SPLIT_FILES.values() if not (directory / f).is_file()]
  if missing:
    raise MissingFileError(f"data.path {str(directory)!r} lacks {missing}: text_words reads a WikiText directory")
  digest = key_digest({split: sha256_file(directory / f) for split, f in SPLIT_FILES.items()}, 16)
  cached = cache_root(cache_dir) / NAME / digest
  if (cached / "vocab.json").is_file() and all((cached / f"{s}.npy").is_file() for s in SPLIT_FILES):
    vocabulary = json.loads((cached / "vocab.json").read_text())
    return {s: np.load(cached / f"{s}.npy") for s in SPLIT_FILES}, vocabulary
  words = {s: tokenize((directory / f).read_text(encoding="utf-8")) for s, f in SPLIT_FILES.items()}
  vocabulary = build_vocabulary(words["train"])
  streams = {s: encode(w, vocabulary) for s, w in words.items()}
  cached.mkdir(parents=True, exist_ok=True)
  for split, ids in streams.items():
    write_atomically(cached / f"{split}.npy", lambda f, ids=ids: np.save(f, ids))
  write_atomically(cached / "vocab.json", json.dumps(vocabulary).encode())
  return streams, vocabulary


def make_text_words_pipeline(data_config: Any, *, process_index: int = 0, process_count: int = 1) -> InputPipeline:
  """The text_words InputPipeline (module doc); keys as `text_bytes` (path is the WikiText directory)."""
  require_keys(data_config, ("path", "seq_len", "batch_size", "eval_batch_size", "seed"), NAME)
  seq_len = check_positive_int(config_get(data_config, "seq_len"), "seq_len")
  check_nonnegative_int(config_get(data_config, "seed"), "seed")  # a clear error before any data is read
  streams, vocabulary = load_streams(config_get(data_config, "path"))
  splits = {split: ByteWindows(ids, seq_len) for split, ids in streams.items()}
  info = DatasetInfo(
    name=NAME,
    num_classes=len(vocabulary),
    num_features=1,
    seq_len=seq_len,
    max_length=seq_len,
    split_sizes=types.MappingProxyType({split: len(windows) for split, windows in splits.items()}),
    class_names=tuple(vocabulary),
    vocab_size=len(vocabulary),
  )
  return pipeline_from_config(
    data_config, info, splits, NextTokenCollate(seq_len), process_index=process_index, process_count=process_count
  )
