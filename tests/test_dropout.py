"""primal_jax.dropout: the threefry path is nn.Dropout; the hash path has the right statistics."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from primal_jax.dropout import Dropout, hash_bits, keep_mask
from primal_jax.models.config import make_config


def _apply(module, x, key):
  return module.apply({}, x, deterministic=False, rngs={"dropout": key})


def test_threefry_is_bit_identical_to_flax_dropout():
  x = jax.random.normal(jax.random.key(0), (4, 33, 7))
  key = jax.random.key(3)
  for dims in ((), (1,), (-1,)):
    ours = _apply(Dropout(0.3, broadcast_dims=dims), x, key)
    flax = _apply(nn.Dropout(0.3, broadcast_dims=dims), x, key)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(flax))


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_hash_keep_fraction_is_binomial(rate):
  n = 1 << 20
  kept = np.asarray(keep_mask(jax.random.key(7), rate, (n,), "hash")).mean()
  sigma = np.sqrt(rate * (1 - rate) / n)
  assert abs(kept - (1 - rate)) < 5 * sigma, (kept, 1 - rate, sigma)


def test_hash_bits_are_uniform_and_uncorrelated():
  bits = np.asarray(hash_bits(jax.random.key(11), (256, 1024))).astype(np.uint64)
  # Top byte: chi-square over 256 buckets (df 255; mean 255, sd ~22.6): reject above mean + 6 sd.
  counts = np.bincount((bits >> 24).ravel().astype(np.int64), minlength=256)
  expected = bits.size / 256
  chi2 = ((counts - expected) ** 2 / expected).sum()
  assert chi2 < 255 + 6 * np.sqrt(2 * 255), chi2
  # Every bit position fair within 5 sigma.
  for bit in range(32):
    frac = ((bits >> bit) & 1).mean()
    assert abs(frac - 0.5) < 5 * 0.5 / np.sqrt(bits.size), (bit, frac)
  # Neighbouring elements (flat index i, i+1 and the next row) are uncorrelated.
  u = bits.astype(np.float64) / 2**32 - 0.5
  for a, b in ((u[:, :-1], u[:, 1:]), (u[:-1], u[1:])):
    corr = np.corrcoef(a.ravel(), b.ravel())[0, 1]
    assert abs(corr) < 5 / np.sqrt(a.size), corr


def test_hash_masks_depend_on_the_key_and_only_on_it():
  shape = (64, 512)
  a = np.asarray(keep_mask(jax.random.key(1), 0.5, shape, "hash"))
  again = np.asarray(keep_mask(jax.random.key(1), 0.5, shape, "hash"))
  b = np.asarray(keep_mask(jax.random.fold_in(jax.random.key(1), 1), 0.5, shape, "hash"))
  np.testing.assert_array_equal(a, again)
  # Independent masks at rate 1/2 disagree on half the elements.
  disagree = (a != b).mean()
  assert abs(disagree - 0.5) < 5 * 0.5 / np.sqrt(a.size), disagree


def test_hash_dropout_scales_masks_and_differentiates():
  x = jnp.arange(1, 4097, dtype=jnp.float32).reshape(64, 64)
  key = jax.random.key(5)
  module = Dropout(0.25, impl="hash")
  y = module.apply({}, x, deterministic=False, rng=key)  # an explicit key is used as is
  kept = np.asarray(keep_mask(key, 0.25, x.shape, "hash"))
  np.testing.assert_allclose(np.asarray(y), np.where(kept, np.asarray(x) / 0.75, 0.0), rtol=1e-6)
  grad = jax.grad(lambda v: module.apply({}, v, deterministic=False, rng=key).sum())(x)
  np.testing.assert_allclose(np.asarray(grad), np.where(kept, 1 / 0.75, 0.0), rtol=1e-6)
  # Broadcast dims share one mask along them; deterministic and rate 0 are the identity.
  shared = np.asarray(_apply(Dropout(0.5, broadcast_dims=(0,), impl="hash"), jnp.ones((8, 300)), key))
  chex.assert_trees_all_equal(shared[0], shared[5])
  chex.assert_trees_all_equal(Dropout(0.5, impl="hash").apply({}, x, deterministic=True), x)
  chex.assert_trees_all_equal(_apply(Dropout(0.0, impl="hash"), x, key), x)
  chex.assert_trees_all_equal(_apply(Dropout(1.0, impl="hash"), x, key), jnp.zeros_like(x))


def test_bad_impl_is_named():
  with pytest.raises(ValueError, match="dropout impl must be one of"):
    _apply(Dropout(0.5, impl="philox"), jnp.ones(3), jax.random.key(0))
  with pytest.raises(ValueError, match="dropout_impl"):
    make_config("primalformer", 2, dropout_impl="philox")


def test_models_train_with_hash_dropout():
  """The config option reaches every dropout: masks change with the key, eval is unaffected."""
  config = make_config("primal_plus", 2, dim=16, num_heads=2, hidden_dim=32, vocab_size=11, max_len=12,
                       num_classes=3, attention={"primal": dict(low_rank=3, rank_multi=2)},
                       dropout_impl="hash")  # fmt: skip
  from primal_jax.models.classifier import SequenceClassifier

  model = SequenceClassifier(config)
  tokens = jnp.arange(24, dtype=jnp.int32).reshape(2, 12) % 11
  variables = model.init(jax.random.key(0), tokens)
  run = lambda key: model.apply(variables, tokens, deterministic=False, rngs={"dropout": key})  # noqa: E731
  out1, out2 = run(jax.random.key(1)), run(jax.random.key(2))
  assert not np.allclose(np.asarray(out1), np.asarray(out2))
  chex.assert_trees_all_close(run(jax.random.key(1)), out1)
  chex.assert_tree_all_finite(out1)
