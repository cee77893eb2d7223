"""LRA Retrieval: whether two ACL Anthology (AAN) papers are linked by a citation, from their bytes.

The data are the LRA release's tsv files (in lra_release.gz, under
`lra_release/tsv_data/`): `new_aan_pairs.train.tsv`, `.eval.tsv` and
`.test.tsv`, one pair a line, no header, five tab-separated columns read by
LRA's `matching/input_pipeline.py` as

  label (a float, 0 or 1), id1, id2, text1, text2

with `use_quote_delim=False` (quotes are text). Each text is byte-encoded as
`ByteTextEncoder` does (byte b -> id b + 1, 0 = padding, vocabulary 257) and cut
to its first `max_length` ids (4,000 in the Primal-Attention release). The
splits map to train / validation / test.

The files are large (full paper texts), so a split is scanned once for line
offsets and labels and each pair is read back from disk when it is used;
memory stays at a few bytes per pair.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from primal_jax.data.checks import check_positive_int
from primal_jax.data.core import InputPipeline
from primal_jax.errors import MissingFileError
from primal_jax.tasks.lra.catalog import BYTE_VOCAB_SIZE, TEXT_MAX_LENGTH, byte_tokens, lra_settings
from primal_jax.tasks.lra.tokens import token_pipeline

AAN_FILES: Mapping[str, str] = types.MappingProxyType(
  {"train": "new_aan_pairs.train.tsv", "validation": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}
)
AAN_CLASSES: tuple[str, ...] = ("not_linked", "linked")
LRA_RELEASE_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"
LRA_RELEASE_AAN_DIR = "lra_release/tsv_data"
NUM_COLUMNS = 5
_GET_FILES = (
  f"They are in the LRA release tarball {LRA_RELEASE_URL} (a gzipped tar of ~7.7 GB; `tar -xzf lra_release.gz`) "
  f"under {LRA_RELEASE_AAN_DIR}/; pass that directory as data_config.source."
)


def aan_paths(directory: str | Path | None) -> dict[str, Path]:
  """{split: path} of the three AAN tsv files in `directory`; FileNotFoundError naming every missing one."""
  if directory is None:
    expected = ", ".join(AAN_FILES.values())
    raise MissingFileError(
      f"the lra_retrieval task needs data_config.source, a directory holding {expected}. {_GET_FILES}"
    )
  directory = Path(directory).expanduser()
  paths = {split: directory / name for split, name in AAN_FILES.items()}
  missing = [str(p) for p in paths.values() if not p.is_file()]
  if missing:
    raise MissingFileError(f"LRA retrieval (AAN) files missing: {', '.join(missing)}. {_GET_FILES}")
  return paths


def _strip_newline(line: bytes) -> bytes:
  line = line[:-1] if line.endswith(b"\n") else line
  return line[:-1] if line.endswith(b"\r") else line


@dataclasses.dataclass(frozen=True, eq=False)
class AanPairs(Sequence):
  """The pairs of one AAN tsv file: {"tokens", "tokens2": int32 [<= max_length], "label", "index"} per line.

  `index` is the pair's position among the file's data lines. Each access
  opens the file, so the source is safe to read from several threads.
  """

  path: Path
  offsets: np.ndarray  # [n] int64 byte offset of each data line
  lengths: np.ndarray  # [n] int64 its length without the line break
  labels: np.ndarray  # [n] int64 in {0, 1}
  max_length: int

  def __len__(self) -> int:
    return len(self.labels)

  def __getitem__(self, i):  # integer indices only, as the pipeline uses them
    i = int(i)
    with open(self.path, "rb") as f:
      f.seek(int(self.offsets[i]))
      line = f.read(int(self.lengths[i]))
    fields = line.split(b"\t")
    return {
      "tokens": byte_tokens(fields[3], self.max_length),
      "tokens2": byte_tokens(fields[4], self.max_length),
      "label": int(self.labels[i]),
      "index": i,
    }


def read_aan_split(path: str | Path, max_length: int = TEXT_MAX_LENGTH) -> AanPairs:
  """Scans an AAN tsv file once (offsets, labels, column counts); empty lines are skipped.

  Raises:
    ValueError: a line without exactly five columns, a label other than 0/1
      (written as any float, e.g. "1" or "1.0"), or no pairs at all; the
      message names the file and line.
  """
  path = Path(path)
  max_length = check_positive_int(max_length, "max_length")
  offsets, lengths, labels = [], [], []
  offset = 0
  with open(path, "rb") as f:
    for line_number, raw in enumerate(f, start=1):
      line = _strip_newline(raw)
      if line:
        columns = line.count(b"\t") + 1
        if columns != NUM_COLUMNS:
          raise ValueError(
            f"{path}:{line_number}: {columns} tab-separated columns, expected {NUM_COLUMNS} "
            "(label, id1, id2, text1, text2)"
          )
        field = line[: line.index(b"\t")]
        try:
          label = float(field)
        except ValueError:
          label = float("nan")
        if label not in (0.0, 1.0):
          raise ValueError(f"{path}:{line_number}: label {field[:40]!r} is not 0 or 1")
        offsets.append(offset)
        lengths.append(len(line))
        labels.append(int(label))
      offset += len(raw)
  if not labels:
    raise ValueError(f"{path} holds no pairs")
  as_array = lambda values: np.array(values, dtype=np.int64)
  return AanPairs(path, as_array(offsets), as_array(lengths), as_array(labels), max_length)


def make_lra_retrieval_pipeline(data_config: Any, *, process_index: int = 0, process_count: int = 1) -> InputPipeline:
  """The LRA Retrieval task's InputPipeline: inputs, inputs2 int32 [b, seq_len] in [0, 257), 2 classes.

  data_config keys (besides batch_size, eval_batch_size, seed):
    source: the directory holding new_aan_pairs.{train,eval,test}.tsv (required).
    seq_len: bytes kept per document (default 4,000, the release's; 0 means that too).
  """
  cfg = lra_settings(data_config, "lra_retrieval", dataset="aan", seq_len=TEXT_MAX_LENGTH, val_fraction=0.0)
  if cfg.dataset != "aan":
    raise ValueError(f"dataset must be 'aan' for the lra_retrieval task, got {cfg.dataset!r}")
  seq_len = cfg.seq_len or TEXT_MAX_LENGTH
  splits = {split: read_aan_split(path, seq_len) for split, path in aan_paths(cfg.source).items()}
  return token_pipeline(
    "aan",
    splits,
    AAN_CLASSES,
    BYTE_VOCAB_SIZE,
    data_config,
    seq_len=seq_len,
    pairs=True,
    process_index=process_index,
    process_count=process_count,
  )
