"""Tests of primal_jax.tasks.lra.catalog: byte tokens, config reading, LRA's tail split, TFDS catalog sources.

Catalog datasets are faked with `tfds.testing.mock_data`, which in
tensorflow-datasets 4.9.10 serves `as_data_source` without TensorFlow (random
examples generated from the catalog builder's feature spec, the same for every
split); the not-prepared path uses an empty tmp data_dir.
"""

from __future__ import annotations

import types

import ml_collections
import numpy as np
import pytest

from primal_jax.data import registry
from primal_jax.data.sources.tfds_catalog import catalog_splits
from primal_jax.data.splits import holdout_tail
from primal_jax.tasks.lra import catalog as lra_catalog
from primal_jax.tasks.lra.catalog import BYTE_VOCAB_SIZE, byte_tokens, lra_settings

tfds = pytest.importorskip("tensorflow_datasets")


def test_byte_tokens_of_utf8_text_with_non_ascii_characters():
  text = "Né ✓ 🙂"  # 1-, 2-, 3- and 4-byte UTF-8 characters
  expected = [
    0x4E + 1,  # N
    0xC3 + 1,  # é = C3 A9
    0xA9 + 1,
    0x20 + 1,
    0xE2 + 1,  # ✓ = E2 9C 93
    0x9C + 1,
    0x93 + 1,
    0x20 + 1,
    0xF0 + 1,  # 🙂 = F0 9F 99 82
    0x9F + 1,
    0x99 + 1,
    0x82 + 1,
  ]
  tokens = byte_tokens(text, 4000)
  assert tokens.dtype == np.int32
  np.testing.assert_array_equal(tokens, expected)
  np.testing.assert_array_equal(byte_tokens(text.encode("utf-8"), 4000), expected)  # bytes as stored by TFDS
  np.testing.assert_array_equal(byte_tokens(text, 3), expected[:3])  # cuts bytes, even inside a character
  assert byte_tokens(bytes(range(256)), 4000).tolist() == list(range(1, BYTE_VOCAB_SIZE))
  np.testing.assert_array_equal(byte_tokens("", 4000), [0])  # an empty document is one padding id
  with pytest.raises(ValueError, match="max_length must be a positive integer"):
    byte_tokens("x", 0)


def test_holdout_tail_is_lra_train_90_percent_split():
  source = [{"tokens": np.ones(1, np.int32), "label": 0, "index": i} for i in range(50000)]
  train, validation = holdout_tail(source, 0.1)
  assert (len(train), len(validation)) == (45000, 5000)  # LRA's CIFAR-10 train[:90%] / train[90%:]
  assert train[0]["index"] == 0 and train[44999]["index"] == 44999
  assert validation[0]["index"] == 45000 and validation[4999]["index"] == 49999
  small_train, small_val = holdout_tail(source[:3], 0.01)  # at least one example on each side
  assert (len(small_train), len(small_val)) == (2, 1)
  with pytest.raises(ValueError, match=r"val_fraction must lie in \[0, 1\), got 1.0"):
    holdout_tail(source, 1.0)
  with pytest.raises(ValueError, match="at least 2 training examples"):
    holdout_tail(source[:1], 0.5)


def test_settings_from_config_dict_and_namespace(tmp_path):
  config = ml_collections.ConfigDict(dict(task="lra_text", batch_size=8, eval_batch_size=16, seed=0, seq_len=4000))
  cfg = lra_settings(config, "lra_text", dataset="imdb_reviews", seq_len=4000, val_fraction=0.0)
  assert (cfg.dataset, cfg.source, cfg.seq_len, cfg.val_fraction) == ("imdb_reviews", None, 4000, 0.0)
  assert cfg.download
  assert cfg.data_dir == lra_catalog.default_data_dir()
  space = types.SimpleNamespace(batch_size=8, eval_batch_size=8, data_dir=str(tmp_path), source="", download=False)
  cfg = lra_settings(space, "lra_image", dataset="fashion_mnist", seq_len=0, val_fraction=0.1)
  assert (cfg.dataset, cfg.source, cfg.data_dir, cfg.download) == ("fashion_mnist", None, tmp_path, False)
  with pytest.raises(ValueError, match="data_config has no 'eval_batch_size'; the lra_text task needs"):
    lra_settings(types.SimpleNamespace(batch_size=8), "lra_text", dataset="x", seq_len=1, val_fraction=0.0)
  with pytest.raises(ValueError, match="seq_len must be a non-negative integer"):
    lra_settings(
      types.SimpleNamespace(batch_size=8, eval_batch_size=8, seq_len=-1), "t", dataset="x", seq_len=1, val_fraction=0
    )


def test_registry_has_the_lra_tasks():
  assert {"lra_image", "lra_text", "lra_retrieval"} <= set(registry.TASKS)


def test_catalog_splits_from_mock_data(tmp_path):
  with tfds.testing.mock_data(num_examples=6):
    sources = catalog_splits("cifar10", ("train", "test"), tmp_path)
    assert {split: len(s) for split, s in sources.items()} == {"train": 6, "test": 6}
    example = sources["train"][2]
    assert example["image"].shape == (32, 32, 3) and example["image"].dtype == np.uint8
    assert 0 <= int(example["label"]) < 10


def test_catalog_dataset_not_prepared_and_no_download(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"'cifar10' is not prepared under .* and download=False.*tfds build"):
    catalog_splits("cifar10", ("train",), tmp_path, download=False)
