"""Frozen model hyper-parameters, shared by every model family.

Which layers use Primal-Attention is a per-layer tuple of attention names, so
PrimalFormer (all Primal), Primal.+X (last layer Primal) and the softmax
Transformer are configs, not separate model classes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from primal_jax.attention.registry import ATTENTIONS
from primal_jax.dropout import DROPOUT_IMPLS
from primal_jax.initializers import INIT_STYLES
from primal_jax.validation import check_choice, check_divisible, check_positive

FAMILIES = ("primalformer", "primal_plus", "softmax")
POOLINGS = ("mean", "masked_mean", "cls")
NORM_POSITIONS = ("pre", "post")
NORM_TYPES = ("layer", "batch")


def family_layers(family: str, num_layers: int) -> tuple[str, ...]:
  """Per-layer attention names of a model family.

  "primalformer": every layer Primal; "primal_plus": only the last layer
  Primal (Primal.+X with X the softmax Transformer); "softmax": none.
  """
  check_choice(family, FAMILIES, "family")
  check_positive(num_layers, "num_layers")
  primal_from = {"primalformer": 0, "primal_plus": num_layers - 1, "softmax": num_layers}[family]
  return tuple("primal" if i >= primal_from else "softmax" for i in range(num_layers))


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Hyper-parameters of a pre-norm Transformer with Primal or softmax layers.

  Defaults are the release's LRA ListOps PrimalFormer (2 layers, dim 64,
  hidden 128, 2 heads x 32, s = 20, rank_multi 10).
  """

  layers: tuple[str, ...] = ("primal", "primal")
  vocab_size: int = 32
  max_len: int = 512
  dim: int = 64
  hidden_dim: int = 128
  num_heads: int = 2
  # Primal-Attention.
  low_rank: int = 20
  rank_multi: int = 10
  num_samples: int | None = None
  allow_rank_deficient: bool = False  # s > n allowed (see PrimalAttention)
  data_dependent: bool = True  # must be False for causal models (CausalLM)
  feature_map: str = "cosine"
  sampling: str = "release"
  # LRA baselines (primal_jax.attention.baselines); defaults from the Nystromformer LRA code the release builds on.
  linear_normalize: bool = True  # "linear": Katharopoulos normaliser (False: the release's unnormalised form)
  performer_features: int = 256  # "performer": random features m (release "performer-256", rp_dim)
  performer_seed: int = 0  # "performer": seed of the fixed features (shared by all performer layers)
  linformer_k: int = 256  # "linformer": projected length (release "linformer-256"); E, F span max_len
  linformer_share_kv: bool = False  # "linformer": F = E (the release shares one projection)
  num_landmarks: int = 64  # "nystromformer": landmarks m (release nystrom-32/64/128/256)
  conv_kernel_size: int = 35  # "nystromformer": depthwise conv residual on values (release 35; 0 = off)
  pinv_iterations: int = 6  # "nystromformer": iterative pseudo-inverse steps (the paper's 6)
  # Dropout on the baselines' head outputs; None = attention_dropout_rate. The release applies none (0.0).
  baseline_dropout_rate: float | None = 0.0
  # Regularisation and numerics.
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  # Dropout on Primal heads' outputs; None = attention_dropout_rate. The release's time-series
  # PrimalCosAttention defines a dropout it never applies (0.0 reproduces it).
  primal_dropout_rate: float | None = None
  # Dropout mask generator everywhere: "threefry" (= nn.Dropout) or "hash" (a counter hash keyed by the
  # same PRNG key, several times cheaper on CPU; see primal_jax/dropout.py).
  dropout_impl: str = "threefry"
  layer_norm_eps: float = 1e-5  # PyTorch default (Flax's is 1e-6)
  # "pre": x + f(LN(x)) (the release's LRA blocks); "post": LN(x + f(x)) (its time-series blocks).
  norm_position: str = "pre"
  # "batch": BatchNorm over (batch, positions) in the blocks (mvts_transformer's option; needs the
  # mutable `batch_stats` collection when training). The final norm stays a LayerNorm.
  norm_type: str = "layer"
  exact_gelu: bool = True  # PyTorch nn.GELU (Flax's default is the tanh form)
  init_style: str = "torch"
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  # Heads.
  pooling: str = "mean"
  num_classes: int = 10
  mask_final: bool = True  # release: final LayerNorm output multiplied by the mask

  def __post_init__(self):
    check_positive(self.dim, "dim")
    check_positive(self.num_heads, "num_heads")
    check_divisible(self.dim, self.num_heads, "dim", "num_heads")
    if not self.layers:
      raise ValueError("layers must name at least one attention layer")
    for name in self.layers:
      check_choice(name, tuple(ATTENTIONS), "layers[i]")
    used = set(self.layers)
    if "performer" in used:
      check_positive(self.performer_features, "performer_features")
    if "linformer" in used:
      check_positive(self.linformer_k, "linformer_k")
      check_positive(self.max_len, "max_len")
    if "nystromformer" in used:
      check_positive(self.num_landmarks, "num_landmarks")
      check_positive(self.pinv_iterations, "pinv_iterations")
      size = self.conv_kernel_size
      if not isinstance(size, int) or isinstance(size, bool) or size < 0 or (size > 0 and size % 2 == 0):
        raise ValueError(f"conv_kernel_size must be 0 (off) or an odd integer >= 1, got {size!r}")
    check_choice(self.pooling, POOLINGS, "pooling")
    check_choice(self.init_style, INIT_STYLES, "init_style")
    check_choice(self.norm_position, NORM_POSITIONS, "norm_position")
    check_choice(self.norm_type, NORM_TYPES, "norm_type")
    check_choice(self.dropout_impl, DROPOUT_IMPLS, "dropout_impl")

  @property
  def num_layers(self) -> int:
    return len(self.layers)

  def attention_kwargs(self, name: str, causal: bool) -> dict[str, Any]:
    """Constructor kwargs of the attention registered under `name`."""
    baseline_dropout = self.attention_dropout_rate if self.baseline_dropout_rate is None else self.baseline_dropout_rate
    common = dict(
      num_heads=self.num_heads,
      causal=causal,
      dropout_rate=self.attention_dropout_rate,
      dropout_impl=self.dropout_impl,
      init_style=self.init_style,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
    )
    specific = {
      "primal": dict(
        dropout_rate=self.attention_dropout_rate if self.primal_dropout_rate is None else self.primal_dropout_rate,
        low_rank=self.low_rank,
        rank_multi=self.rank_multi,
        num_samples=self.num_samples,
        allow_rank_deficient=self.allow_rank_deficient,
        data_dependent=self.data_dependent,
        feature_map=self.feature_map,
        sampling=self.sampling,
      ),
      "softmax": {},
      "linear": dict(dropout_rate=baseline_dropout, normalize=self.linear_normalize),
      "performer": dict(
        dropout_rate=baseline_dropout, num_features=self.performer_features, feature_seed=self.performer_seed
      ),
      "linformer": dict(
        dropout_rate=baseline_dropout,
        max_len=self.max_len,
        linformer_k=self.linformer_k,
        share_kv=self.linformer_share_kv,
      ),
      "nystromformer": dict(
        dropout_rate=baseline_dropout,
        num_landmarks=self.num_landmarks,
        conv_kernel_size=self.conv_kernel_size,
        pinv_iterations=self.pinv_iterations,
      ),
      "cosformer": dict(dropout_rate=baseline_dropout),
    }
    if name not in specific:
      raise ValueError(f"attention_kwargs has no entry for attention {name!r}; add its fields to TransformerConfig")
    return {**common, **specific[name]}


def make_config(family: str = "primalformer", num_layers: int = 2, **overrides) -> TransformerConfig:
  """A `TransformerConfig` for a model family, e.g. make_config("primal_plus", 6, dim=512)."""
  return TransformerConfig(layers=family_layers(family, num_layers), **overrides)
