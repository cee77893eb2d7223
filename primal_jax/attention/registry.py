"""One registry from attention name to module class.

Blocks take an attention by name; kwargs specific to one mechanism live in the
model config under that name (see `primal_jax.models.config`).
"""

from __future__ import annotations

import types

from primal_jax.attention.baselines import (
  CosformerAttention,
  LinearAttention,
  LinformerAttention,
  NystromAttention,
  PerformerAttention,
)
from primal_jax.attention.primal import PrimalAttention
from primal_jax.attention.softmax import SoftmaxAttention

ATTENTIONS = types.MappingProxyType(
  {
    "primal": PrimalAttention,
    "softmax": SoftmaxAttention,
    # The paper's LRA baselines (primal_jax.attention.baselines).
    "linear": LinearAttention,
    "performer": PerformerAttention,
    "linformer": LinformerAttention,
    "nystromformer": NystromAttention,
    "cosformer": CosformerAttention,
  }
)


def get_attention(name: str):
  """The attention class registered under `name` (one of `ATTENTIONS`)."""
  try:
    return ATTENTIONS[name]
  except KeyError:
    raise ValueError(f"attention must be one of {tuple(ATTENTIONS)}, got {name!r}") from None
