"""Model families built from Primal and softmax attention layers."""

from primal_jax.models.blocks import EncoderBlock, MlpBlock, TokenEmbedding, TransformerStack
from primal_jax.models.classifier import DualSequenceClassifier, SequenceClassifier, TokenEncoder, pool
from primal_jax.models.config import STACKS, TransformerConfig, make_config, model_layers
from primal_jax.models.decision_transformer import DecisionTransformer, dt_config
from primal_jax.models.lm import CausalLM, decode_step, init_cache
from primal_jax.models.registry import (
  MODELS,
  BuiltModel,
  build_model,
  get_model,
  register_model,
  registered_model,
  unregister_model,
)
from primal_jax.models.vit import VisionTransformer, vit_config

__all__ = [
  "MODELS",
  "BuiltModel",
  "build_model",
  "get_model",
  "register_model",
  "registered_model",
  "unregister_model",
  "CausalLM",
  "DecisionTransformer",
  "DualSequenceClassifier",
  "EncoderBlock",
  "MlpBlock",
  "SequenceClassifier",
  "TokenEmbedding",
  "TokenEncoder",
  "STACKS",
  "TransformerConfig",
  "TransformerStack",
  "VisionTransformer",
  "decode_step",
  "dt_config",
  "init_cache",
  "make_config",
  "model_layers",
  "pool",
  "vit_config",
]
