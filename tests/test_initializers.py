"""Tests of primal_jax.initializers: the PyTorch release's initialisation (SPEC 7)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from primal_jax.attention import PrimalAttention
from primal_jax.initializers import embedding_init, linear_inits, torch_orthogonal_init, uniform01_init


@pytest.mark.parametrize("shape", [(2, 200, 20), (1, 128, 32), (3, 5, 4)])
def test_torch_orthogonal_rows(shape):
  """[H, a, s] flattened to [H, a*s] has orthonormal rows: unit-Frobenius heads, mutually orthogonal."""
  w = np.asarray(torch_orthogonal_init()(jax.random.key(0), shape), np.float64)
  assert w.shape == shape
  flat = w.reshape(shape[0], -1)
  np.testing.assert_allclose(flat @ flat.T, np.eye(shape[0]), atol=1e-5)
  np.testing.assert_allclose([np.linalg.norm(w[h]) for h in range(shape[0])], 1.0, rtol=1e-5)


def test_torch_orthogonal_is_not_per_head_orthonormal():
  """Unlike nn.initializers.orthogonal, a head's [a, s] block does NOT have orthonormal columns."""
  w = np.asarray(torch_orthogonal_init()(jax.random.key(1), (2, 6, 3)), np.float64)
  assert not np.allclose(w[0].T @ w[0], np.eye(3), atol=1e-2)
  np.testing.assert_allclose(np.trace(w[0].T @ w[0]), 1.0, rtol=1e-5)  # total energy 1, spread over s columns


def test_torch_orthogonal_tall_case():
  """More heads than entries per head (H > a*s): the columns of [H, a*s] are orthonormal instead."""
  w = np.asarray(torch_orthogonal_init()(jax.random.key(2), (6, 2, 1)), np.float64)
  flat = w.reshape(6, 2)
  np.testing.assert_allclose(flat.T @ flat, np.eye(2), atol=1e-5)


def test_torch_orthogonal_dtype_and_keys():
  """Respects the dtype; different keys give different matrices, equal keys equal ones."""
  init = torch_orthogonal_init()
  a = init(jax.random.key(3), (2, 4, 3), jnp.bfloat16)
  assert a.dtype == jnp.bfloat16
  np.testing.assert_array_equal(init(jax.random.key(3), (2, 4, 3)), init(jax.random.key(3), (2, 4, 3)))
  assert not np.allclose(init(jax.random.key(3), (2, 4, 3)), init(jax.random.key(4), (2, 4, 3)))


def test_uniform01():
  """Lambda ~ U[0, 1): range, mean 1/2, variance 1/12."""
  v = np.asarray(uniform01_init()(jax.random.key(0), (100, 100)), np.float64)
  assert v.shape == (100, 100) and v.min() >= 0.0 and v.max() < 1.0
  assert abs(v.mean() - 0.5) < 0.01 and abs(v.var() - 1 / 12) < 0.005


@pytest.mark.parametrize("fan_in", [8, 64, 300])
def test_linear_inits_torch(fan_in):
  """style "torch": kernel and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (nn.Linear defaults)."""
  bound = 1.0 / math.sqrt(fan_in)
  kernel_init, bias_init = linear_inits("torch", fan_in)
  kernel = np.asarray(kernel_init(jax.random.key(0), (fan_in, 512)))
  bias = np.asarray(bias_init(jax.random.key(1), (4096,)))
  for v in (kernel, bias):
    assert np.all(np.abs(v) <= bound)
    assert np.abs(v).max() > 0.98 * bound  # fills the interval
    assert abs(v.std() - bound / math.sqrt(3)) < 0.03 * bound


def test_linear_inits_gpt2_and_flax():
  """ "gpt2": N(0, 0.02) and zero bias; "flax": lecun-normal and zero bias, explicit inits win."""
  kernel_init, bias_init = linear_inits("gpt2", 64)
  k = np.asarray(kernel_init(jax.random.key(0), (256, 256)))
  assert abs(k.std() - 0.02) < 0.001
  np.testing.assert_array_equal(bias_init(jax.random.key(1), (7,)), 0.0)
  kernel_init, bias_init = linear_inits("flax", 64)
  k = np.asarray(kernel_init(jax.random.key(0), (256, 256)))
  assert abs(k.std() - 1 / 16) < 0.003  # lecun normal: 1 / sqrt(fan_in = 256)
  np.testing.assert_array_equal(bias_init(jax.random.key(1), (7,)), 0.0)
  kernel_init, bias_init = linear_inits("flax", 64, nn.initializers.ones, nn.initializers.constant(3.0))
  np.testing.assert_array_equal(kernel_init(jax.random.key(0), (2, 2)), 1.0)
  np.testing.assert_array_equal(bias_init(jax.random.key(0), (2,)), 3.0)
  with pytest.raises(ValueError, match="init_style"):
    linear_inits("kaiming", 64)


def test_embedding_init():
  """Embeddings: torch N(0, 1), gpt2 N(0, 0.02)."""
  assert abs(float(jnp.std(embedding_init("torch")(jax.random.key(0), (128, 128)))) - 1.0) < 0.03
  assert abs(float(jnp.std(embedding_init("gpt2")(jax.random.key(0), (128, 128)))) - 0.02) < 0.001
  with pytest.raises(ValueError, match="init_style"):
    embedding_init("nope")


def test_primal_attention_torch_init_bounds():
  """PrimalAttention(init_style="torch"): each Linear in U(+-1/sqrt(fan_in)); We/Wr torch-orthogonal; Lambda U[0,1)."""
  d, h, s, n = 32, 2, 4, 8
  module = PrimalAttention(num_heads=h, low_rank=s, num_samples=n, init_style="torch")
  params = nn.meta.unbox(module.init(jax.random.key(0), jnp.ones((1, 10, d)))["params"])
  fans = {"query": d, "key": d, "combine": 2 * s, "out": d}
  for name, fan_in in fans.items():
    for leaf in (params[name]["kernel"], params[name]["bias"]):
      assert np.all(np.abs(np.asarray(leaf)) <= 1 / math.sqrt(fan_in) + 1e-7), name
      assert np.any(np.asarray(leaf) != 0), name
  for name in ("We", "Wr"):
    flat = np.asarray(params[name], np.float64).reshape(h, -1)
    np.testing.assert_allclose(flat @ flat.T, np.eye(h), atol=1e-5)
  lam = np.asarray(params["Lambda"])
  assert lam.shape == (h, s) and lam.min() >= 0 and lam.max() < 1
