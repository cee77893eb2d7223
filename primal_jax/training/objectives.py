"""Task objectives: what the train and eval steps minimise and measure, one small class per kind of task.

An objective turns a model's outputs and a batch into weighted *sums* (the task loss, each metric) and
their denominator, never into means: the train step divides on device for the gradient, while eval
steps return the sums and the host divides them (float64) once a whole split is summed, so padding
rows, a short last batch or the split of a batch over hosts never bias a metric. The `eta * KSVD`
regulariser is not part of an objective: the steps add it for whichever model sows KSVD terms.

Batch contracts (every weight is 1 for a real unit, 0 for padding):
  classification  label int32 [b], weight float32 [b], optionally label_probs float32 [b, classes]
                  (soft targets: Mixup/CutMix, label smoothing); outputs: logits [b, classes].
  regression      targets float32 [b, T, d] (or [b, d]), weight float32 [b, T] (or [b]);
                  outputs: predictions shaped like targets.
  next_token      targets int32 [b, T] (the inputs shifted by one), weight float32 [b, T];
                  outputs: logits [b, T, vocab].

Which objective a run uses: `config.task` when set, else the model builder's `BuiltModel.task`
("classification" for every classifier, so existing configs need nothing). The objectives are a registry
(`primal_jax.registry.Registry`): a new kind of task is one `Objective` subclass plus one `register_objective`
line, and a test registers its own with `registered_objective` for the duration of a `with` block.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax

from primal_jax.attention.kep_svgp import KL_COLLECTION, kl_loss
from primal_jax.attention.kep_svgp.loss import elbo_kl_scale
from primal_jax.registry import Registry

# Whether a larger value of a metric is better: what "best" means for selection and checkpoint retention.
METRIC_MODES = types.MappingProxyType(
  {
    "accuracy": "max",
    "loss": "min",
    "ksvd_loss": "min",
    "kl_loss": "min",
    "mse": "min",
    "bits_per_byte": "min",
    "perplexity": "min",
    "normalized_score": "max",
    "return": "max",
  }
)


@dataclasses.dataclass(frozen=True)
class Sums:
  """One batch's contribution, every field a float32 [] summed over real units (examples, tokens, positions).

  Attributes:
    loss: sum of weight * per-unit task loss.
    count: sum of weights, the denominator of `loss` and of every entry of `metrics`.
    metrics: name (ending in "_sum") -> weighted sum, e.g. {"correct_sum": ...}.
  """

  loss: jax.Array
  count: jax.Array
  metrics: Mapping[str, jax.Array]


def _check_keys(batch: Mapping, keys: tuple[str, ...], task: str) -> None:
  missing = [k for k in keys if k not in batch]
  if missing:
    raise ValueError(f"task {task!r} needs batch keys {list(keys)}; the batch has {sorted(batch)} (missing {missing})")


def _mean(sums: Mapping[str, float], key: str) -> float:
  return float(sums[key]) / max(float(sums["count"]), 1.0)


class Objective:
  """The interface every task implements (subclasses are frozen dataclasses without fields).

  Attributes:
    name: the registry key (`config.task`).
    batch_keys: what `sums` reads from the batch.
    metric_names: the keys `metrics` returns.
    selection_metric: the metric that picks the best evaluation (`summary`, the best-validation state).
  """

  name: ClassVar[str]
  batch_keys: ClassVar[tuple[str, ...]]
  metric_names: ClassVar[tuple[str, ...]]
  selection_metric: ClassVar[str]

  def sums(self, outputs: jax.Array, batch: Mapping[str, jax.Array]) -> Sums:
    """Weighted sums of one batch (on device, inside jit)."""
    raise NotImplementedError

  def metrics(self, sums: Mapping[str, float]) -> dict[str, float]:
    """The task's metrics from summed `Sums` (host floats, keyed "task_loss_sum", "count" and `Sums.metrics`)."""
    raise NotImplementedError

  # Model collections besides `ksvd` that the steps make mutable and pass to `penalties` (e.g. KEP-SVGP's "kl").
  collections: ClassVar[tuple[str, ...]] = ()
  # The names `penalties` returns: recorded as train scalars and evaluation metrics, each unweighted.
  penalty_names: ClassVar[tuple[str, ...]] = ()

  def penalties(self, collections: Mapping) -> dict[str, tuple[jax.Array, float]]:
    """name -> (value [], weight) of the loss terms read from the model's `collections` (the dict of the apply's
    mutable collections); the steps add weight * value to the loss. None by default."""
    del collections
    return {}

  def configured(self, config, split_sizes: Mapping[str, int]) -> Objective:
    """This objective with its config keys applied (`build_experiment` calls it); itself by default, refusing a
    `kl` section (KEP-SVGP's keys: it would be silently ignored)."""
    del split_sizes
    if config.get("kl"):
      raise ValueError(f"config.kl (the KL's eta and scale) applies to task='kep_svgp' only, not task={self.name!r}")
    return self

  @property
  def selection_mode(self) -> str:
    return METRIC_MODES[self.selection_metric]


