"""The jitted train and eval steps of a classification task with the KSVD regulariser.

Loss = weighted mean cross-entropy + eta * KSVD loss (paper eq. 10), both
averaged over the real examples of the batch only (`batch["weight"]` is 0 for
the padding rows that keep the last batch of an epoch full-sized).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from primal_jax.ksvd import KSVD_COLLECTION, PAPER, RELEASE_LRA, RELEASE_SEQUENCE, KSVDSpec, ksvd_loss_per_sample
from primal_jax.models.builders import BuiltModel
from primal_jax.training.state import TrainState

KSVD_SPECS = {"release_sequence": RELEASE_SEQUENCE, "release_lra": RELEASE_LRA, "paper": PAPER}


def ksvd_spec(name: str) -> KSVDSpec:
  if name not in KSVD_SPECS:
    raise ValueError(f"ksvd.spec must be one of {sorted(KSVD_SPECS)}, got {name!r}")
  return KSVD_SPECS[name]


def _weighted_mean(values: jax.Array, weights: jax.Array) -> jax.Array:
  return jnp.sum(values * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def classification_loss(
  built: BuiltModel, params, model_state, batch, rng, *, eta: float, spec: KSVDSpec, train: bool
) -> tuple[jax.Array, tuple[dict, dict]]:
  """(total loss, (scalars, new model_state)) of one batch."""
  variables = {"params": params, **model_state}
  mutable = [KSVD_COLLECTION, *model_state.keys()] if train else [KSVD_COLLECTION]
  inputs = [batch[k] for k in built.input_keys]
  logits, new_vars = built.module.apply(
    variables, *inputs, deterministic=not train, rngs={"dropout": rng} if train else None, mutable=mutable
  )
  logits = logits.astype(jnp.float32)  # [B, classes]
  weights = batch["weight"].astype(jnp.float32)  # [B]
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])  # [B]
  ksvd = ksvd_loss_per_sample(new_vars.get(KSVD_COLLECTION, {}), spec).astype(jnp.float32)  # [B] or []
  ksvd_mean = _weighted_mean(ksvd, weights) if ksvd.ndim else ksvd
  task = _weighted_mean(ce, weights)
  correct = (jnp.argmax(logits, -1) == batch["label"]).astype(jnp.float32)
  scalars = {
    "loss": task + eta * ksvd_mean,
    "task_loss": task,
    "ksvd_loss": ksvd_mean,
    "accuracy": _weighted_mean(correct, weights),
    # Sums for exact eval metrics over a whole split (normalised on the host).
    "correct_sum": jnp.sum(correct * weights),
    "task_loss_sum": jnp.sum(ce * weights),
    "count": jnp.sum(weights),
  }
  new_state = {k: new_vars[k] for k in model_state} if train else model_state
  return scalars["loss"], (scalars, new_state)


def make_train_step(built: BuiltModel, tx: optax.GradientTransformation, schedule: Callable, *, eta: float, spec):
  """(state, batch) -> (state, scalars); jit it with the state donated."""

  def train_step(state: TrainState, batch) -> tuple[TrainState, dict]:
    rng = jax.random.fold_in(state.rng, state.step)

    def loss_fn(params):
      return classification_loss(built, params, state.model_state, batch, rng, eta=eta, spec=spec, train=True)

    (_, (scalars, model_state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    scalars = {
      **{k: v for k, v in scalars.items() if not k.endswith("_sum") and k != "count"},
      "grad_norm": optax.tree.norm(grads),
      "param_norm": optax.tree.norm(params),
      "learning_rate": jnp.asarray(schedule(state.step), jnp.float32),
    }
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, model_state=model_state)
    return new_state, scalars

  return train_step


def make_eval_step(built: BuiltModel, *, eta: float, spec):
  """(state, batch) -> summed metrics {correct_sum, task_loss_sum, count, ksvd_loss}."""

  def eval_step(state: TrainState, batch) -> dict:
    _, (scalars, _) = classification_loss(
      built, state.params, state.model_state, batch, None, eta=eta, spec=spec, train=False
    )
    return {
      "correct_sum": scalars["correct_sum"],
      "task_loss_sum": scalars["task_loss_sum"],
      "ksvd_loss_sum": scalars["ksvd_loss"] * scalars["count"],
      "count": scalars["count"],
    }

  return eval_step
