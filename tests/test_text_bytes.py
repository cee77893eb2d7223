"""Tests of tasks.lm.text_bytes: enwik8-style splits, next-byte windows, determinism, host sharding, coverage."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest

from primal_jax.data import registry
from primal_jax.tasks.lm import text_bytes

SPLITS = ("train", "validation", "test")


@pytest.fixture
def text_file(tmp_path):
  """1,000 bytes of every value (the 90/5/5 boundaries fall at 900 and 950), as a binary file."""
  data = np.random.default_rng(0).integers(0, 256, 1000, dtype=np.uint8).tobytes()
  path = tmp_path / "text.bin"
  path.write_bytes(data)
  return path, data


def config(path, **overrides):
  values = dict(task="text_bytes", path=str(path), seq_len=16, batch_size=4, eval_batch_size=4, seed=0)
  values.update(overrides)
  return types.SimpleNamespace(**values)


def concat(batches) -> dict[str, np.ndarray]:
  batches = list(batches)
  return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def split_bytes(data: bytes) -> dict[str, bytes]:
  a, b = len(data) * 90 // 100, len(data) * 95 // 100
  return {"train": data[:a], "validation": data[a:b], "test": data[b:]}


def test_info_and_batch_contract(text_file):
  path, _ = text_file
  p = registry.get_input_pipeline(config(path))
  info = p.info
  assert (info.name, info.num_classes, info.vocab_size, info.seq_len) == ("text_bytes", 256, 256, 16)
  # Windows: ceil((L - 1) / T) of the 900 / 50 / 50 bytes.
  assert dict(info.split_sizes) == {"train": 57, "validation": 4, "test": 4}
  assert p.steps_per_epoch == 15
  batch = next(iter(p.train_batches(0)))
  assert sorted(batch) == ["inputs", "targets", "weight"]
  assert batch["inputs"].shape == batch["targets"].shape == batch["weight"].shape == (4, 16)
  assert (batch["inputs"].dtype, batch["targets"].dtype, batch["weight"].dtype) == (np.int32, np.int32, np.float32)


def test_splits_are_byte_exact_and_disjoint(text_file):
  path, data = text_file
  p = registry.get_input_pipeline(config(path))
  expected = split_bytes(data)
  assert b"".join(expected[s] for s in SPLITS) == data  # contiguous, in order, nothing dropped
  for split in SPLITS:
    b = concat(p.eval_batches(split))
    rows = b["weight"].any(axis=1)  # [rows]: real windows
    # Window k holds inputs bytes [kT, kT + T) of the split and targets one byte later: its first input and all
    # its targets spell the split's bytes back.
    stream = [int(b["inputs"][rows][0, 0])]
    stream += b["targets"][b["weight"] > 0].tolist()
    assert bytes(stream) == expected[split], split


def test_targets_are_inputs_shifted_by_one(text_file):
  path, data = text_file
  p = registry.get_input_pipeline(config(path, seq_len=7))
  for split in SPLITS:
    b = concat(p.eval_batches(split))
    real = b["weight"] > 0  # [rows, T]
    both = real[:, 1:] & real[:, :-1]
    np.testing.assert_array_equal(b["targets"][:, :-1][both], b["inputs"][:, 1:][both])  # within a window
    rows = np.flatnonzero(real.any(axis=1))
    last = real[rows[:-1]].sum(axis=1) - 1  # [windows - 1]: full windows end at T - 1
    np.testing.assert_array_equal(b["targets"][rows[:-1], last], b["inputs"][rows[1:], 0])  # across windows
    # Padding: zero inputs, targets and weight, only at the end of the last window and in padding rows.
    assert (b["inputs"][~real] == 0).all() and (b["targets"][~real] == 0).all()
    assert real[rows[:-1]].all()


def test_eval_covers_every_target_exactly_once(text_file):
  path, data = text_file
  for seq_len in (1, 5, 49, 64, 2000):
    p = registry.get_input_pipeline(config(path, seq_len=seq_len, eval_batch_size=8))
    for split, stream in split_bytes(data).items():
      b = concat(p.eval_batches(split))
      assert b["inputs"].shape[0] == 8 * p.num_eval_batches(split)
      # Every byte except the first is a target once, in order; the total weight is their number.
      assert bytes(b["targets"][b["weight"] > 0].tolist()) == stream[1:]
      assert b["weight"].sum() == len(stream) - 1


def test_train_order_is_fixed_by_seed_and_epoch(text_file):
  path, data = text_file

  def epoch_windows(p, epoch):
    b = concat(p.train_batches(epoch))
    return b["inputs"], b["targets"], b["weight"]

  first = registry.get_input_pipeline(config(path, seed=3))
  again = registry.get_input_pipeline(config(path, seed=3))
  for x, y in zip(epoch_windows(first, 0), epoch_windows(again, 0), strict=True):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(epoch_windows(first, 0)[0], epoch_windows(first, 1)[0])
  other = registry.get_input_pipeline(config(path, seed=4))
  assert not np.array_equal(epoch_windows(first, 0)[0], epoch_windows(other, 0)[0])
  # An epoch still visits every training target once, whatever the order.
  _, targets, weight = epoch_windows(first, 1)
  train = split_bytes(data)["train"]
  assert sorted(targets[weight > 0].tolist()) == sorted(train[1:])
  assert weight.sum() == len(train) - 1


def test_hosts_split_every_global_batch(text_file):
  path, _ = text_file
  single = registry.get_input_pipeline(config(path))
  hosts = [registry.get_input_pipeline(config(path), process_index=i, process_count=2) for i in range(2)]
  for name, batches in (("train", lambda p: p.train_batches(1)), ("test", lambda p: p.eval_batches("test"))):
    whole = list(batches(single))
    parts = [list(batches(h)) for h in hosts]
    assert all(len(part) == len(whole) for part in parts), name
    for k, batch in enumerate(whole):
      for key in batch:
        np.testing.assert_array_equal(np.concatenate([parts[0][k][key], parts[1][k][key]]), batch[key])


def test_mapping_config_and_last_batch_padding_rows(text_file):
  path, _ = text_file
  p = text_bytes.make_text_bytes_pipeline(dict(path=str(path), seq_len=16, batch_size=8, eval_batch_size=3, seed=0))
  last = list(p.eval_batches("test"))[-1]  # 4 windows in batches of 3: the second batch has 2 padding rows
  assert last["weight"][1:].sum() == 0 and (last["inputs"][1:] == 0).all()


def test_bad_config(tmp_path, text_file):
  path, _ = text_file
  with pytest.raises(ValueError, match="data_config has no 'path'"):
    text_bytes.make_text_bytes_pipeline(dict(seq_len=4, batch_size=2, eval_batch_size=2, seed=0))
  with pytest.raises(ValueError, match="seq_len must be a positive integer, got 0"):
    registry.get_input_pipeline(config(path, seq_len=0))
  with pytest.raises(ValueError, match="seed must be a non-negative integer"):
    registry.get_input_pipeline(config(path, seed=-1))
  with pytest.raises(FileNotFoundError, match="is not a file"):
    registry.get_input_pipeline(config(tmp_path / "absent.txt"))
  small = tmp_path / "small.txt"
  small.write_bytes(b"x" * 30)
  with pytest.raises(ValueError, match="holds 30 bytes"):
    registry.get_input_pipeline(config(small))


def test_split_bounds_of_enwik8():
  assert text_bytes.split_bounds(100_000_000) == {
    "train": (0, 90_000_000),
    "validation": (90_000_000, 95_000_000),
    "test": (95_000_000, 100_000_000),
  }
  assert text_bytes.num_windows(101, 10) == 10 and text_bytes.num_windows(102, 10) == 11


def test_train_batches_start_skips_consumed_batches_unread(text_file):
  """InputPipeline.train_batches(epoch, start): a resumed run gets the rest of the epoch, reading only that."""
  path, _ = text_file
  p = registry.get_input_pipeline(config(path))
  whole = list(p.train_batches(2))
  reads = []

  class Counting(list):
    def __getitem__(self, k):
      reads.append(k)
      return super().__getitem__(k)

  train = p.sources["train"]
  counted = dataclasses.replace(
    p, sources=types.MappingProxyType({"train": Counting(train[k] for k in range(len(train)))})
  )
  rest = list(counted.train_batches(2, start=11))
  assert len(rest) == len(whole) - 11
  for got, expected in zip(rest, whole[11:], strict=True):
    for key in expected:
      np.testing.assert_array_equal(got[key], expected[key])
  assert len(reads) == len(train) - 11 * 4  # 57 windows, 11 batches of 4 skipped
  assert list(counted.train_batches(2, start=p.steps_per_epoch)) == []
  with pytest.raises(ValueError, match="start must be an integer"):
    p.train_batches(2, start=-1)