@dataclasses.dataclass(frozen=True)
class Classification(Objective):
  """Weighted softmax cross-entropy over examples; accuracy.

  With `label_probs` in the batch (soft targets from `primal_jax.tasks.vision.label_mixing`) the loss is the
  cross-entropy against those distributions; accuracy still counts the argmax against `label`.
  """

  name: ClassVar[str] = "classification"
  batch_keys: ClassVar[tuple[str, ...]] = ("label", "weight")
  metric_names: ClassVar[tuple[str, ...]] = ("accuracy",)
  selection_metric: ClassVar[str] = "accuracy"

  def sums(self, outputs, batch) -> Sums:
    _check_keys(batch, self.batch_keys, self.name)
    logits = outputs.astype(jnp.float32)  # [b, classes]
    weight = batch["weight"].astype(jnp.float32)  # [b]
    if logits.ndim != 2 or weight.shape != logits.shape[:1]:
      raise ValueError(f"classification needs logits [b, classes] and weight [b], got {logits.shape}, {weight.shape}")
    if "label_probs" in batch:
      probs = batch["label_probs"].astype(jnp.float32)  # [b, classes]
      if probs.shape != logits.shape:
        raise ValueError(f"classification: label_probs {probs.shape} must be shaped like the logits {logits.shape}")
      ce = optax.softmax_cross_entropy(logits, probs)  # [b]
    else:
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])  # [b]
    correct = (jnp.argmax(logits, -1) == batch["label"]).astype(jnp.float32)  # [b]
    return Sums(jnp.sum(ce * weight), jnp.sum(weight), {"correct_sum": jnp.sum(correct * weight)})

  def metrics(self, sums) -> dict[str, float]:
    return {"accuracy": _mean(sums, "correct_sum")}


@dataclasses.dataclass(frozen=True)
class Regression(Objective):
  """Masked mean squared error: sum(weight * mean_d (pred - target)^2) / sum(weight).

  The Decision Transformer's action loss: padded time steps (weight 0) contribute nothing, and each
  real step counts once whatever its action dimension d.
  """

  name: ClassVar[str] = "regression"
  batch_keys: ClassVar[tuple[str, ...]] = ("targets", "weight")
  metric_names: ClassVar[tuple[str, ...]] = ("mse",)
  selection_metric: ClassVar[str] = "mse"

  def sums(self, outputs, batch) -> Sums:
    _check_keys(batch, self.batch_keys, self.name)
    pred = outputs.astype(jnp.float32)  # [b, T, d] or [b, d]
    targets = batch["targets"].astype(jnp.float32)
    weight = batch["weight"].astype(jnp.float32)  # [b, T] or [b]
    if pred.shape != targets.shape or weight.shape != targets.shape[:-1]:
      raise ValueError(
        f"regression needs predictions shaped like targets and weight = targets.shape[:-1]; got predictions "
        f"{pred.shape}, targets {targets.shape}, weight {weight.shape}"
      )
    per_unit = jnp.mean(jnp.square(pred - targets), axis=-1)  # [b, T] or [b]
    return Sums(jnp.sum(per_unit * weight), jnp.sum(weight), {})

  def metrics(self, sums) -> dict[str, float]:
    return {"mse": _mean(sums, "task_loss_sum")}


@dataclasses.dataclass(frozen=True)
class NextToken(Objective):
  """Cross-entropy per real target token; token accuracy, bits per byte and perplexity.

  bits_per_byte = mean token cross-entropy (nats) / ln 2, which is bits per byte when every token is
  one byte (the `text_bytes` task); perplexity = exp(mean token cross-entropy). Both are computed on
  the host from the summed loss, so they are exact over a whole split rather than means of batch values.
  """

  name: ClassVar[str] = "next_token"
  batch_keys: ClassVar[tuple[str, ...]] = ("targets", "weight")
  metric_names: ClassVar[tuple[str, ...]] = ("accuracy", "bits_per_byte", "perplexity")
  selection_metric: ClassVar[str] = "bits_per_byte"

  def sums(self, outputs, batch) -> Sums:
    _check_keys(batch, self.batch_keys, self.name)
    logits = outputs.astype(jnp.float32)  # [b, T, vocab]
    weight = batch["weight"].astype(jnp.float32)  # [b, T]
    targets = batch["targets"]  # [b, T]
    if logits.ndim != 3 or targets.shape != logits.shape[:2] or weight.shape != targets.shape:
      raise ValueError(
        f"next_token needs logits [b, T, vocab], targets and weight [b, T]; got {logits.shape}, "
        f"{targets.shape}, {weight.shape}"
      )
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)  # [b, T]
    correct = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)  # [b, T]
    return Sums(jnp.sum(ce * weight), jnp.sum(weight), {"correct_sum": jnp.sum(correct * weight)})

  def metrics(self, sums) -> dict[str, float]:
    mean_ce = _mean(sums, "task_loss_sum")
    with np.errstate(over="ignore"):  # a diverged model's perplexity is inf, not an exception
      perplexity = float(np.exp(np.float64(mean_ce)))
    return {"accuracy": _mean(sums, "correct_sum"), "bits_per_byte": mean_ce / math.log(2.0), "perplexity": perplexity}


