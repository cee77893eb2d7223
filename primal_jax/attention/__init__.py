"""Attention modules: Primal-Attention, the softmax baseline and the LRA baselines, by name."""

from primal_jax.attention.baselines import (
  CosformerAttention,
  LinearAttention,
  LinformerAttention,
  NystromAttention,
  PerformerAttention,
)
from primal_jax.attention.head import primal_head
from primal_jax.attention.primal import PrimalAttention
from primal_jax.attention.registry import ATTENTIONS, get_attention
from primal_jax.attention.softmax import SoftmaxAttention

__all__ = [
  "ATTENTIONS",
  "CosformerAttention",
  "LinearAttention",
  "LinformerAttention",
  "NystromAttention",
  "PerformerAttention",
  "PrimalAttention",
  "SoftmaxAttention",
  "get_attention",
  "primal_head",
]
