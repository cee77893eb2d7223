"""Attention modules: Primal-Attention and the softmax baseline, by name."""

from primal_jax.attention.head import primal_head
from primal_jax.attention.primal import PrimalAttention
from primal_jax.attention.registry import ATTENTIONS, get_attention
from primal_jax.attention.softmax import SoftmaxAttention

__all__ = ["ATTENTIONS", "PrimalAttention", "SoftmaxAttention", "get_attention", "primal_head"]
