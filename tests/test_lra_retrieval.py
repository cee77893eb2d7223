"""Tests of primal_jax.tasks.lra.retrieval on tiny tsv files written in the LRA release's AAN format.

The format (lra_benchmarks/matching/input_pipeline.py): no header, tab-separated
label (a float), id1, id2, text1, text2, quotes kept as text.
"""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest

from primal_jax.data import registry
from primal_jax.tasks.lra.retrieval import AAN_FILES, make_lra_retrieval_pipeline, read_aan_split

TRAIN = [
  ("1.0", "P00-1001", "P00-1002", "Café ✓ paper", 'He said "no".'),
  ("0", "P00-1003", "P00-1004", "x" * 50, "short"),
  ("0.0", "P00-1005", "P00-1006", "", "empty first text"),
  ("1", "P00-1007", "P00-1008", "abc", "def"),
  ("1.0", "P00-1009", "P00-1010", "ünïcödé", "🙂"),
]
EVAL = [("0", "E1", "E2", "eval one", "eval two"), ("1.0", "E3", "E4", "eval three", "eval four")]
TEST = [("1", "T1", "T2", "test", "pair"), ("0", "T3", "T4", "another", "one"), ("0", "T5", "T6", "last", "line")]


def write_tsv(path: Path, rows, *, line_end: str = "\n") -> None:
  path.write_bytes("".join("\t".join(row) + line_end for row in rows).encode("utf-8"))


@pytest.fixture
def aan_dir(tmp_path) -> Path:
  write_tsv(tmp_path / AAN_FILES["train"], TRAIN)
  write_tsv(tmp_path / AAN_FILES["validation"], EVAL, line_end="\r\n")  # CRLF line breaks are accepted
  write_tsv(tmp_path / AAN_FILES["test"], TEST)
  with open(tmp_path / AAN_FILES["test"], "ab") as f:
    f.write(b"\n")  # a trailing empty line is skipped
  return tmp_path


def config(source, **overrides):
  values = dict(task="lra_retrieval", source=str(source), batch_size=4, eval_batch_size=2, seed=0)
  values.update(overrides)
  return types.SimpleNamespace(**values)


def concat(batches) -> dict[str, np.ndarray]:
  batches = list(batches)
  return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def padded(text: str, seq_len: int) -> np.ndarray:
  data = text.encode("utf-8")[:seq_len]
  out = np.zeros(seq_len, np.int32)
  out[: len(data)] = np.frombuffer(data, np.uint8).astype(np.int32) + 1
  return out


def test_retrieval_pipeline(aan_dir):
  p = registry.get_input_pipeline(config(aan_dir))
  assert p.info.name == "aan" and (p.info.seq_len, p.info.vocab_size, p.info.num_classes) == (4000, 257, 2)
  assert dict(p.info.split_sizes) == {"train": 5, "validation": 2, "test": 3}
  epoch = concat(p.train_batches(0))
  assert set(epoch) == {"inputs", "mask", "inputs2", "mask2", "label", "weight", "index"}
  for key in ("inputs", "inputs2"):
    assert epoch[key].shape == (8, 4000) and epoch[key].dtype == np.int32
  real = epoch["weight"] > 0
  np.testing.assert_array_equal(np.sort(epoch["index"][real]), np.arange(5))  # every pair once per epoch
  for row in np.flatnonzero(real):
    label, _, _, text1, text2 = TRAIN[epoch["index"][row]]
    np.testing.assert_array_equal(epoch["inputs"][row], padded(text1, 4000))
    np.testing.assert_array_equal(epoch["inputs2"][row], padded(text2, 4000))
    assert epoch["label"][row] == int(float(label))
  assert 0 <= epoch["inputs"].min() and epoch["inputs"].max() <= 256
  # "Café ✓": C a f C3 A9 space E2 9C 93, each + 1.
  first = epoch["inputs"][real][np.argsort(epoch["index"][real])][0]
  np.testing.assert_array_equal(first[:9], np.array([0x43, 0x61, 0x66, 0xC3, 0xA9, 0x20, 0xE2, 0x9C, 0x93]) + 1)
  empty = epoch["index"] == 2  # an empty text is a single padding position
  assert epoch["mask"][empty].sum() == 1 and epoch["inputs"][empty].sum() == 0

  validation = concat(p.eval_batches("validation"))
  np.testing.assert_array_equal(validation["inputs2"][1], padded("eval four", 4000))  # the CRLF is not text
  np.testing.assert_array_equal(validation["label"], [0, 1])
  test = concat(p.eval_batches("test"))
  np.testing.assert_array_equal(test["index"], [0, 1, 2, -1])
  np.testing.assert_array_equal(test["label"][:3], [1, 0, 0])

  again = concat(make_lra_retrieval_pipeline(config(aan_dir)).train_batches(0))
  for key in epoch:
    np.testing.assert_array_equal(again[key], epoch[key])  # deterministic given the seed
  assert not np.array_equal(concat(p.train_batches(1))["index"], epoch["index"])


def test_retrieval_truncates_each_document(aan_dir):
  p = make_lra_retrieval_pipeline(config(aan_dir, seq_len=6))
  batch = concat(p.eval_batches("train"))
  assert batch["inputs"].shape == (6, 6)
  np.testing.assert_array_equal(batch["inputs"][1], padded("x" * 50, 6))
  np.testing.assert_array_equal(batch["inputs2"][0], padded('He said "no".', 6))
  pairs = read_aan_split(aan_dir / AAN_FILES["train"], max_length=3)
  assert len(pairs) == 5 and pairs[4]["tokens2"].tolist() == [0xF0 + 1, 0x9F + 1, 0x99 + 1]


def test_missing_files_name_the_paths_and_the_release(tmp_path):
  write_tsv(tmp_path / AAN_FILES["train"], TRAIN)
  with pytest.raises(FileNotFoundError) as err:
    make_lra_retrieval_pipeline(config(tmp_path))
  message = str(err.value)
  assert str(tmp_path / "new_aan_pairs.eval.tsv") in message and str(tmp_path / "new_aan_pairs.test.tsv") in message
  assert "new_aan_pairs.train.tsv" not in message.split(". They")[0]  # only the missing ones
  assert "lra_release.gz" in message and "lra_release/tsv_data" in message
  with pytest.raises(FileNotFoundError, match="needs data_config.source, a directory holding new_aan_pairs"):
    make_lra_retrieval_pipeline(types.SimpleNamespace(task="lra_retrieval", batch_size=4, eval_batch_size=4, seed=0))


@pytest.mark.parametrize(
  "line, error",
  [
    ("1\tid1\tid2\ttext", r"bad.tsv:2: 4 tab-separated columns, expected 5"),
    ("1\tid1\tid2\ttext\ttext\textra", r"bad.tsv:2: 6 tab-separated columns, expected 5"),
    ("2\tid1\tid2\ta\tb", r"bad.tsv:2: label b'2' is not 0 or 1"),
    ("yes\tid1\tid2\ta\tb", r"bad.tsv:2: label b'yes' is not 0 or 1"),
  ],
)
def test_malformed_lines(tmp_path, line, error):
  path = tmp_path / "bad.tsv"
  path.write_text("0\ta\tb\tc\td\n" + line + "\n")
  with pytest.raises(ValueError, match=error):
    read_aan_split(path)


def test_empty_file(tmp_path):
  (tmp_path / "empty.tsv").write_text("\n")
  with pytest.raises(ValueError, match="empty.tsv holds no pairs"):
    read_aan_split(tmp_path / "empty.tsv")
