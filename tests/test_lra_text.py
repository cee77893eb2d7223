"""Tests of primal_jax.tasks.lra.text: byte-level IMDB from the TFDS catalog, faked offline.

`tfds.testing.mock_data` serves random `imdb_reviews` examples through
`as_data_source` without TensorFlow (ASCII text as str, the same examples in
every split); a tiny real ArrayRecord `imdb_reviews` written with the catalog
builder's feature spec checks the stored form (UTF-8 bytes) with non-ASCII text.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from primal_jax.data import registry
from primal_jax.tasks.lra.text import IMDB_CLASSES, make_lra_text_pipeline

tfds = pytest.importorskip("tensorflow_datasets")


def concat(batches) -> dict[str, np.ndarray]:
  batches = list(batches)
  return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def config(**overrides):
  values = dict(task="lra_text", batch_size=4, eval_batch_size=8, seed=0)
  values.update(overrides)
  return types.SimpleNamespace(**values)


def test_text_pipeline_from_mock_data(tmp_path):
  with tfds.testing.mock_data(num_examples=10):
    p = registry.get_input_pipeline(config(data_dir=str(tmp_path)))
    mock = tfds.data_source("imdb_reviews", split="train")
    texts = [mock[i]["text"] for i in range(10)]
    labels = np.array([int(mock[i]["label"]) for i in range(10)])
    epochs = [concat(p.train_batches(e)) for e in (0, 1)]
    again = concat(make_lra_text_pipeline(config(data_dir=str(tmp_path))).train_batches(0))
    validation = concat(p.eval_batches("validation"))
    test = concat(p.eval_batches("test"))
  assert p.info.name == "imdb_reviews" and p.info.class_names == IMDB_CLASSES
  assert (p.info.seq_len, p.info.vocab_size, p.info.num_classes) == (4000, 257, 2)
  assert dict(p.info.split_sizes) == {"train": 10, "validation": 10, "test": 10}  # LRA validates on test
  expected = np.zeros((10, 4000), np.int32)
  for i, text in enumerate(texts):
    data = text.encode("utf-8")
    expected[i, : len(data)] = np.frombuffer(data, np.uint8).astype(np.int32) + 1
  epoch = epochs[0]
  assert epoch["inputs"].shape == (12, 4000) and epoch["inputs"].dtype == np.int32 and epoch["mask"].dtype == bool
  real = epoch["weight"] > 0
  np.testing.assert_array_equal(np.sort(epoch["index"][real]), np.arange(10))  # every example once
  np.testing.assert_array_equal(epoch["inputs"][real], expected[epoch["index"][real]])
  np.testing.assert_array_equal(epoch["mask"][real], expected[epoch["index"][real]] > 0)
  np.testing.assert_array_equal(epoch["label"][real], labels[epoch["index"][real]])
  np.testing.assert_array_equal(again["index"], epoch["index"])  # deterministic
  assert not np.array_equal(epochs[1]["index"], epoch["index"])
  for split in (validation, test):
    np.testing.assert_array_equal(split["inputs"][:10], expected)


def test_text_truncation_and_val_fraction(tmp_path):
  with tfds.testing.mock_data(num_examples=10):
    p = make_lra_text_pipeline(config(data_dir=str(tmp_path), seq_len=8, val_fraction=0.2))
    mock = tfds.data_source("imdb_reviews", split="train")
    first = [np.frombuffer(mock[i]["text"].encode(), np.uint8)[:8].astype(np.int32) + 1 for i in range(10)]
    validation = concat(p.eval_batches("validation"))
  assert dict(p.info.split_sizes) == {"train": 8, "validation": 2, "test": 10} and p.info.seq_len == 8
  np.testing.assert_array_equal(validation["index"][:2], [8, 9])  # the tail of train
  np.testing.assert_array_equal(validation["inputs"][:2], np.stack(first[8:]))  # mock texts have >= 10 bytes
  with pytest.raises(ValueError, match="dataset must be one of imdb_reviews for the lra_text task, got 'yelp'"):
    make_lra_text_pipeline(config(dataset="yelp"))


def test_text_from_real_array_record_files(tmp_path):
  texts = ["\u00c7a a \u00e9t\u00e9 \U0001f44d", "plain", ""]  # "Ça a été 👍", precomposed

  class ImdbReviews(tfds.builder_cls("imdb_reviews"), skip_registration=True):
    code_path = None  # no checksums file lookup (it needs importlib_resources)

    def _split_generators(self, dl_manager):
      return {split: self._examples() for split in ("train", "test", "unsupervised")}

    def _examples(self):
      for i, text in enumerate(texts):
        yield i, {"text": text, "label": i % 2}

  ImdbReviews(data_dir=str(tmp_path), config="plain_text", file_format="array_record").download_and_prepare()
  p = make_lra_text_pipeline(config(data_dir=str(tmp_path), download=False))
  raw = tfds.data_source("imdb_reviews", split="test", data_dir=str(tmp_path), download=False)
  assert isinstance(raw[0]["text"], bytes)  # stored and read back as UTF-8 bytes
  test = concat(p.eval_batches("test"))
  by_text = {raw[i]["text"].decode("utf-8"): i for i in range(3)}  # TFDS shuffles records when writing
  row = by_text[texts[0]]
  # Ç = C3 87 (precomposed), é = C3 A9, 👍 = F0 9F 91 8D.
  expected = [0xC3, 0x87, 0x61, 0x20, 0x61, 0x20, 0xC3, 0xA9, 0x74, 0xC3, 0xA9, 0x20, 0xF0, 0x9F, 0x91, 0x8D]
  np.testing.assert_array_equal(test["inputs"][row, : len(expected)], np.array(expected) + 1)
  assert test["mask"][row].sum() == len(expected)
  empty = by_text[""]
  assert test["inputs"][empty].sum() == 0 and test["mask"][empty].tolist() == [True] + [False] * 3999
