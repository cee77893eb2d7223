"""Multivariate time-series classifier of the paper's UEA experiments (Table 1).

The release's `PrimalformerClassiregressor` (built on mvts_transformer):
input projection Linear(C -> D) scaled by sqrt(D), a learnable positional
encoding drawn from U(-0.02, 0.02), dropout, post-norm encoder blocks, a final
LayerNorm, GELU, dropout, padded steps zeroed, and one Linear over the
flattened [N * D] sequence. Trans., PrimalFormer and Primal.+Trans. differ only
in `config.layers`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from primal_jax.dropout import Dropout
from primal_jax.models.blocks import TransformerStack, dense
from primal_jax.models.config import TransformerConfig, model_layers
from primal_jax.models.registry import BuiltModel, model_sections
from primal_jax.validation import check_rank


def timeseries_config(
  model: str = "primalformer",
  *,
  seq_len: int,
  num_classes: int,
  num_layers: int = 2,
  attention: Mapping[str, Mapping[str, Any]] | None = None,
  **overrides,
) -> TransformerConfig:
  """The release's UEA model: D = 512, 8 heads, feed-forward 2048, dropout 0.1, post-norm, GELU.

  `model` names the layers as in `model_layers`; `attention` gives options per attention name. The
  Primal layers' number of sampled rows is the release's `min(seq_len, s * rank_multi)`: every
  position is sampled when the series is shorter than s * rank_multi. The release's option
  `normalization_layer=BatchNorm` never reaches its PrimalFormer `EncoderLayer` (which always uses
  LayerNorm), so "layer" is the default here; `norm_type="batch"` gives the BatchNorm block.
  """
  attention = {name: dict(options) for name, options in (attention or {}).items()}
  # The release's PrimalCosAttention never applies its dropout: dropout_rate 0.0 reproduces it.
  primal = {"low_rank": 20, "rank_multi": 10, "dropout_rate": 0.0, **attention.get("primal", {})}
  if primal.get("num_samples") is None and primal.get("data_dependent", True):
    primal["num_samples"] = min(seq_len, primal["low_rank"] * primal["rank_multi"])
    # The release builds its [H, n, s] weights with this n whatever s is, so short
    # series get s > n (JapaneseVowels: s = 40, n = 29); keep that reproducible.
    primal.setdefault("allow_rank_deficient", primal["low_rank"] > primal["num_samples"])
  attention["primal"] = primal
  defaults = dict(
    layers=model_layers(model, num_layers),
    attention=attention,
    max_len=seq_len,
    dim=512,
    hidden_dim=2048,
    num_heads=8,
    dropout_rate=0.1,
    attention_dropout_rate=0.1,
    exact_gelu=True,
    norm_position="post",
    num_classes=num_classes,
    mask_final=False,
  )
  defaults.update(overrides)
  return TransformerConfig(**defaults)


def _symmetric_uniform(bound: float):
  """U(-bound, bound): the release's learnable positional encoding init."""

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


class TimeSeriesClassifier(nn.Module):
  """values [B, N, C], mask [B, N] (True = real step) -> logits [B, num_classes].

  N must equal `config.max_len`: the flattening head has one weight per
  (position, feature). `mask_attention=False` reproduces the release, whose
  attention layers never see the padding mask (padded steps only get zeroed
  before the head).
  """

  config: TransformerConfig
  mask_attention: bool = True

  @nn.compact
  def __call__(self, values: jax.Array, mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    cfg = self.config
    check_rank(values, 3, "values", "[batch, length, channels]")
    batch, length, channels = values.shape
    if length != cfg.max_len:
      raise ValueError(f"values length {length} must equal config.max_len={cfg.max_len} (pad or truncate the series)")
    if mask is None:
      mask = jnp.ones((batch, length), bool)
    elif tuple(mask.shape) != (batch, length):
      raise ValueError(f"mask must have shape [batch, length]={(batch, length)}, got {tuple(mask.shape)}")
    x = dense(cfg, cfg.dim, channels, ("features", "embed"), "input_projection")(values)
    x = x * math.sqrt(cfg.dim)  # [B, N, D]
    positions = self.param(
      "positions",
      nn.with_logical_partitioning(_symmetric_uniform(0.02), ("length", "embed")),
      (cfg.max_len, cfg.dim),
      cfg.param_dtype,
    )  # [N, D]
    x = x + positions.astype(x.dtype)[None]
    x = Dropout(cfg.dropout_rate, impl=cfg.dropout_impl)(x, deterministic=deterministic)
    x = TransformerStack(cfg, name="encoder")(x, mask if self.mask_attention else None, deterministic)
    self.sow("intermediates", "encoder_out", x)
    x = nn.gelu(x, approximate=not cfg.exact_gelu)
    x = Dropout(cfg.dropout_rate, impl=cfg.dropout_impl)(x, deterministic=deterministic)
    x = x * mask[..., None].astype(x.dtype)  # [B, N, D], padded steps zeroed
    x = x.reshape(batch, length * cfg.dim)
    return dense(cfg, cfg.num_classes, length * cfg.dim, ("flat", "classes"), "logits")(x)


@dataclasses.dataclass(frozen=True)
class TimeSeriesOptions:
  """The UEA classifier's own keys of a config's `model` section (the rest are its body's).

  mask_attention: pass the step mask to the attention layers (False: the release's unmasked attention).
  """

  mask_attention: bool = True


def build(model_config, info) -> BuiltModel:
  """`model.name="timeseries"`: the UEA classifier; `info` gives seq_len and num_classes."""
  options, kwargs = model_sections(model_config, TimeSeriesOptions)
  try:
    config = timeseries_config(seq_len=info.seq_len, num_classes=info.num_classes, **kwargs)
  except TypeError as err:  # an unknown key in the config's model section
    raise ValueError(f"bad model config for 'timeseries': {err}") from err
  return BuiltModel(TimeSeriesClassifier(config, mask_attention=options.mask_attention), ("inputs", "mask"))
