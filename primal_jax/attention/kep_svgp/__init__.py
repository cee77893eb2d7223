"""KEP-SVGP attention (Chen, Tao, Tonin, Suykens, ICML 2024): a sparse variational GP over Primal-Attention's
kernel SVD features; `posterior` holds the math, `core` the forward, `layer` the registered Flax mechanism."""

from primal_jax.attention.kep_svgp.layer import (
  KEP_KSVD_SPEC,
  KL_COLLECTION,
  NOISE_COLLECTION,
  KEPSVGPAttention,
  kl_from_params,
  kl_loss,
  nnx_kl_loss,
)

__all__ = [
  "KEP_KSVD_SPEC",
  "KL_COLLECTION",
  "NOISE_COLLECTION",
  "KEPSVGPAttention",
  "kl_from_params",
  "kl_loss",
  "nnx_kl_loss",
]
