"""Flax NNX front end: every registered attention as a drop-in for `nnx.MultiHeadAttention`::

    from flax import nnx
    import primal_jax.nnx as pnnx

    attn = pnnx.PrimalAttention(num_heads=4, in_features=64, low_rank=8, rngs=nnx.Rngs(0))
    y = attn(x, mask=padding)                                  # as nnx.MultiHeadAttention
    loss = task_loss + pnnx.ksvd_regularizer(nnx.state(model, pnnx.KSVDVariable), eta=0.1)

`get_attention(name)` gives the NNX class of any registered mechanism; the math is the Linen layer's
(`primal_jax.nnx.shell`), the parameter trees are the Linen ones (`primal_jax.nnx.convert`).
"""

from primal_jax.nnx.convert import from_linen, linen_variables, load_linen_variables, through_nnx, to_linen
from primal_jax.nnx.ksvd import KSVDVariable, ksvd_loss, ksvd_loss_per_sample, ksvd_regularizer, layer_terms
from primal_jax.nnx.lm import CausalLM
from primal_jax.nnx.registry import PrimalAttention, SoftmaxAttention, get_attention, nnx_class
from primal_jax.nnx.shell import Attention

__all__ = [
  "Attention",
  "CausalLM",
  "KSVDVariable",
  "PrimalAttention",
  "SoftmaxAttention",
  "from_linen",
  "get_attention",
  "ksvd_loss",
  "ksvd_loss_per_sample",
  "ksvd_regularizer",
  "layer_terms",
  "linen_variables",
  "load_linen_variables",
  "nnx_class",
  "through_nnx",
  "to_linen",
]
