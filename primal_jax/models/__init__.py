"""Model families built from Primal and softmax attention layers."""

from primal_jax.models.blocks import EncoderBlock, MlpBlock, TokenEmbedding, TransformerStack
from primal_jax.models.classifier import DualSequenceClassifier, SequenceClassifier, TokenEncoder, pool
from primal_jax.models.config import FAMILIES, TransformerConfig, family_layers, make_config
from primal_jax.models.lm import CausalLM, decode_step, init_cache

__all__ = [
  "FAMILIES",
  "CausalLM",
  "DualSequenceClassifier",
  "EncoderBlock",
  "MlpBlock",
  "SequenceClassifier",
  "TokenEmbedding",
  "TokenEncoder",
  "TransformerConfig",
  "TransformerStack",
  "decode_step",
  "family_layers",
  "init_cache",
  "make_config",
  "pool",
]
