"""Transformer blocks (pre- or post-norm) whose attention is chosen by name."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import linen as nn

from primal_jax.dropout import Dropout
from primal_jax.initializers import embedding_init, linear_inits
from primal_jax.models.config import TransformerConfig


def layer_norm(config: TransformerConfig, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(
    epsilon=config.layer_norm_eps,
    dtype=config.dtype,
    param_dtype=config.param_dtype,
    scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
    bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
    name=name,
  )


def block_norm(config: TransformerConfig, name: str, deterministic: bool):
  """The norm inside a block: LayerNorm, or BatchNorm over (batch, positions).

  BatchNorm uses batch statistics when training (`deterministic=False`, the
  `batch_stats` collection must be mutable) and running averages otherwise;
  momentum 0.9 is PyTorch's BatchNorm1d momentum 0.1 in Flax's convention.
  """
  if config.norm_type == "layer":
    return layer_norm(config, name)
  return nn.BatchNorm(
    use_running_average=deterministic,
    momentum=0.9,
    epsilon=config.layer_norm_eps,
    dtype=config.dtype,
    param_dtype=config.param_dtype,
    scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
    bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
    name=name,
  )


def dense(config: TransformerConfig, features: int, fan_in: int, axes: tuple[str, str], name: str) -> nn.Dense:
  kernel_init, bias_init = linear_inits(config.init_style, fan_in)
  return nn.Dense(
    features,
    dtype=config.dtype,
    param_dtype=config.param_dtype,
    kernel_init=nn.with_logical_partitioning(kernel_init, axes),
    bias_init=nn.with_logical_partitioning(bias_init, axes[1:]),
    name=name,
  )


def mlp_activation(config: TransformerConfig, h: jax.Array) -> jax.Array:
  """`config.activation`: "gelu" (exact erf form unless `exact_gelu=False`), "gelu_tanh" or "relu"."""
  if config.activation == "relu":
    return nn.relu(h)
  return nn.gelu(h, approximate=config.activation == "gelu_tanh" or not config.exact_gelu)


class MlpBlock(nn.Module):
  """Linear(D -> hidden), activation (`config.activation`), dropout, Linear(hidden -> D), dropout."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    cfg = self.config
    h = dense(cfg, cfg.hidden_dim, cfg.dim, ("embed", "mlp"), "fc_in")(x)
    h = mlp_activation(cfg, h)
    h = Dropout(cfg.dropout_rate, impl=cfg.dropout_impl)(h, deterministic=deterministic)
    h = dense(cfg, cfg.dim, cfg.hidden_dim, ("mlp", "embed"), "fc_out")(h)
    return Dropout(cfg.dropout_rate, impl=cfg.dropout_impl)(h, deterministic=deterministic)


class EncoderBlock(nn.Module):
  """One attention + MLP block.

  Pre-norm (`config.norm_position == "pre"`, the release's LRA/RL/LM blocks):
  x + Dropout(Attention(N1(x))), then x + MLP(N2(x)). Post-norm ("post", the
  release's time-series `EncoderLayer`): N1(x + Dropout(Attention(x))), then
  N2(x + MLP(x)). With `config.drop_path_rate > 0` each branch also passes
  through DeiT's drop path (`config.drop_path(layer)`) before it is added.

  Attributes:
    config: model hyper-parameters.
    layer: this block's index in `config.layers` (which names its attention and options).
    causal: causal attention (decoders).
    decode: incremental decoding (attention caches in the `cache` collection).
  """

  config: TransformerConfig
  layer: int = 0
  causal: bool = False
  decode: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None, deterministic: bool) -> jax.Array:
    cfg = self.config
    norm1 = block_norm(cfg, "norm1", deterministic)
    norm2 = block_norm(cfg, "norm2", deterministic)
    attention = cfg.layer_attention(self.layer, causal=self.causal, decode=self.decode, name="attention")
    mlp = MlpBlock(cfg, name="mlp")
    dropout = Dropout(cfg.dropout_rate, impl=cfg.dropout_impl)
    rate = cfg.drop_path(self.layer)
    # Stochastic depth: a whole residual branch dropped per sample (one mask per example, shared by every
    # position and channel), a fresh draw for each branch as timm's DropPath.
    drop_path = Dropout(rate, broadcast_dims=tuple(range(1, x.ndim)), impl=cfg.dropout_impl, name="drop_path")

    def branch(y):
      return drop_path(y, deterministic=deterministic) if rate > 0 else y

    if cfg.norm_position == "post":
      y = dropout(attention(x, mask=mask, deterministic=deterministic), deterministic=deterministic)
      x = norm1(x + branch(y))
      return norm2(x + branch(mlp(x, deterministic)))
    y = dropout(attention(norm1(x), mask=mask, deterministic=deterministic), deterministic=deterministic)
    x = x + branch(y)
    return x + branch(mlp(norm2(x), deterministic))


class TransformerStack(nn.Module):
  """The blocks of `config.layers` then a final LayerNorm: [B, N, D] -> [B, N, D]."""

  config: TransformerConfig
  causal: bool = False
  decode: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    for i in range(self.config.num_layers):
      x = EncoderBlock(self.config, i, self.causal, self.decode, name=f"block_{i}")(x, mask, deterministic)
    x = layer_norm(self.config, "final_norm")(x)
    if mask is not None and self.config.mask_final:
      x = x * mask[..., None].astype(x.dtype)
    return x


class TokenEmbedding(nn.Module):
  """Token + learnable position embeddings, then dropout: [B, N] ids -> [B, N, D]."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, tokens: jax.Array, positions: jax.Array, deterministic: bool) -> jax.Array:
    cfg = self.config
    # The release's LRA Embeddings re-draw both tables from N(0, 0.02) instead of
    # nn.Embedding's default N(0, 1) (checked on the golden weights).
    init = nn.initializers.normal(0.02) if cfg.init_style == "torch" else embedding_init(cfg.init_style)
    embed = functools.partial(
      nn.Embed,
      features=cfg.dim,
      dtype=cfg.dtype,
      param_dtype=cfg.param_dtype,
      embedding_init=nn.with_logical_partitioning(init, ("vocab", "embed")),
    )
    # Positions looked up per token ([B, N], not [1, N] broadcast in the add): the table's gradient is then
    # one scatter-add of the B N rows. A broadcast add makes it a sum over the batch axis first, which
    # XLA:CPU's YNNPACK runs at ~1 GB/s: 11 ms of the 260 ms PrimalFormer ListOps step at N = 4096,
    # against 0.5 ms for the scatter (benchmarks/step_profile.py). Same values; the gradient's float32
    # summation order differs.
    positions = jnp.broadcast_to(positions, tokens.shape)
    x = embed(cfg.vocab_size, name="tokens")(tokens) + embed(cfg.max_len, name="positions")(positions)
    return Dropout(cfg.dropout_rate, impl=cfg.dropout_impl)(x, deterministic=deterministic)


def check_tokens(tokens: jax.Array, config: TransformerConfig, name: str = "tokens") -> None:
  if tokens.ndim != 2:
    raise ValueError(f"{name} must have rank 2 [batch, length], got shape {tuple(tokens.shape)}")
  if tokens.shape[1] > config.max_len:
    raise ValueError(f"{name} length {tokens.shape[1]} exceeds max_len={config.max_len}")
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f"{name} must be integer token ids, got dtype {tokens.dtype}")
