"""The LRA baselines of the paper (Nystromformer LRA code) behind the `SoftmaxAttention` interface.

Each is a pure function on [B, H, N, p] arrays plus a thin Linen module that
adds the query/key/value and output projections (`BaselineAttention`).
"""

from primal_jax.attention.baselines.common import BaselineAttention, padding_masks
from primal_jax.attention.baselines.cosformer import CosformerAttention, cosformer_attention, cosformer_features
from primal_jax.attention.baselines.linear import (
  LinearAttention,
  elu_feature_map,
  kernelized_attention,
  linear_attention,
)
from primal_jax.attention.baselines.linformer import LinformerAttention, linformer_attention
from primal_jax.attention.baselines.longformer import LongformerAttention, longformer_attention
from primal_jax.attention.baselines.nystromformer import (
  NystromAttention,
  depthwise_sequence_conv,
  iterative_pinv,
  nystrom_attention,
  segment_means,
)
from primal_jax.attention.baselines.performer import (
  PerformerAttention,
  favor_features,
  orthogonal_random_features,
  performer_attention,
)
from primal_jax.attention.baselines.soft import SoftAttention, gaussian_kernel, newton_inverse, soft_attention
from primal_jax.attention.baselines.yoso import YosoAttention, collision_probability, yoso_expectation

__all__ = [
  "yoso_expectation",
  "collision_probability",
  "YosoAttention",
  "soft_attention",
  "newton_inverse",
  "gaussian_kernel",
  "SoftAttention",
  "longformer_attention",
  "LongformerAttention",
  "BaselineAttention",
  "CosformerAttention",
  "LinearAttention",
  "LinformerAttention",
  "NystromAttention",
  "PerformerAttention",
  "cosformer_attention",
  "cosformer_features",
  "depthwise_sequence_conv",
  "elu_feature_map",
  "favor_features",
  "iterative_pinv",
  "kernelized_attention",
  "linear_attention",
  "linformer_attention",
  "nystrom_attention",
  "orthogonal_random_features",
  "padding_masks",
  "performer_attention",
  "segment_means",
]
