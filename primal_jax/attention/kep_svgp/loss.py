"""KEP-SVGP's training objective and its test-time prediction (`CIFAR/train.py compute_loss`, `CIFAR/valid.py`).

    total = CE + eta_ksvd * KSVD + eta_kl * kl_scale * KL

CE is the batch-mean cross-entropy; KSVD is `KEP_KSVD_SPEC` summed over KEP layers (lam to the first power, means
over batch, heads and positions, squared once per layer); KL is the sum over KEP layers of each layer's KL, itself
summed over heads and output dims. The authors add the KL UNSCALED (`kl_scale = 1`): against a per-example mean CE
that weights the prior as if the training set held one example (at initialisation the KL is 1e3-4e4 against a CE of
2-8). The evidence lower bound per training example scales it by 1 / (training set size): `elbo_kl_scale(n)`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from primal_jax.attention.kep_svgp.layer import KEP_KSVD_SPEC, kl_loss
from primal_jax.ksvd import check_eta, ksvd_loss
from primal_jax.validation import check_choice

AVERAGES = ("logits", "probs")


def elbo_kl_scale(num_train_examples: int) -> float:
  """1 / N: the KL's weight in the per-example evidence lower bound (the authors use 1)."""
  if not isinstance(num_train_examples, int) or num_train_examples < 1:
    raise ValueError(f"num_train_examples must be an integer >= 1, got {num_train_examples!r}")
  return 1.0 / num_train_examples


def kep_loss(
  ce: jax.Array, collections: dict, *, eta_ksvd: float, eta_kl: float, kl_scale: float = 1.0
) -> dict[str, jax.Array]:
  """{"total", "ce", "ksvd", "kl"} from the batch-mean cross-entropy and the `ksvd` and `kl` collections an apply
  with mutable=["ksvd", "kl"] returned ("kl" unscaled: the authors' `loss_kl`). ValueError when either collection
  is missing (the regulariser would silently vanish) or an eta / kl_scale is negative or not finite."""
  check_eta(eta_ksvd)
  check_eta(eta_kl)
  check_eta(kl_scale)
  for name in ("ksvd", "kl"):
    if not collections.get(name):
      raise ValueError(f"collections has no {name!r}: apply the model with mutable=['ksvd', 'kl']")
  ksvd = ksvd_loss(collections["ksvd"], KEP_KSVD_SPEC)
  kl = kl_loss(collections["kl"])
  return {"total": ce + eta_ksvd * ksvd + eta_kl * kl_scale * kl, "ce": ce, "ksvd": ksvd, "kl": kl}


def mc_probabilities(logits: jax.Array, average: str = "logits") -> jax.Array:
  """[..., classes] predictive probabilities from [samples, ..., classes] logits of independent posterior draws.

  "logits": softmax of the mean logits (the authors' `valid.py`, 10 draws); "probs": the mean of the softmaxes (the
  Monte Carlo estimate of the posterior predictive).
  """
  check_choice(average, AVERAGES, "average")
  if average == "logits":
    return jax.nn.softmax(jnp.mean(logits, axis=0), axis=-1)
  return jnp.mean(jax.nn.softmax(logits, axis=-1), axis=0)


def mc_logits(apply_fn, rng: jax.Array, num_samples: int) -> jax.Array:
  """[num_samples, ...] logits of `apply_fn(key)` (a model apply with rngs={"posterior": key}) for independent keys."""
  if not isinstance(num_samples, int) or num_samples < 1:
    raise ValueError(f"num_samples must be an integer >= 1, got {num_samples!r}")
  return jnp.stack([apply_fn(key) for key in jax.random.split(rng, num_samples)])
