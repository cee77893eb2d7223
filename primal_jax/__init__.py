"""primal_jax: Primal-Attention (Chen et al., NeurIPS 2023) for JAX/Flax.

Importing this package has no side effects: no flags, no global state, no
device initialisation.
"""

from primal_jax.attention import ATTENTIONS, PrimalAttention, SoftmaxAttention, get_attention, primal_head
from primal_jax.dual import (
  cumulative_explained_variance,
  dual_scores,
  induced_kernel,
  primal_weights_from_dual,
  singular_value_spectrum,
)
from primal_jax.feature_maps import (
  cosine_feature_map,
  random_feature_projection,
  softmax_kernel_feature_map,
  softmax_kernel_normalizer,
)
from primal_jax.ksvd import (
  KSVD_COLLECTION,
  PAPER,
  RELEASE_LRA,
  RELEASE_SEQUENCE,
  KSVDSpec,
  KSVDTerms,
  collect_terms,
  ksvd_loss,
  ksvd_loss_per_sample,
  ksvd_objective,
  ksvd_regularizer,
  ksvd_terms,
)
from primal_jax.sampling import num_sampled_rows, padding_aware_positions, release_sample_indices
from primal_jax.scores import causal_running_mean, data_dependent_weights, primal_scores

__version__ = "0.1.0"

__all__ = [
  "ATTENTIONS",
  "KSVD_COLLECTION",
  "PAPER",
  "RELEASE_LRA",
  "RELEASE_SEQUENCE",
  "KSVDSpec",
  "KSVDTerms",
  "PrimalAttention",
  "SoftmaxAttention",
  "causal_running_mean",
  "collect_terms",
  "cosine_feature_map",
  "cumulative_explained_variance",
  "data_dependent_weights",
  "dual_scores",
  "get_attention",
  "induced_kernel",
  "ksvd_loss",
  "ksvd_loss_per_sample",
  "ksvd_objective",
  "ksvd_regularizer",
  "ksvd_terms",
  "num_sampled_rows",
  "padding_aware_positions",
  "primal_head",
  "primal_scores",
  "primal_weights_from_dual",
  "random_feature_projection",
  "release_sample_indices",
  "singular_value_spectrum",
  "softmax_kernel_feature_map",
  "softmax_kernel_normalizer",
]

# Last: registers the built-in families' tasks and configs (lazy entries; imports none of them), so that
# `import primal_jax.<anything>` sees them.
import primal_jax.tasks  # noqa: E402, F401, I001
