"""Shared helpers of the attention-module tests: random parameters, masks, applying a layer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn


def normal(seed, shape, scale=1.0, dtype=np.float32):
  return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(dtype)


def padding_mask(seed, batch, length):
  """[B, N] bool with padding anywhere: row 0 full, row 1 suffix-padded (last position padded), others random."""
  rng = np.random.default_rng(seed)
  mask = rng.random((batch, length)) < 0.7
  mask[:, 0] = True
  mask[0] = True
  if batch > 1:
    mask[1] = np.arange(length) < length - 3
  if batch > 2:
    mask[2, -1] = False
    mask[2, 1] = False
  return mask


def random_params(module, x, seed=0, mask=None, scale=0.4):
  """Random values for every parameter of `module` applied to `x` (shapes from jax.eval_shape of init).

  Random biases make a test sensitive to forgotten or swapped biases (Flax
  initialises them to zero); Lambda is drawn from U[0.2, 1.2). eval_shape
  avoids compiling the initialisers, which dominates test time on CPU.
  """
  variables = jax.eval_shape(lambda: module.init(jax.random.key(seed), x, mask=mask))
  params = nn.meta.unbox(variables["params"])
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  rng = np.random.default_rng(seed + 1000)
  new = []
  for path, leaf in leaves:
    name = jax.tree_util.keystr(path)
    if "Lambda" in name:
      value = rng.uniform(0.2, 1.2, leaf.shape)
    else:
      value = scale * rng.standard_normal(leaf.shape)
    new.append(jnp.asarray(value, leaf.dtype))
  return jax.tree_util.tree_unflatten(treedef, new)


def apply(module, params, x, mask=None, **kwargs):
  """Returns (out, escore, rscore, ksvd collection) of one call."""
  out, state = module.apply({"params": params}, x, mask=mask, mutable=["intermediates", "ksvd"], **kwargs)
  inter = state["intermediates"]
  return out, inter["escore"][0], inter["rscore"][0], state["ksvd"]


def to_numpy(tree):
  return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), tree)
