"""Load the authors' PyTorch release weights and verify parity with its golden outputs."""

from primal_jax.convert.cases import ReferenceCase, load_case, relative_errors, run_case
from primal_jax.convert.torch_layout import attention_params, lra_classifier_params

__all__ = ["ReferenceCase", "attention_params", "load_case", "lra_classifier_params", "relative_errors", "run_case"]
