"""Dropout with a choice of mask generator: JAX's threefry (Flax's `nn.Dropout`) or a counter hash.

Why: on CPU the threefry bits behind `jax.random.bernoulli` cost ~45 integer
operations per element, and in the LRA models at N = 4,096 they are about a
third of a training step (and more for softmax, whose N x N weights are
dropped). `impl="hash"` draws the mask from a counter-based hash instead:
element i keeps iff `mix(mix(i + k0) ^ k1) >= rate * 2**32`, with the two
32-bit words k0, k1 taken from the usual PRNG key (one threefry call per
mask, not per element) and `mix` the "lowbias32" integer finaliser (two
multiply-xorshift rounds). Masks remain a deterministic function of the key,
independent across keys and elements for all practical purposes (tested:
keep fraction, pairwise correlation, key sensitivity), and the keep
probability is exact to 2**-32. "threefry" is bit-identical to `nn.Dropout`.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

DROPOUT_IMPLS = ("threefry", "hash")


def _mix32(x: jax.Array) -> jax.Array:
  """lowbias32: a bijective avalanche mix of uint32 words."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def hash_bits(key: jax.Array, shape: Sequence[int]) -> jax.Array:
  """uint32 bits of `shape` from `key`: mix(mix(i + k0) ^ k1) over the flat index i (< 2**32)."""
  size = int(np.prod(shape, dtype=np.int64))
  if size >= 2**32:
    raise ValueError(f"hash dropout masks hold < 2**32 elements, got shape {tuple(shape)}")
  k0, k1 = jax.random.bits(key, (2,), jnp.uint32)
  counter = jax.lax.iota(jnp.uint32, size).reshape(tuple(shape)) if size else jnp.zeros(shape, jnp.uint32)
  return _mix32(_mix32(counter + k0) ^ k1)


def keep_mask(key: jax.Array, rate: float, shape: Sequence[int], impl: str = "threefry") -> jax.Array:
  """Boolean mask of `shape`, True with probability 1 - rate."""
  if impl == "threefry":
    return jax.random.bernoulli(key, p=1.0 - rate, shape=tuple(shape))
  if impl == "hash":
    threshold = min(int(round(rate * 2**32)), 2**32 - 1)
    return hash_bits(key, shape) >= jnp.uint32(threshold)
  raise ValueError(f"dropout impl must be one of {DROPOUT_IMPLS}, got {impl!r}")


class Dropout(nn.Module):
  """`nn.Dropout` (same fields, call and scaling) with `impl` choosing the mask generator."""

  rate: float
  broadcast_dims: Sequence[int] = ()
  deterministic: bool | None = None
  rng_collection: str = "dropout"
  impl: str = "threefry"

  @nn.compact
  def __call__(self, inputs, deterministic: bool | None = None, rng: jax.Array | None = None):
    deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
    if self.rate == 0.0 or deterministic:
      return inputs
    if self.rate == 1.0:
      return jnp.zeros_like(inputs)
    if self.impl not in DROPOUT_IMPLS:
      raise ValueError(f"dropout impl must be one of {DROPOUT_IMPLS}, got {self.impl!r}")
    keep_prob = 1.0 - self.rate
    if rng is None:
      rng = self.make_rng(self.rng_collection)
    shared = {dim % inputs.ndim for dim in self.broadcast_dims}
    shape = [1 if dim in shared else n for dim, n in enumerate(inputs.shape)]
    mask = jnp.broadcast_to(keep_mask(rng, self.rate, shape, self.impl), inputs.shape)
    return jax.lax.select(mask, inputs / keep_prob, jnp.zeros_like(inputs))
