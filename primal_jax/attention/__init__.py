"""Attention modules by name: Primal-Attention, softmax and the baselines of the paper's Tables 1, 2 and 4.

Every mechanism is an `AttentionShell` (projections, dropout, output written once) plus its core;
`register_attention(name, cls)` makes a new one available to every model config.
"""

from primal_jax.attention.baselines import (
  CosformerAttention,
  LinearAttention,
  LinformerAttention,
  NystromAttention,
  PerformerAttention,
)
from primal_jax.attention.head import primal_head
from primal_jax.attention.primal import PrimalAttention
from primal_jax.attention.registry import (
  ATTENTIONS,
  LayerSpec,
  get_attention,
  option_names,
  register_attention,
  registered_attention,
  unregister_attention,
)
from primal_jax.attention.shell import SPECTRUM_COLLECTION, AttentionShell
from primal_jax.attention.softmax import SoftmaxAttention

__all__ = [
  "ATTENTIONS",
  "SPECTRUM_COLLECTION",
  "AttentionShell",
  "LayerSpec",
  "CosformerAttention",
  "LinearAttention",
  "LinformerAttention",
  "NystromAttention",
  "PerformerAttention",
  "PrimalAttention",
  "SoftmaxAttention",
  "get_attention",
  "option_names",
  "primal_head",
  "register_attention",
  "registered_attention",
  "unregister_attention",
]
