"""Model families built from Primal and softmax attention layers."""

from primal_jax.models.blocks import EncoderBlock, MlpBlock, TokenEmbedding, TransformerStack
from primal_jax.models.classifier import DualSequenceClassifier, SequenceClassifier, TokenEncoder, pool
from primal_jax.models.config import STACKS, TransformerConfig, make_config, model_layers
from primal_jax.models.lm import CausalLM, decode_step, init_cache

__all__ = [
  "CausalLM",
  "DualSequenceClassifier",
  "EncoderBlock",
  "MlpBlock",
  "SequenceClassifier",
  "TokenEmbedding",
  "TokenEncoder",
  "STACKS",
  "TransformerConfig",
  "TransformerStack",
  "decode_step",
  "init_cache",
  "make_config",
  "model_layers",
  "pool",
]
