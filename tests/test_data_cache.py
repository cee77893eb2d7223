"""Tests of primal_jax.data.cache, checks and registry: cache root, atomic writes, argument checks, registration."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest

from primal_jax.data import cache, checks, registry


def test_default_cache_dir(monkeypatch, tmp_path):
  monkeypatch.setenv("PRIMAL_JAX_DATA", str(tmp_path / "data"))
  assert cache.default_cache_dir() == tmp_path / "data"
  assert cache.cache_root(None) == tmp_path / "data"
  assert cache.default_data_dir() == tmp_path / "data" / "tfds"
  monkeypatch.delenv("PRIMAL_JAX_DATA")
  assert cache.default_cache_dir() == Path.home() / ".cache" / "primal_jax"
  assert cache.cache_root("~/x") == Path.home() / "x"


def test_write_atomically_leaves_no_temporary_file(tmp_path):
  target = tmp_path / "a.bin"
  cache.write_atomically(target, b"first")
  cache.write_atomically(target, lambda f: f.write(b"second"))
  assert target.read_bytes() == b"second"
  assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]

  def fail(f):
    f.write(b"half")
    raise RuntimeError("interrupted")

  with pytest.raises(RuntimeError, match="interrupted"):
    cache.write_atomically(target, fail)
  assert target.read_bytes() == b"second"  # the old file stays whole
  assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]


def test_npz_round_trip_and_damage(tmp_path):
  path = tmp_path / "sub" / "x.npz"
  arrays = {"a": np.arange(5, dtype=np.int64), "b": np.ones((2, 3), np.uint8)}
  cache.write_npz(path, arrays)
  back = cache.read_npz(path)
  assert sorted(back) == ["a", "b"]
  for name, value in arrays.items():
    np.testing.assert_array_equal(back[name], value)
    assert back[name].dtype == value.dtype
  path.write_bytes(b"not a zip")
  with pytest.raises(cache.READ_ERRORS):
    cache.read_npz(path)
  with pytest.raises(cache.READ_ERRORS):
    cache.read_npz(tmp_path / "absent.npz")


def test_checksums_and_digest(tmp_path):
  path = tmp_path / "f"
  path.write_bytes(b"abc")
  sha = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
  assert cache.sha256_file(path) == cache.sha256_bytes(b"abc") == sha
  assert cache.key_digest({"b": 1, "a": 2}, 16) == cache.key_digest({"a": 2, "b": 1}, 16)
  assert len(cache.key_digest({"a": 1}, 20)) == 20


@pytest.mark.parametrize("value", [-1, 1.0, True, "3", None])
def test_nonnegative_int_rejects(value):
  with pytest.raises(ValueError, match="count must be a non-negative integer"):
    checks.check_nonnegative_int(value, "count")


def test_checks_normalise():
  assert type(checks.check_nonnegative_int(np.int64(3), "n")) is int
  assert checks.check_positive_int(np.uint8(1), "n") == 1
  with pytest.raises(ValueError, match="n must be a positive integer, got 0"):
    checks.check_positive_int(0, "n")
  with pytest.raises(ValueError, match="size must be an integer >= 8, got 7"):
    checks.check_int_at_least(7, "size", 8)
  with pytest.raises(ValueError, match=r"val_fraction must lie in \[0, 1\), got 1"):
    checks.check_fraction(1, "val_fraction")
  assert checks.config_get({"a": 1}, "a") == checks.config_get(types.SimpleNamespace(a=1), "a") == 1
  with pytest.raises(ValueError, match="data_config has no 'seed'; the toy task needs batch_size, seed"):
    checks.require_keys({"batch_size": 2}, ("batch_size", "seed"), "toy")


def test_register_a_task():
  built = []

  def factory(data_config, *, process_index=0, process_count=1):
    built.append((data_config.task, process_index, process_count))
    return "pipeline"

  config = types.SimpleNamespace(task="toy_regression")
  with pytest.raises(ValueError, match="unknown task 'toy_regression'"):
    registry.get_input_pipeline(config)
  with registry.registered_task("toy_regression", factory):
    assert "toy_regression" in registry.TASKS
    assert registry.get_input_pipeline(config, process_index=1, process_count=2) == "pipeline"
    with pytest.raises(ValueError, match="already registered"):
      registry.register_task("toy_regression", lambda data_config, **hosts: None)
  assert built == [("toy_regression", 1, 2)]
  assert "toy_regression" not in registry.TASKS
  with pytest.raises(ValueError, match="a task must be callable"):
    registry.register_task("x", None)
  with pytest.raises(ValueError, match="no task is registered as .toy_regression."):
    registry.unregister_task("toy_regression")


def test_replacing_a_builtin_task_is_undone():
  original = registry.TASKS["uea"]
  registry.register_task("uea", lambda config, **hosts: None, replace=True)
  try:
    assert registry.TASKS["uea"] is not original
  finally:
    registry.unregister_task("uea")
  assert registry.TASKS["uea"] is original


def test_package_exports():
  import primal_jax.data as data

  for name in data.__all__:
    assert getattr(data, name) is not None
  assert data.get_input_pipeline is registry.get_input_pipeline
