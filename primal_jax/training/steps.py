"""The jitted train and eval steps of any task (`objectives`) with the KSVD regulariser.

Loss = the objective's weighted mean task loss + eta * KSVD loss (paper eq. 10) + the objective's penalties
(KEP-SVGP's eta_kl * kl_scale * KL, read from the collections the objective names). The KSVD loss is
whatever the model sows in the `ksvd` collection (0 without Primal layers), averaged over the real
examples of the batch: a row counts when any of its weights is non-zero, so padding rows (which keep
the last batch of an epoch full-sized) drop out of both terms.

Both steps return sums, not means, next to the loss the gradient used; `train_scalars` and
`eval_metrics` normalise them on the host (float64), after the values are fetched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import optax

from primal_jax.attention.baselines.common import REDRAW_RNG
from primal_jax.attention.kep_svgp import KL_COLLECTION
from primal_jax.ksvd import KSVD_COLLECTION, KSVDSpec, check_eta, ksvd_loss_per_sample, resolve_spec
from primal_jax.models.registry import BuiltModel
from primal_jax.training.objectives import Objective, get_objective
from primal_jax.training.state import TrainState

# Device scalars of a train step that are not sums (the host passes them through as they are).
_STEP_SCALARS = ("grad_norm", "param_norm", "learning_rate")


def ksvd_spec(name: str) -> KSVDSpec:
  """The `KSVDSpec` that `config.ksvd.spec` names (one of `KSVD_SPECS`)."""
  return resolve_spec(name, "ksvd.spec")


def _weighted_mean(values: jax.Array, weights: jax.Array) -> jax.Array:
  return jnp.sum(values * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def example_weights(weight: jax.Array) -> jax.Array:
  """[b] weight of each row for per-sequence terms: `weight` itself when [b]; 1 where a [b, T, ...] row has any."""
  if weight.ndim == 1:
    return weight.astype(jnp.float32)
  return (jnp.sum(weight.reshape(weight.shape[0], -1), axis=-1) > 0).astype(jnp.float32)


# A layer may draw at every call besides dropout: Reformer's rotations="per_call" (the release's redraw) from the
# REDRAW_RNG stream, KEP-SVGP's posterior noise from POSTERIOR_RNG. Evaluation draws from fixed keys, so it is
# deterministic (the same rotations and posterior noise for every eval batch of every evaluation).
EVAL_REDRAW_SEED = 0
POSTERIOR_RNG = "posterior"  # `primal_jax.attention.kep_svgp.layer.NOISE_STREAM`


def step_rngs(rng, train: bool) -> dict:
  """The `rngs` of one batch's apply: dropout, the per-call redraw and the posterior noise from the step key when
  training (the step key is the run's key folded with the step), fixed redraw and posterior keys at evaluation."""
  if train:
    return {"dropout": rng, REDRAW_RNG: jax.random.fold_in(rng, 1), POSTERIOR_RNG: jax.random.fold_in(rng, 2)}
  eval_key = jax.random.PRNGKey(EVAL_REDRAW_SEED)
  return {REDRAW_RNG: eval_key, POSTERIOR_RNG: jax.random.fold_in(eval_key, 2)}


def batch_terms(
  built: BuiltModel, objective: Objective, params, model_state, batch, rng, *, spec: KSVDSpec, train: bool
) -> tuple[dict[str, jax.Array], dict]:
  """(terms, new model_state) of one batch; terms are [] float32.

  terms: "task_loss_sum", "count" and the objective's metric sums; "ksvd_loss", the example-weighted
  mean KSVD loss; "examples", the number of real rows; each of the objective's `penalty_names` (unweighted) and
  "penalty_loss", their weighted sum.
  """
  variables = {"params": params, **model_state}
  # The `kl` collection is always collected, so a KEP-SVGP model under an objective that would drop its KL is
  # refused below instead of training without it.
  collections = list(dict.fromkeys([KSVD_COLLECTION, KL_COLLECTION, *objective.collections]))
  mutable = [*collections, *model_state.keys()] if train else collections
  inputs = [batch[k] for k in built.input_keys]
  outputs, new_vars = built.module.apply(
    variables, *inputs, deterministic=not train, rngs=step_rngs(rng, train), mutable=mutable
  )
  if new_vars.get(KL_COLLECTION) and KL_COLLECTION not in objective.collections:
    raise ValueError(
      f"task={objective.name!r} would drop the KL term of the model's KEP-SVGP layers: set task='kep_svgp' "
      "(kl.eta=0 trains without it on purpose)"
    )
  sums = objective.sums(outputs, batch)
  examples = example_weights(batch["weight"])  # [b]
  # allow_empty: any model trains here, one without Primal layers has no terms (and the step, not the
  # caller, makes the collection mutable, so a forgotten mutable cannot happen).
  ksvd = ksvd_loss_per_sample(new_vars.get(KSVD_COLLECTION, {}), spec, allow_empty=True).astype(jnp.float32)
  terms = {
    "task_loss_sum": sums.loss,
    "count": sums.count,
    **sums.metrics,
    "ksvd_loss": _weighted_mean(ksvd, examples) if ksvd.ndim else ksvd,
    "examples": jnp.sum(examples),
  }
  penalties = objective.penalties(new_vars)
  terms.update({name: value for name, (value, _) in penalties.items()})
  terms["penalty_loss"] = sum((weight * value for value, weight in penalties.values()), jnp.zeros((), jnp.float32))
  new_state = {k: new_vars[k] for k in model_state} if train else model_state
  return terms, new_state


def make_train_step(
  built: BuiltModel,
  tx: optax.GradientTransformation,
  schedule: Callable,
  *,
  eta: float,
  spec: KSVDSpec,
  objective: Objective | None = None,
):
  """(state, batch) -> (state, device scalars); jit it with the state donated.

  `objective` defaults to the model's task (`built.task`). The scalars are "loss" (what the gradient
  saw), "ksvd_loss", the objective's sums and grad/param norms and the learning rate: pass them,
  fetched, to `train_scalars`.
  """
  check_eta(eta)
  objective = objective or get_objective(built.task)

  def train_step(state: TrainState, batch) -> tuple[TrainState, dict]:
    rng = jax.random.fold_in(state.rng, state.step)

    def loss_fn(params):
      terms, model_state = batch_terms(
        built, objective, params, state.model_state, batch, rng, spec=spec, train=True
      )  # fmt: skip
      task = terms["task_loss_sum"] / jnp.maximum(terms["count"], 1.0)
      return task + eta * terms["ksvd_loss"] + terms["penalty_loss"], (terms, model_state)

    (loss, (terms, model_state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    scalars = {
      "loss": loss,
      **{k: v for k, v in terms.items() if k not in ("examples", "penalty_loss")},
      "grad_norm": optax.tree.norm(grads),
      "param_norm": optax.tree.norm(params),
      "learning_rate": jnp.asarray(schedule(state.step), jnp.float32),
    }
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state, model_state=model_state)
    return new_state, scalars

  return train_step


def make_eval_step(built: BuiltModel, *, eta: float, spec: KSVDSpec, objective: Objective | None = None):
  """(state, batch) -> summed terms {task_loss_sum, count, <metric>_sum..., ksvd_loss_sum, examples}.

  Sum them over a split (on the host) and pass the totals to `eval_metrics`. `eta` is unused: an
  evaluation reports the task loss and the KSVD loss separately (kept for the symmetric signature).
  """
  del eta
  objective = objective or get_objective(built.task)

  def eval_step(state: TrainState, batch) -> dict:
    terms, _ = batch_terms(built, objective, state.params, state.model_state, batch, None, spec=spec, train=False)
    ksvd_mean = terms.pop("ksvd_loss")
    del terms["penalty_loss"]
    # A penalty is a function of the parameters (one value per batch): weighted by the batch's examples, so the
    # split's sum over batches divided by its examples is the value again.
    penalties = {f"{name}_sum": terms.pop(name) * terms["examples"] for name in objective.penalty_names}
    return {**terms, "ksvd_loss_sum": ksvd_mean * terms["examples"], **penalties}

  return eval_step


def train_scalars(objective: Objective, fetched: Mapping[str, float]) -> dict[str, float]:
  """Host values of one train step's scalars: loss, task_loss, ksvd_loss, the task's metrics, norms, lr."""
  sums = {k: float(v) for k, v in fetched.items()}
  return {
    "loss": sums["loss"],
    "task_loss": sums["task_loss_sum"] / max(sums["count"], 1.0),
    "ksvd_loss": sums["ksvd_loss"],
    **{name: sums[name] for name in objective.penalty_names},
    **objective.metrics(sums),
    **{k: sums[k] for k in _STEP_SCALARS},
  }


def eval_metrics(objective: Objective, sums: Mapping[str, float]) -> dict[str, float]:
  """Metrics of a whole split from its summed eval terms: the task's metrics, loss, ksvd_loss and count."""
  sums = {k: float(v) for k, v in sums.items()}
  return {
    **objective.metrics(sums),
    "loss": sums["task_loss_sum"] / max(sums["count"], 1.0),
    "ksvd_loss": sums["ksvd_loss_sum"] / max(sums["examples"], 1.0),
    **{name: sums[f"{name}_sum"] / max(sums["examples"], 1.0) for name in objective.penalty_names},
    "count": sums["count"],
  }
