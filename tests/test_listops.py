"""Tests of tasks.lra.listops: generated labels against the independent evaluator, LRA's text form and limits,
determinism, the cache, and the input pipeline.

Most tests use short expressions (20..200 tokens) so hundreds of examples take
well under a second; a handful at LRA's 500..2000 tokens check the real lengths.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from primal_jax.data import registry
from primal_jax.tasks.lra import listops
from primal_jax.tasks.lra.listops import ListOpsParams, evaluate_listops, listops_text, tokenize_listops
from primal_jax.tasks.lra.listops import input_pipeline as listops_input_pipeline

SMALL = {"min_length": 20, "max_length": 200}


@pytest.fixture(scope="module")
def small() -> listops.ListOpsSplit:
  return listops.generate_listops(400, seed=1, **SMALL)


@pytest.fixture(scope="module")
def lra_sized() -> listops.ListOpsSplit:
  return listops.generate_listops(20, seed=2)


def structure(symbols: list[str]) -> tuple[int, list[int]]:
  """(deepest operator nesting, argument count of every operator) of a well-formed expression."""
  counts, open_ops, deepest = [], [], 0
  for symbol in symbols:
    if open_ops and symbol != "]":
      counts[open_ops[-1]] += 1
    if symbol.startswith("["):
      open_ops.append(len(counts))
      counts.append(0)
      deepest = max(deepest, len(open_ops))
    elif symbol == "]":
      open_ops.pop()
  return deepest, counts


def lra_source(symbols: list[str]) -> str:
  """LRA's `to_string` of LRA's tree tuples, rebuilt from the plain bracket form (a test-only reference)."""

  def parse(i: int):
    if not symbols[i].startswith("["):
      return int(symbols[i]), i + 1
    tree, i = symbols[i], i + 1
    while symbols[i] != "]":
      arg, i = parse(i)
      tree = (tree, arg)
    return (tree, "]"), i + 1

  def to_string(t) -> str:
    return f"( {to_string(t[0])} {to_string(t[1])} )" if isinstance(t, tuple) else str(t)

  return to_string(parse(0)[0])


def test_every_generated_label_matches_the_independent_evaluator(small, lra_sized):
  for data in (small, lra_sized):
    for i in range(len(data)):
      example = data[i]
      assert example["index"] == i
      assert example["tokens"].dtype == np.int32
      assert evaluate_listops(example["tokens"]) == example["label"], data.text(i, parens=False)
      assert evaluate_listops(data.text(i)) == example["label"]


def test_lengths_lie_strictly_between_the_limits(small, lra_sized):
  assert small.lengths.min() > 20 and small.lengths.max() < 200
  assert lra_sized.lengths.min() > 500 and lra_sized.lengths.max() < 2000
  assert [len(small[i]["tokens"]) for i in range(len(small))] == small.lengths.tolist()


def test_depth_and_argument_limits_are_respected_and_reached(small):
  shallow = listops.generate_listops(300, seed=3, min_length=6, max_length=60, max_depth=3, max_args=3)
  for data, max_depth, max_args in ((small, 10, 10), (shallow, 3, 3)):
    deepest, counts = [], []
    for i in range(len(data)):
      depth, args = structure(data.text(i, parens=False).split())
      deepest.append(depth)
      counts.extend(args)
    # LRA counts the root as depth 1 and digit leaves as a level: at most max_depth - 1 nested operators.
    assert max(deepest) == max_depth - 1
    assert min(counts) == 2 and max(counts) == max_args


@pytest.mark.parametrize(
  "expression, value",
  [
    ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
    ("[MIN 3 8 1 ]", 1),
    ("[MAX 0 0 ]", 0),
    ("[MED 3 1 2 ]", 2),
    ("[MED 1 4 ]", 2),  # even count: floor of the mean of the middle two (2.5); median_low would say 1
    ("[MED 9 8 ]", 8),
    ("[MED 0 9 9 0 ]", 4),
    ("[MED 1 2 3 4 5 6 7 8 ]", 4),
    ("[SM 5 7 ]", 2),
    ("[SM 9 [SM 9 9 ] 4 ]", 1),  # 9 + (18 mod 10) + 4 = 21
    ("[SM [MAX 1 [MED 2 6 ] ] 9 ]", 3),  # MED 4, MAX 4, 4 + 9 = 13
    ("7", 7),
  ],
)
def test_hand_computed_values(expression, value):
  assert evaluate_listops(expression) == value
  assert evaluate_listops(listops_text(tokenize_listops(expression))) == value  # LRA's text form
  assert evaluate_listops(tokenize_listops(expression)) == value


def test_median_is_lras_floored_numpy_median():
  rng = np.random.default_rng(0)
  for _ in range(300):
    args = rng.integers(0, 10, size=rng.integers(1, 11)).tolist()
    assert evaluate_listops(f"[MED {' '.join(map(str, args))} ]") == int(np.median(args))


def test_text_is_lras_source_form_and_tokenizes_back(small):
  assert listops_text(tokenize_listops("[MAX 2 9 [MIN 4 7 ] 0 ]")) == (
    "( ( ( ( ( [MAX 2 ) 9 ) ( ( ( [MIN 4 ) 7 ) ] ) ) 0 ) ] )"
  )
  assert listops_text([5]) == "4"
  for i in range(50):
    tokens = small[i]["tokens"]
    plain = small.text(i, parens=False)
    assert small.text(i) == lra_source(plain.split())
    np.testing.assert_array_equal(tokenize_listops(small.text(i)), tokens)
    np.testing.assert_array_equal(tokenize_listops(plain), tokens)


def test_vocabulary_table():
  assert listops.VOCAB_SIZE == 16 and listops.PAD_ID == 0
  assert [listops.TOKEN_IDS[str(d)] for d in range(10)] == list(range(1, 11))
  assert [listops.TOKEN_IDS[t] for t in ("[MIN", "[MAX", "[MED", "[SM", "]")] == [11, 12, 13, 14, 15]
  assert listops.CLASS_NAMES == tuple("0123456789")


def test_generation_is_deterministic_by_seed(small):
  again = listops.generate_listops(400, seed=1, **SMALL)
  for name in ("tokens", "offsets", "labels"):
    np.testing.assert_array_equal(getattr(again, name), getattr(small, name))
  other = listops.generate_listops(400, seed=2, **SMALL)
  assert not np.array_equal(other.labels, small.labels)
  assert {small.text(i) for i in range(len(small))}.isdisjoint({other.text(i) for i in range(len(other))})
  # The splits' streams are not generate_listops' stream of the same seed.
  test_split = listops.generate_listops_splits({"test": 400}, seed=1, params=ListOpsParams(**SMALL))["test"]
  assert not np.array_equal(test_split.labels, small.labels)


def test_splits_are_disjoint_and_evaluation_splits_ignore_the_train_size():
  params = ListOpsParams(min_length=3, max_length=12)  # few distinct expressions, so collisions would show
  sizes = {"train": 300, "validation": 50, "test": 60}
  splits = listops.generate_listops_splits(sizes, seed=4, params=params)
  texts = {name: [data.text(i) for i in range(len(data))] for name, data in splits.items()}
  assert {name: len(t) for name, t in texts.items()} == sizes
  everything = [t for split in texts.values() for t in split]
  assert len(set(everything)) == len(everything)
  fewer = listops.generate_listops_splits({**sizes, "train": 100}, seed=4, params=params)
  for name in ("validation", "test"):
    np.testing.assert_array_equal(fewer[name].tokens, splits[name].tokens)


def test_labels_cover_all_classes_without_a_dominant_one():
  labels = listops.generate_listops(2000, seed=5, **SMALL).labels
  freq = np.bincount(labels, minlength=10) / len(labels)
  # MIN pulls towards 0 and MAX towards 9 (LRA's ListOps is not uniform either), yet every class is common.
  assert freq.min() > 0.04 and freq.max() < 0.3, freq


def test_cache_round_trip(tmp_path, monkeypatch):
  sizes = {"train": 40, "validation": 5, "test": 7}
  params = ListOpsParams(**SMALL)
  first = listops.load_listops_splits(sizes, seed=0, params=params, cache_dir=tmp_path)
  folder = listops.listops_cache_path(sizes, seed=0, params=params, cache_dir=tmp_path)
  assert folder.parent == tmp_path / "listops"
  assert sorted(p.name for p in folder.iterdir()) == ["params.json", "splits.npz"]

  def no_generation(*args, **kwargs):
    raise AssertionError("a cached dataset was generated again")

  with monkeypatch.context() as m:
    m.setattr(listops_input_pipeline, "generate_listops_splits", no_generation)
    again = listops.load_listops_splits(sizes, seed=0, params=params, cache_dir=tmp_path)
  for name in first:
    for field in ("tokens", "offsets", "labels"):
      np.testing.assert_array_equal(getattr(again[name], field), getattr(first[name], field))
  assert listops.listops_cache_path(sizes, seed=1, params=params, cache_dir=tmp_path) != folder
  assert listops.listops_cache_path({**sizes, "test": 8}, seed=0, params=params, cache_dir=tmp_path) != folder

  (folder / "splits.npz").write_bytes(b"not a zip file")  # a damaged cache is regenerated, not trusted
  repaired = listops.load_listops_splits(sizes, seed=0, params=params, cache_dir=tmp_path)
  np.testing.assert_array_equal(repaired["train"].tokens, first["train"].tokens)


def test_cache_dir_defaults_to_the_data_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("PRIMAL_JAX_DATA", str(tmp_path))
  assert listops.listops_cache_path(seed=0).parent == tmp_path / "listops"


@pytest.mark.parametrize(
  "expression, message",
  [
    ("[MAX 1 2", "unclosed operators"),
    ("[MAX 1 2 ] ]", "unmatched ']'"),
    ("]", "unmatched ']'"),
    ("[MAX ]", "no arguments"),
    ("[SM 1 [MIN ] ]", "no arguments"),
    ("[FOO 1 ]", "unknown token"),
    ("[MAX 1 2]", "unknown token"),
    ("", "empty"),
    ("( )", "empty"),
    ("1 2", "2 top-level values"),
    ("[MIN 1 ] 3", "2 top-level values"),
    ("( ( [MAX 1 ) ] ) )", "unmatched '\\)'"),
    ("( ( [MAX 1 ) ] ", "unclosed '\\('"),
    ([12, 2, 0, 3, 15], "padding"),
    ([12, 2, 99, 15], "unknown token id 99"),
    ([12, -1, 15], "unknown token id -1"),
    (np.array([[12, 2, 15]]), "1-D"),
    (np.array([12.0, 2.0, 15.0]), "integer"),
    ([0, 0], "empty"),
  ],
)
def test_malformed_expressions_raise(expression, message):
  with pytest.raises(ValueError, match=message):
    evaluate_listops(expression)


def test_trailing_padding_is_not_part_of_the_expression():
  assert evaluate_listops([12, 2, 3, 15, 0, 0]) == 2
  assert evaluate_listops(np.array([5], dtype=np.uint8)) == 4


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"min_length": -1}, "min_length must be >= 0"),
    ({"max_depth": 1}, "max_depth must be >= 2"),
    ({"max_args": 1}, "max_args must be >= 2"),
    ({"min_length": 10, "max_length": 11}, "max_length must be >= min_length \\+ 2"),
    ({"max_length": 2000.0}, "max_length must be an integer"),
    ({"min_length": 10, "max_length": 100, "max_depth": 2, "max_args": 5}, "no expression"),
  ],
)
def test_parameter_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    ListOpsParams(**kwargs)


def test_generation_argument_errors():
  with pytest.raises(ValueError, match="num_examples must be a non-negative integer"):
    listops.generate_listops(-1, seed=0)
  with pytest.raises(ValueError, match="seed must be a non-negative integer"):
    listops.generate_listops(1, seed=-3)
  with pytest.raises(ValueError, match="sizes keys must be among"):
    listops.generate_listops_splits({"dev": 3}, seed=0)
  with pytest.raises(ValueError, match="too few distinct expressions"):  # only "[OP d d ]" has 4 tokens: 400 of them
    listops.generate_listops(401, seed=0, min_length=3, max_length=5)
  assert len(listops.generate_listops(0, seed=0)) == 0


def make_config(tmp_path, **overrides) -> types.SimpleNamespace:
  values = {
    "task": "listops",
    "num_train": 45,
    "num_validation": 10,
    "num_test": 13,
    "seq_len": 160,
    "batch_size": 8,
    "eval_batch_size": 6,
    "seed": 0,
    "data_dir": tmp_path,
    **SMALL,
  }
  values.update(overrides)
  return types.SimpleNamespace(**values)


def check_batches(batches, source, seq_len) -> list[int]:
  """Checks shapes, tokens, masks and labels against `source`; returns the real indices seen."""
  seen = []
  for batch in batches:
    assert batch["inputs"].dtype == np.int32 and batch["inputs"].shape[1] == seq_len
    assert batch["mask"].shape == batch["inputs"].shape
    for row in range(batch["inputs"].shape[0]):
      index = int(batch["index"][row])
      if index < 0:
        assert batch["weight"][row] == 0
        continue
      example = source[index]
      n = min(len(example["tokens"]), seq_len)
      assert batch["mask"][row].sum() == n and batch["mask"][row, :n].all()
      np.testing.assert_array_equal(batch["inputs"][row, :n], example["tokens"][:n])
      assert not batch["inputs"][row, n:].any()
      assert batch["label"][row] == example["label"] and batch["weight"][row] == 1
      seen.append(index)
  return seen


def test_pipeline_batches_cover_every_example_once(tmp_path):
  config = make_config(tmp_path)
  pipe = registry.get_input_pipeline(config)
  info = pipe.info
  assert (info.num_classes, info.vocab_size, info.seq_len, info.class_names) == (10, 16, 160, listops.CLASS_NAMES)
  assert dict(info.split_sizes) == {"train": 45, "validation": 10, "test": 13}
  assert pipe.steps_per_epoch == 6
  for epoch in (0, 1):
    batches = list(pipe.train_batches(epoch))
    assert len(batches) == 6 and all(b["inputs"].shape == (8, 160) for b in batches)
    assert sorted(check_batches(batches, pipe.sources["train"], 160)) == list(range(45))
  for split, n in (("validation", 10), ("test", 13)):
    batches = list(pipe.eval_batches(split))
    assert all(b["inputs"].shape == (6, 160) for b in batches)
    assert check_batches(batches, pipe.sources[split], 160) == list(range(n))  # source order

  # Two hosts together see the one-host global batches.
  hosts = [registry.get_input_pipeline(config, process_index=p, process_count=2) for p in (0, 1)]
  one = list(pipe.train_batches(0))
  for step, parts in enumerate(zip(*(h.train_batches(0) for h in hosts), strict=True)):
    np.testing.assert_array_equal(np.concatenate([p["index"] for p in parts]), one[step]["index"])


def test_pipeline_seq_len_zero_takes_the_longest_and_truncation_keeps_the_prefix(tmp_path):
  pipe = registry.get_input_pipeline(make_config(tmp_path, seq_len=0, num_validation=0))
  longest = max(int(pipe.sources[s].lengths.max()) for s in ("train", "test"))
  assert pipe.info.seq_len == longest and "validation" not in pipe.sources
  short = registry.get_input_pipeline(make_config(tmp_path, seq_len=16))
  batch = next(iter(short.eval_batches("test")))
  check_batches([batch], short.sources["test"], 16)
  assert batch["mask"].all()


def test_pipeline_data_seed_fixes_the_dataset_apart_from_the_order_seed(tmp_path):
  a = registry.get_input_pipeline(make_config(tmp_path, seed=0, data_seed=7))
  b = registry.get_input_pipeline(make_config(tmp_path, seed=1, data_seed=7))
  c = registry.get_input_pipeline(make_config(tmp_path, seed=1))
  np.testing.assert_array_equal(a.sources["train"].tokens, b.sources["train"].tokens)
  assert not np.array_equal(b.sources["train"].labels, c.sources["train"].labels)


def test_pipeline_config_errors(tmp_path):
  config = make_config(tmp_path)
  del config.batch_size
  with pytest.raises(ValueError, match="batch_size"):
    registry.get_input_pipeline(config)
  with pytest.raises(ValueError, match="num_train must be a positive integer"):
    registry.get_input_pipeline(make_config(tmp_path, num_train=0))
  with pytest.raises(ValueError, match="num_test must be a non-negative integer"):
    registry.get_input_pipeline(make_config(tmp_path, num_test=-1))
  with pytest.raises(ValueError, match="max_depth must be >= 2"):
    registry.get_input_pipeline(make_config(tmp_path, max_depth=1))
