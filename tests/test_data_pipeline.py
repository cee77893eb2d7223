"""Tests of primal_jax.data.pipeline, core, uea and registry: ordering, host slicing, collation, preprocessing.

Most tests run the full UEA pipeline on the real JapaneseVowels files (fetched
once from the pinned aeon wheel into the default cache, prepared once per
module into a tmp TFDS dir) and compare against the `.ts` parser and float64
numpy; edge cases (all-padding hosts, NaN, singleton classes) use small
lists of dicts, which the pipeline accepts as sources too.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from primal_jax.data import core, pipeline, registry, splits
from primal_jax.tasks.uea import input_pipeline as uea
from primal_jax.tasks.uea.aeon_wheel import DatasetFetchError, fetch_aeon_dataset
from primal_jax.tasks.uea.archive import load_uea
from primal_jax.tasks.uea.tfds_dataset import prepare_uea

KEYS = ("inputs", "mask", "label", "weight", "index")


@pytest.fixture(scope="module")
def jv_reference():
  """(train, test) TimeSeriesDatasets of the real JapaneseVowels files."""
  try:
    root = fetch_aeon_dataset("JapaneseVowels").parent
  except DatasetFetchError as e:
    pytest.skip(f"JapaneseVowels is not cached and the aeon wheel could not be fetched: {e}")
  return load_uea(root, "JapaneseVowels")


@pytest.fixture(scope="module")
def data_dir(jv_reference, tmp_path_factory):
  path = tmp_path_factory.mktemp("tfds")
  prepare_uea("JapaneseVowels", "aeon", path)
  return path


@pytest.fixture
def make_config(data_dir):
  def make(**overrides):
    values = dict(
      task="uea",
      dataset="JapaneseVowels",
      source="aeon",
      data_dir=data_dir,
      batch_size=16,
      eval_batch_size=32,
      seed=0,
      seq_len=0,
      normalization="standardization",
      val_fraction=0.0,
    )
    values.update(overrides)
    return types.SimpleNamespace(**values)

  return make


def concat(batches) -> dict[str, np.ndarray]:
  batches = list(batches)
  return {k: np.concatenate([b[k] for b in batches]) for k in KEYS}


def real(batch: dict[str, np.ndarray]) -> np.ndarray:
  return batch["index"][batch["weight"] > 0]


def toy_split(lengths, labels, channels=3, seed=0, with_index=True):
  rng = np.random.default_rng(seed)
  out = []
  for i, (n, y) in enumerate(zip(lengths, labels, strict=True)):
    example = {"values": rng.normal(size=(n, channels)).astype(np.float32), "label": y}
    if with_index:
      example["index"] = i
    out.append(example)
  return out


# ---- ordering and host slicing ----


def test_train_order_is_a_padded_permutation_of_seed_and_epoch():
  order = pipeline.train_order(37, 8, seed=3, epoch=0)
  assert order.dtype == np.int64 and order.shape == (40,)
  np.testing.assert_array_equal(np.sort(order[:37]), np.arange(37))
  np.testing.assert_array_equal(order[37:], [-1, -1, -1])
  np.testing.assert_array_equal(order, pipeline.train_order(37, 8, seed=3, epoch=0))
  assert not np.array_equal(order, pipeline.train_order(37, 8, seed=3, epoch=1))
  # (seed, epoch) is hashed, not added: seed 3 epoch 1 is not seed 4 epoch 0.
  assert not np.array_equal(pipeline.train_order(37, 8, seed=3, epoch=1), pipeline.train_order(37, 8, seed=4, epoch=0))
  np.testing.assert_array_equal(pipeline.eval_order(5, 4), [0, 1, 2, 3, 4, -1, -1, -1])


@pytest.mark.parametrize("process_count", [1, 2, 4])
def test_host_rows_concatenate_to_the_global_batches(process_count):
  order = pipeline.train_order(30, 8, seed=0, epoch=2)  # [32]
  local = pipeline.local_batch_size(8, process_count)
  per_host = [pipeline.host_rows(order, 8, p, process_count).reshape(-1, local) for p in range(process_count)]
  np.testing.assert_array_equal(np.concatenate(per_host, axis=1).reshape(-1), order)


def test_batch_size_and_host_errors():
  with pytest.raises(ValueError, match="global batch size 10 is not divisible by process_count=4"):
    pipeline.local_batch_size(10, 4)
  with pytest.raises(ValueError, match=r"process_index must lie in \[0, 2\), got 2"):
    pipeline.host_rows(np.arange(8), 8, 2, 2)
  with pytest.raises(ValueError, match="seed must be a non-negative integer, got -1"):
    pipeline.train_order(4, 2, seed=-1, epoch=0)
  with pytest.raises(ValueError, match="global_batch_size must be a positive integer, got 0"):
    pipeline.eval_order(4, 0)


def test_collate_pads_truncates_and_marks_padding():
  examples = toy_split([3, 5, 1], [2, 0, 1], with_index=False)
  collate = core.Collate(seq_len=4, num_features=3)
  batch = collate([(0, examples[0]), (1, examples[1]), (-1, None), (2, examples[2])])
  assert {k: (v.dtype, v.shape) for k, v in batch.items()} == {
    "inputs": (np.float32, (4, 4, 3)),
    "mask": (bool, (4, 4)),
    "label": (np.int32, (4,)),
    "weight": (np.float32, (4,)),
    "index": (np.int64, (4,)),
  }
  np.testing.assert_array_equal(batch["mask"].sum(1), [3, 4, 1, 1])
  np.testing.assert_array_equal(batch["inputs"][0, :3], examples[0]["values"])
  np.testing.assert_array_equal(batch["inputs"][1], examples[1]["values"][:4])  # truncated to seq_len
  assert not batch["inputs"][0, 3:].any() and not batch["inputs"][2].any()
  np.testing.assert_array_equal(batch["mask"][2], [True, False, False, False])  # padding keeps one step
  np.testing.assert_array_equal(batch["label"], [2, 0, 0, 1])
  np.testing.assert_array_equal(batch["weight"], [1, 1, 0, 1])
  np.testing.assert_array_equal(batch["index"], [0, 1, -1, 2])  # positions when examples carry no index

  bad = {"values": np.array([[0.0, np.inf, 0.0]], np.float32), "label": 0, "index": 41}
  with pytest.raises(ValueError, match="example 41 has NaN or infinite values"):
    collate([(0, bad)])
  with pytest.raises(ValueError, match=r"values must have shape \[length >= 1, 3\], got \(2, 2\)"):
    collate([(0, {"values": np.zeros((2, 2), np.float32), "label": 0})])


# ---- the UEA pipeline on JapaneseVowels ----


def test_batch_format_masks_and_values(make_config, jv_reference):
  train_ref, test_ref = jv_reference
  p = registry.get_input_pipeline(make_config(normalization="none"))
  max_length = int(max(train_ref.lengths.max(), test_ref.lengths.max()))
  assert (p.info.num_classes, p.info.num_features, p.info.seq_len, p.info.max_length) == (9, 12, max_length, 29)
  assert dict(p.info.split_sizes) == {"train": 270, "test": 370}
  assert p.info.class_names == tuple(str(i) for i in range(1, 10))
  assert (p.steps_per_epoch, p.num_eval_batches("test")) == (17, 12)

  for batches, ref, size in ((p.train_batches(0), train_ref, 16), (p.eval_batches("test"), test_ref, 32)):
    for batch in batches:
      assert batch["inputs"].shape == (size, 29, 12) and batch["inputs"].dtype == np.float32
      assert batch["mask"].dtype == bool and batch["label"].dtype == np.int32
      for row in range(size):
        i = batch["index"][row]
        if i < 0:
          assert batch["weight"][row] == 0 and batch["label"][row] == 0
          assert batch["mask"][row, 0] and not batch["mask"][row, 1:].any() and not batch["inputs"][row].any()
          continue
        n = ref.lengths[i]
        assert batch["weight"][row] == 1 and batch["label"][row] == ref.labels[i]
        assert batch["mask"][row, :n].all() and not batch["mask"][row, n:].any()
        np.testing.assert_array_equal(batch["inputs"][row, :n], ref.series[i])
        assert not batch["inputs"][row, n:].any()


def test_train_epochs_are_deterministic_and_complete(make_config):
  first = registry.get_input_pipeline(make_config(seed=7))
  second = registry.get_input_pipeline(make_config(seed=7))  # built anew: nothing carried over
  epochs = []
  for epoch in (0, 1):
    batches = list(first.train_batches(epoch))
    assert len(batches) == first.steps_per_epoch
    for a, b in zip(batches, second.train_batches(epoch), strict=True):
      for k in KEYS:
        np.testing.assert_array_equal(a[k], b[k])
    got = concat(batches)
    np.testing.assert_array_equal(np.sort(got["index"][got["weight"] > 0]), np.arange(270))
    assert (got["index"] == -1).sum() == 17 * 16 - 270 == (got["weight"] == 0).sum()
    assert (got["index"][-2:] == -1).all()  # padding only fills the last global batch
    epochs.append(got["index"])
  assert not np.array_equal(epochs[0], epochs[1])


def test_eval_is_file_order_once(make_config):
  p = registry.get_input_pipeline(make_config())
  got = concat(p.eval_batches("test"))
  assert len(got["index"]) == p.num_eval_batches("test") * 32
  np.testing.assert_array_equal(got["index"][:370], np.arange(370))
  assert (got["index"][370:] == -1).all() and not got["weight"][370:].any()
  with pytest.raises(ValueError, match="split must be one of train, test, got 'validation'"):
    p.eval_batches("validation")


def test_two_hosts_see_the_single_host_global_batches(make_config):
  config = make_config(seed=5)
  single = registry.get_input_pipeline(config)
  hosts = [registry.get_input_pipeline(config, process_index=p, process_count=2) for p in range(2)]
  assert all(h.steps_per_epoch == single.steps_per_epoch for h in hosts)
  streams = [
    (single.train_batches(3), [h.train_batches(3) for h in hosts]),
    (single.eval_batches("test"), [h.eval_batches("test") for h in hosts]),
  ]
  for global_batches, host_batches in streams:
    steps = 0
    for g, *parts in zip(global_batches, *host_batches, strict=True):
      assert all(len(part["index"]) == len(g["index"]) // 2 for part in parts)
      for k in KEYS:
        np.testing.assert_array_equal(np.concatenate([part[k] for part in parts]), g[k])
      steps += 1
    assert steps in (single.steps_per_epoch, single.num_eval_batches("test"))


def test_standardization_matches_float64_numpy(make_config, jv_reference):
  train_ref, test_ref = jv_reference
  all_steps = np.concatenate(train_ref.series).astype(np.float64)  # [sum of lengths, 12]
  mean, std = all_steps.mean(0), all_steps.std(0, ddof=1)  # pandas' std, as the release
  p = registry.get_input_pipeline(make_config())
  np.testing.assert_allclose(p.transform.mean, mean, rtol=1e-12)
  np.testing.assert_allclose(p.transform.scale, std, rtol=1e-12)
  for batch in p.eval_batches("test"):  # train statistics on the test split
    for row in np.flatnonzero(batch["weight"]):
      series = test_ref.series[batch["index"][row]]
      expected = ((series - mean) / std).astype(np.float32)
      np.testing.assert_allclose(batch["inputs"][row, : len(series)], expected, rtol=1e-6, atol=1e-6)


def test_fixed_seq_len_truncates(make_config, jv_reference):
  train_ref, _ = jv_reference
  p = registry.get_input_pipeline(make_config(seq_len=10, normalization="none"))
  assert p.info.seq_len == 10 and p.info.max_length == 29
  got = concat(p.eval_batches("train"))
  for row, i in enumerate(got["index"][:270]):
    n = min(train_ref.lengths[i], 10)
    assert got["mask"][row].sum() == n
    np.testing.assert_array_equal(got["inputs"][row, :n], train_ref.series[i][:n])


def test_validation_split_is_stratified_disjoint_and_covering(make_config, jv_reference):
  train_ref, _ = jv_reference
  p = registry.get_input_pipeline(make_config(val_fraction=0.1, seed=0))
  assert dict(p.info.split_sizes) == {"train": 243, "validation": 27, "test": 370}
  train_idx = real(concat(p.eval_batches("train")))
  val_idx = real(concat(p.eval_batches("validation")))
  assert np.all(np.diff(val_idx) > 0)  # file order
  assert not set(train_idx) & set(val_idx)
  np.testing.assert_array_equal(np.sort(np.concatenate([train_idx, val_idx])), np.arange(270))
  np.testing.assert_array_equal(np.bincount(train_ref.labels[val_idx], minlength=9), [3] * 9)
  np.testing.assert_array_equal(np.sort(real(concat(p.train_batches(0)))), np.sort(train_idx))
  assert p.steps_per_epoch == 16
  # Normalisation statistics come from the remaining training cases only.
  rest = np.concatenate([train_ref.series[i] for i in train_idx]).astype(np.float64)
  np.testing.assert_allclose(p.transform.mean, rest.mean(0), rtol=1e-12)
  np.testing.assert_allclose(p.transform.scale, rest.std(0, ddof=1), rtol=1e-12)

  same = registry.get_input_pipeline(make_config(val_fraction=0.1, seed=0))
  np.testing.assert_array_equal(real(concat(same.eval_batches("validation"))), val_idx)
  other = registry.get_input_pipeline(make_config(val_fraction=0.1, seed=1))
  assert not np.array_equal(real(concat(other.eval_batches("validation"))), val_idx)


def test_registry_and_config_errors(make_config):
  assert {"uea", "listops"} <= set(registry.TASKS)
  with pytest.raises(TypeError):
    registry.TASKS["lra"] = uea.make_uea_pipeline
  registered = ", ".join(sorted(registry.TASKS))
  with pytest.raises(ValueError, match=f"unknown task 'lra'; registered tasks: {registered}$"):
    registry.get_input_pipeline(make_config(task="lra"))
  config = make_config()
  del config.seed
  with pytest.raises(ValueError, match="data_config has no attribute 'seed'"):
    registry.get_input_pipeline(config)
  with pytest.raises(ValueError, match="normalization must be one of standardization, none, got 'minmax'"):
    registry.get_input_pipeline(make_config(normalization="minmax"))
  with pytest.raises(ValueError, match=r"val_fraction must lie in \[0, 1\), got 1.0"):
    registry.get_input_pipeline(make_config(val_fraction=1.0))
  with pytest.raises(ValueError, match="seq_len must be a non-negative integer, got -3"):
    registry.get_input_pipeline(make_config(seq_len=-3))
  with pytest.raises(ValueError, match="global batch size 16 is not divisible by process_count=3"):
    registry.get_input_pipeline(make_config(), process_index=0, process_count=3)


# ---- edge cases on lists of dicts ----


def toy_pipeline(train, test, **overrides):
  hosts = {"process_index": overrides.pop("process_index", 0), "process_count": overrides.pop("process_count", 1)}
  values = dict(task="uea", dataset="Toy", source="unused", batch_size=8, eval_batch_size=8, seed=0, **overrides)
  config = types.SimpleNamespace(**values)
  return uea.pipeline_from_splits("Toy", {"train": train, "test": test}, ("a", "b", "c"), config, **hosts)


def test_a_host_may_get_only_padding():
  train, test = toy_split([4, 2, 6], [0, 1, 2]), toy_split([3], [1], seed=1)
  single = toy_pipeline(train, test)
  hosts = [toy_pipeline(train, test, process_index=p, process_count=2) for p in range(2)]
  (g,) = single.train_batches(0)
  h0, h1 = (next(iter(h.train_batches(0))) for h in hosts)
  assert not h1["weight"].any() and (h1["index"] == -1).all() and h1["mask"][:, 0].all()
  for k in KEYS:
    np.testing.assert_array_equal(np.concatenate([h0[k], h1[k]]), g[k])
  assert sorted(real(g)) == [0, 1, 2]


def test_non_finite_values_name_dataset_split_and_example():
  test = toy_split([3, 3, 3], [0, 1, 2], seed=1)
  test[2]["values"][1, 0] = np.nan
  with pytest.raises(ValueError, match="dataset 'Toy', split 'test', example 2: NaN or infinite values"):
    toy_pipeline(toy_split([4, 2], [0, 1]), test)


def test_validation_split_edge_cases():
  labels = np.array([0, 1, 2, 3, 3, 3, 3, 3])  # three singleton classes cannot be stratified
  train, val = splits.validation_split(labels, 0.5, seed=0)
  assert len(val) == 4 and not set(train) & set(val)
  np.testing.assert_array_equal(np.sort(np.concatenate([train, val])), np.arange(8))
  train, val = splits.validation_split(np.array([0, 0, 1, 1]), 0.01, seed=0)
  assert len(val) == 1 and len(train) == 3  # at least one validation case
  with pytest.raises(ValueError, match="at least 2 training cases"):
    splits.validation_split(np.array([0]), 0.5, seed=0)
