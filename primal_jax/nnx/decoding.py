"""Decode-time bounds of the NNX layers: a chunk past the length `init_cache` declared is never silent.

Concrete positions (an eager call) raise ValueError before anything is written; under `jit` the position is a
tracer, so the chunk's outputs become NaN (loud downstream), as `primal_jax.masks.refuse_unhonoured` does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from primal_jax.masks import refuse_unhonoured


def past_cache_message(layer: str, length: int) -> str:
  return f"{layer} decode: the chunk runs past the cache's {length} positions (init_cache's max_length)"


def refuse_rows(out: jax.Array, ok: jax.Array, message: str) -> jax.Array:
  """`out` [batch_sizes..., T, F] as is where `ok` (a scalar); else ValueError (concrete) or NaN (traced)."""
  flat = out.reshape((-1, *out.shape[-2:]))
  return refuse_unhonoured(flat, jnp.broadcast_to(ok, flat.shape[:1]), message).reshape(out.shape)
