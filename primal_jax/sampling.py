"""Which sequence positions build the data-dependent projection weights (SPEC 2).

W_e|X = F_X^T W_e with F_X the n sampled rows of the block input. The release
samples `idx = torch.linspace(0, N-1, n, dtype=int64)`; `release_sample_indices`
reproduces it bit for bit, and `padding_aware_positions` applies the same rule
to the real (non-padded) positions of every sequence.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from primal_jax.validation import check_positive


def release_sample_indices(length: int, num_samples: int) -> np.ndarray:
  """Exact host emulation of `torch.linspace(0, length-1, num_samples, dtype=torch.int64)`.

  PyTorch computes integer linspace in float64 as `i*step` for the first half
  and `(N-1) - step*(n-1-i)` for the second half, then truncates; this differs
  from floor(i*(N-1)/(n-1)) for about 1% of (N, n) pairs. When n > N indices
  repeat (the release's LRA setting).

  Returns:
    [num_samples] int32 positions in [0, length).
  """
  check_positive(length, "length")
  check_positive(num_samples, "num_samples")
  if num_samples == 1:
    return np.zeros((1,), np.int32)
  end = float(length - 1)
  step = end / (num_samples - 1)
  i = np.arange(num_samples, dtype=np.float64)
  halfway = num_samples // 2
  values = np.where(i < halfway, step * i, end - step * (num_samples - 1 - i))
  return np.trunc(values).astype(np.int32)


def num_sampled_rows(low_rank: int, rank_multi: int, max_len: int | None = None) -> int:
  """n of the release: `low_rank * rank_multi`, capped at `max_len` when given.

  Time series and vision cap at the (maximum) sequence length; the LRA release
  never caps (max_len=None) and repeats indices when N < n.
  """
  check_positive(low_rank, "low_rank")
  check_positive(rank_multi, "rank_multi")
  n = low_rank * rank_multi
  return n if max_len is None else min(n, max_len)


@functools.lru_cache(maxsize=64)
def _release_index_table(max_length: int, num_samples: int) -> np.ndarray:
  # Row L-1 holds release_sample_indices(L, n): lets jitted code look up the
  # exact float64 rule for a traced length.
  return np.stack([release_sample_indices(length, num_samples) for length in range(1, max_length + 1)])


def padding_aware_positions(valid: jax.Array, num_samples: int) -> jax.Array:
  """Release sampling rule applied to each sequence's real positions only.

  With L_b real positions (anywhere in the sequence, not only a prefix), sample
  m picks the `release_sample_indices(L_b, n)[m]`-th real position. A sequence
  without padding gets exactly the release indices. An all-padding sequence
  falls back to position 0 (its outputs are masked anyway).

  Args:
    valid: [B, N] bool, True at real positions.
    num_samples: n.
  Returns:
    [B, n] int32 positions.
  """
  n_pos = valid.shape[-1]
  table = jnp.asarray(_release_index_table(n_pos, num_samples))  # [N, n]
  lengths = jnp.clip(jnp.sum(valid, axis=-1), 1, n_pos)  # [B]
  ranks = table[lengths - 1]  # [B, n] ranks among real positions
  arange = jnp.arange(n_pos)
  # Real positions first, each group in order: argsort of a key that is unique.
  order = jnp.argsort(jnp.where(valid, arange, n_pos + arange), axis=-1)  # [B, N]
  return jnp.take_along_axis(order, ranks, axis=-1).astype(jnp.int32)