@dataclasses.dataclass(frozen=True)
class OfflineRL(Regression):
  """The Decision Transformer's action regression (masked MSE, as `Regression`), selected on rollouts.

  Training minimises the action MSE; evaluations are rollouts in the environment (the pipeline's
  `evaluate_split`), so the selection metric is the D4RL normalised score, larger is better.
  """

  name: ClassVar[str] = "offline_rl"
  selection_metric: ClassVar[str] = "normalized_score"


KL_SCALES = ("none", "dataset")


@dataclasses.dataclass(frozen=True)
class KEPSVGP(Classification):
  """KEP-SVGP's loss (Chen et al., ICML 2024, `CIFAR/train.py compute_loss`): classification cross-entropy +
  eta_kl * kl_scale * KL, where KL sums the `kl` collection of the model's KEP-SVGP layers; the steps add
  ksvd.eta * KSVD as for every model (the authors' KSVD term is `ksvd.spec="release_kep"`).

  Config (`configured`): `kl.eta` (default 1.0, the authors'), `kl.scale` "none" (default, the authors':
  the KL unscaled next to a per-example mean cross-entropy) or "dataset" (1 / the number of training examples:
  the per-example evidence lower bound). A model without KEP-SVGP layers is refused at the first step.
  """

  eta_kl: float = 1.0
  kl_scale: float = 1.0

  name: ClassVar[str] = "kep_svgp"
  collections: ClassVar[tuple[str, ...]] = (KL_COLLECTION,)
  penalty_names: ClassVar[tuple[str, ...]] = ("kl_loss",)

  def penalties(self, collections) -> dict[str, tuple[jax.Array, float]]:
    return {"kl_loss": (kl_loss(collections.get(KL_COLLECTION, {})).astype(jnp.float32), self.eta_kl * self.kl_scale)}

  def configured(self, config, split_sizes) -> KEPSVGP:
    section = config.get("kl") or {}
    eta, scale = section.get("eta", 1.0), section.get("scale", "none")
    if isinstance(eta, bool) or not isinstance(eta, (int, float)) or not math.isfinite(eta) or eta < 0:
      raise ValueError(f"kl.eta must be a finite number >= 0, got {eta!r}")
    if scale not in KL_SCALES:
      raise ValueError(f"kl.scale must be one of {KL_SCALES}, got {scale!r}")
    factor = 1.0 if scale == "none" else elbo_kl_scale(int(split_sizes["train"]))
    return dataclasses.replace(self, eta_kl=float(eta), kl_scale=factor)


def _check_objective(value) -> None:
  if not isinstance(value, Objective):
    raise ValueError(f"an objective must be an instance of primal_jax.training.objectives.Objective, got {value!r}")
  if value.selection_metric not in METRIC_MODES:
    raise ValueError(f"objective {value!r}: selection_metric {value.selection_metric!r} is not one of METRIC_MODES")


# config.task -> objective: a read-only Mapping; extend it with `register_objective`.
OBJECTIVES: Registry[Objective] = Registry("objective", "task", _check_objective)
for _cls in (Classification, Regression, NextToken, OfflineRL, KEPSVGP):
  OBJECTIVES.register(_cls.name, _cls(), builtin=True)


def register_objective(name: str, objective: Objective, *, replace: bool = False) -> None:
  """Makes `objective` available as `config.task=name` (and as a model's `BuiltModel.task`)."""
  OBJECTIVES.register(name, objective, replace=replace)


def unregister_objective(name: str) -> None:
  """Removes an objective registered with `register_objective` (a replaced built-in gets its own back)."""
  OBJECTIVES.unregister(name)


def registered_objective(name: str, objective: Objective, *, replace: bool = False):
  """`register_objective` for the duration of a `with` block."""
  return OBJECTIVES.registered(name, objective, replace=replace)


def get_objective(name: str) -> Objective:
  """The objective registered under `name` (a `config.task` value); a ConfigError listing the names otherwise."""
  return OBJECTIVES.get(name)


def metric_mode(metric: str) -> str:
  """'max' or 'min': whether larger is better for `metric`, e.g. 'validation/accuracy' or 'test/bits_per_byte'."""
  name = metric.rsplit("/", 1)[-1]
  if name not in METRIC_MODES:
    raise ValueError(f"best_metric {metric!r}: unknown metric {name!r}; known metrics: {', '.join(METRIC_MODES)}")
  return METRIC_MODES[name]
