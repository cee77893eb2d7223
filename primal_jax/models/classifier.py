"""Sequence classification (LRA-style) and two-tower retrieval models."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from primal_jax.models.blocks import TokenEmbedding, TransformerStack, check_tokens, dense
from primal_jax.models.config import TransformerConfig
from primal_jax.models.registry import BuiltModel, token_config


def pool(x: jax.Array, mask: jax.Array | None, mode: str) -> jax.Array:
  """[B, N, D] -> [B, D].

  "mean": mean over all N positions (release: padded rows are already zero, so
  they pull the mean towards 0); "masked_mean": mean over real positions;
  "cls": the first position.
  """
  if mode == "cls":
    return x[:, 0]
  if mode == "masked_mean" and mask is not None:
    w = mask.astype(x.dtype)[..., None]
    return jnp.sum(x * w, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1.0)
  return jnp.mean(x, axis=1)


class ClassifierHead(nn.Module):
  """Linear(in -> hidden), ReLU, Linear(hidden -> classes) (the release's `seq_classifer`)."""

  config: TransformerConfig
  in_features: int

  @nn.compact
  def __call__(self, pooled: jax.Array) -> jax.Array:
    cfg = self.config
    h = nn.relu(dense(cfg, cfg.hidden_dim, self.in_features, ("embed", "mlp"), "hidden")(pooled))
    return dense(cfg, cfg.num_classes, cfg.hidden_dim, ("mlp", "classes"), "logits")(h)


class TokenEncoder(nn.Module):
  """Embeddings + Transformer stack: ids [B, N], mask [B, N] -> [B, N, D]."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, tokens, mask=None, deterministic: bool = True):
    check_tokens(tokens, self.config)
    if mask is not None and tuple(mask.shape) != tuple(tokens.shape):
      raise ValueError(f"mask must have the shape of tokens {tuple(tokens.shape)}, got {tuple(mask.shape)}")
    positions = jnp.arange(tokens.shape[1])[None, :]
    x = TokenEmbedding(self.config, name="embed")(tokens, positions, deterministic)
    return TransformerStack(self.config, name="encoder")(x, mask, deterministic)


class SequenceClassifier(nn.Module):
  """Encoder, pooling, MLP head: ids [B, N] -> logits [B, num_classes]."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, tokens, mask=None, deterministic: bool = True):
    x = TokenEncoder(self.config, name="body")(tokens, mask, deterministic)
    self.sow("intermediates", "encoder_out", x)
    pooled = pool(x, mask, self.config.pooling)
    return ClassifierHead(self.config, self.config.dim, name="head")(pooled)


class DualSequenceClassifier(nn.Module):
  """Two-tower matching (LRA retrieval): one shared encoder for both documents.

  logits = head([u, v, u * v, u - v]) with u, v the pooled encodings.
  """

  config: TransformerConfig

  @nn.compact
  def __call__(self, tokens_a, tokens_b, mask_a=None, mask_b=None, deterministic: bool = True):
    encoder = TokenEncoder(self.config, name="body")
    u = pool(encoder(tokens_a, mask_a, deterministic), mask_a, self.config.pooling)
    v = pool(encoder(tokens_b, mask_b, deterministic), mask_b, self.config.pooling)
    features = jnp.concatenate([u, v, u * v, u - v], axis=-1)
    return ClassifierHead(self.config, 4 * self.config.dim, name="head")(features)


def build(model_config, info) -> BuiltModel:
  """`model.name="lra"`: the LRA sequence classifier (the release's `ModelForSC`): token ids [B, N] -> logits."""
  return BuiltModel(SequenceClassifier(token_config(model_config, info)), ("inputs", "mask"))


def build_dual(model_config, info) -> BuiltModel:
  """`model.name="lra_dual"`: LRA two-tower matching (retrieval, the release's `ModelForSCDual`)."""
  return BuiltModel(DualSequenceClassifier(token_config(model_config, info)), ("inputs", "inputs2", "mask", "mask2"))
