"""Shared helpers of the NNX tests: small options per registered attention, random weights in both front ends."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from attention_utils import random_params
from flax import nnx

import primal_jax.nnx as pnnx
from primal_jax.attention import ATTENTIONS, get_attention, option_names

B, N, D, H = 2, 8, 16, 2
# Options that make each mechanism work at N = 8 (a mechanism registered later runs with its defaults, plus
# max_len = N where it has that option).
SMALL = {
  "primal": dict(low_rank=3, num_samples=4),
  "nystromformer": dict(num_landmarks=4, conv_kernel_size=3),
  "performer": dict(num_features=8),
  "linformer": dict(linformer_k=4),
  "cosformer": dict(horizon=N),  # decoding needs a fixed horizon
  "soft": dict(num_landmarks=4),
  # KEP-SVGP samples its output from the "posterior" stream: the shared tests compare the posterior mean.
  "kep_svgp": dict(low_rank=3, rank_multi=2, sample_posterior=False),
}
# What a causal layer of each mechanism needs on top (Primal's causal form is data-independent).
CAUSAL = {"primal": dict(data_dependent=False)}


def names() -> list[str]:
  return sorted(ATTENTIONS)


def options(name: str, causal: bool = False) -> dict:
  extra = {"max_len": N} if "max_len" in option_names(name) else {}
  return {**extra, **SMALL.get(name, {}), **(CAUSAL.get(name, {}) if causal else {})}


def causal_names() -> list[str]:
  return [n for n in names() if get_attention(n).supports_causal]


def decode_names() -> list[str]:
  return [n for n in causal_names() if get_attention(n).supports_decode]


def inputs(seed=0, length=N):
  return jnp.asarray(np.random.default_rng(seed).standard_normal((B, length, D)), jnp.float32)


def padding(length=N):
  mask = np.ones((B, length), bool)
  mask[1, -3:] = False
  return jnp.asarray(mask)


def layer_pair(name: str, causal: bool = False, seed: int = 0, **kwargs):
  """(NNX layer, Linen layer, Linen params) with the same random weights (random biases, Lambda in [0.2, 1.2))."""
  layer = pnnx.get_attention(name)(
    num_heads=H, in_features=D, rngs=nnx.Rngs(seed), causal=causal, **options(name, causal), **kwargs
  )
  module, _ = pnnx.to_linen(layer)
  params = random_params(module.clone(dropout_rate=0.0), inputs(), seed=seed)
  pnnx.load_linen_variables(layer, {"params": params})
  return layer, module, params


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
  leaves_a, leaves_b = jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)
  assert len(leaves_a) == len(leaves_b)
  for (path, x), y in zip(leaves_a, leaves_b, strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path))
