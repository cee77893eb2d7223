"""The uncertainty evaluation of trained classifiers: failure prediction, calibration, shift and OOD detection.

Per method (how a trained model's predictive probabilities are formed) and per trained model::

  msp          the softmax model's own probabilities (one deterministic forward), confidence = their maximum
  temperature  the same logits divided by T, T fitted on the validation split by NLL (`calibration.fit_temperature`)
  mc_dropout   the softmax model with dropout active at test: the mean of `samples` forwards' probabilities
  ensemble     the mean probabilities of several softmax models (`evaluate_ensemble`)
  kep          a KEP-SVGP model: the mean of the probabilities of `samples` posterior draws (the Monte Carlo
               posterior predictive)
  kep_logits   the same draws, softmax of their mean logits (what the authors' `valid.py` does, with 10 draws)

and per set: the test split (every metric of `primal_jax.analysis.uncertainty.uncertainty_metrics`: accuracy,
AURC, E-AURC, AUROC, AUPR success/error, FPR at 95% TPR, ECE with 15 bins, NLL and Brier, plus the reliability
bins and the risk-coverage curve), the first `corruption_examples` test images under every corruption x severity
(`corruptions.corrupt`, seeded), and OOD detection of the 8 x 8 digits (`ood.ood_digits`) against the test split
with the method's confidence as the score (in-distribution positive: AUROC, AUPR-in, AUPR-out, FPR of the digits
at 95% of the test images accepted). NLL is computed from the predictive probabilities (log p of the label), so it
is the NLL of the averaged predictive for the sampling methods.

Public entry points: `evaluate_run(workdir, settings)` (one trained run: its methods by model kind) and
`evaluate_ensemble(workdirs, settings)`; `evaluate_model(predict, sets)` for any `images -> probabilities`.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import jax
import numpy as np

from primal_jax.analysis import uncertainty as metrics
from primal_jax.tasks.uncertainty.calibration import fit_temperature
from primal_jax.tasks.uncertainty.corruptions import CORRUPTIONS, SEVERITIES, corrupt

METHODS: Mapping[str, tuple[str, ...]] = types.MappingProxyType(
  {
    "softmax": ("msp", "temperature", "mc_dropout"),
    "primal_plus": ("msp",),
    "kep_paper": ("kep", "kep_logits"),
    "kep_release": ("kep", "kep_logits"),
  }
)
RECORD = "uncertainty.json"  # a run's evaluation, beside its result.json
ENSEMBLE_RECORD = "ensemble.json"  # an ensemble's, in the directory of its first member
_TINY = 1e-300


@dataclasses.dataclass(frozen=True)
class EvalSettings:
  """samples: MC-dropout forwards and KEP-SVGP posterior draws; corruption_examples: test images per corruption
  and severity (the first ones); test_examples / validation_examples: 0 = the whole split; risk_points: points of
  the stored risk-coverage curve; seed: the corruptions' and the forwards' randomness."""

  samples: int = 5
  corruption_examples: int = 1000
  test_examples: int = 0
  validation_examples: int = 0
  risk_points: int = 20
  seed: int = 0
  ood: bool = True

  def __post_init__(self):
    for name in ("samples", "corruption_examples", "risk_points"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        raise ValueError(f"EvalSettings.{name} must be an integer >= 1, got {getattr(self, name)!r}")


def model_kind(config) -> str:
  """softmax, primal_plus, kep_paper or kep_release, from the config's last attention layer."""
  last = config.model.layers[-1]
  if last == "kep_svgp":
    return "kep_" + config.model.attention.kep_svgp.get("form", "paper")
  if last == "primal":
    return "primal_plus"
  if set(config.model.layers) == {"softmax"}:
    return "softmax"
  raise ValueError(f"model.layers {tuple(config.model.layers)} is none of this family's models ({', '.join(METHODS)})")


def split_arrays(pipeline, split: str, limit: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """(uint8 images [n, H, W, C], labels [n]) of a pipeline's split (the first `limit`; 0 = all)."""
  source = pipeline.sources[split]
  n = len(source) if not limit else min(limit, len(source))
  examples = [source[i] for i in range(n)]
  return np.stack([np.asarray(e["image"], np.uint8) for e in examples]), np.array([e["label"] for e in examples])


class Forward:
  """Logits of one trained model on uint8 images, batched at a fixed size (one compilation per mode)."""

  def __init__(self, experiment, state):
    self.module = experiment.built.module
    self.variables = {"params": state.params, **state.model_state}
    self.batch = int(experiment.config.data.eval_batch_size)
    data = experiment.config.data
    self.mean = np.asarray(data.mean, np.float32).reshape(-1)
    self.std = np.asarray(data.std, np.float32).reshape(-1)

    @functools.partial(jax.jit, static_argnames="deterministic")
    def apply(variables, x, key, deterministic):
      rngs = {"dropout": key, "posterior": jax.random.fold_in(key, 2), "redraw": jax.random.fold_in(key, 1)}
      return self.module.apply(variables, x, deterministic=deterministic, rngs=rngs)

    self._apply = apply

  def logits(self, images, *, deterministic: bool = True, samples: int = 1, key=None) -> np.ndarray:
    """[samples, n, classes] float32: `samples` forwards, each batch of each with its own key."""
    images = np.asarray(images)
    key = jax.random.PRNGKey(0) if key is None else key
    out = []
    for start in range(0, len(images), self.batch):
      chunk = images[start : start + self.batch]
      pad = np.minimum(np.arange(self.batch), len(chunk) - 1)  # repeat the last image: one shape, one compilation
      x = (chunk[pad].astype(np.float32) / 255.0 - self.mean) / self.std
      keys = [jax.random.fold_in(jax.random.fold_in(key, s), start) for s in range(samples)]
      out.append(np.stack([np.asarray(self._apply(self.variables, x, k, deterministic))[: len(chunk)] for k in keys]))
    return np.concatenate(out, axis=1)


def softmax(logits) -> np.ndarray:
  """float64 softmax over the last axis."""
  z = np.asarray(logits, np.float64)
  z = np.exp(z - z.max(axis=-1, keepdims=True))
  return z / z.sum(axis=-1, keepdims=True)


def set_metrics(probs, labels) -> dict[str, float]:
  """`analysis.uncertainty.uncertainty_metrics` of predictive probabilities; NLL from log p (not logits)."""
  probs = np.asarray(probs, np.float64)
  return metrics.uncertainty_metrics(probs, labels, logits=np.log(np.maximum(probs, _TINY)))


def ood_metrics(confidence_in, confidence_out) -> dict[str, float]:
  """OOD detection with confidence as the score, in-distribution positive: AUROC, AUPR-in, AUPR-out (the OOD
  images positive, scored by -confidence) and FPR95 (the share of OOD images above the threshold that keeps 95%
  of the in-distribution ones), on the same curves as the failure-prediction metrics."""
  score = np.concatenate([np.asarray(confidence_in, np.float64), np.asarray(confidence_out, np.float64)])
  inside = np.concatenate([np.ones(len(confidence_in), bool), np.zeros(len(confidence_out), bool)])
  return {
    "auroc": metrics.auroc(score, inside),
    "aupr_in": metrics.aupr_success(score, inside),
    "aupr_out": metrics.aupr_error(score, inside),
    "fpr95": metrics.fpr_at_95_tpr(score, inside),
  }


def curves(probs, labels, points: int) -> dict:
  """The reliability bins (15) and the risk-coverage curve at coverage k / points, k = 1..points."""
  confidence, correct = metrics.confidence_and_correct(np.asarray(probs, np.float64), labels)
  bins = metrics.reliability_bins(confidence, correct)
  risk = metrics.risk_curve(confidence, correct)
  at = [int(np.ceil(k / points * risk.size)) - 1 for k in range(1, points + 1)]

  def listed(a):
    return [None if not np.isfinite(v) else float(v) for v in np.asarray(a, np.float64)]

  return {
    "reliability": {
      "count": bins.count.tolist(),
      "accuracy": listed(bins.accuracy),
      "confidence": listed(bins.confidence),
    },
    "risk_coverage": {"coverage": [k / points for k in range(1, points + 1)], "risk": listed(risk[at])},
  }


@dataclasses.dataclass(frozen=True)
class EvalSets:
  """The images a method is evaluated on (uint8 [n, H, W, C]) and their labels."""

  test: tuple[np.ndarray, np.ndarray]
  corrupted: Mapping[tuple[str, int], tuple[np.ndarray, np.ndarray]]
  ood: np.ndarray | None


def eval_sets(pipeline, settings: EvalSettings, ood_images: np.ndarray | None = None) -> EvalSets:
  """The test split (`settings.test_examples`), its first `corruption_examples` images under every corruption and
  severity, and the OOD digits at the images' size (`ood_images` given: those instead; `settings.ood` False: none)."""
  images, labels = split_arrays(pipeline, "test", settings.test_examples)
  head, head_labels = images[: settings.corruption_examples], labels[: settings.corruption_examples]
  corrupted = {(k, s): (corrupt(head, k, s, settings.seed), head_labels) for k in CORRUPTIONS for s in SEVERITIES}
  if ood_images is None and settings.ood:
    from primal_jax.tasks.uncertainty.ood import ood_digits

    ood_images = ood_digits(images.shape[1], images.shape[3])
  return EvalSets((images, labels), corrupted, ood_images if settings.ood or ood_images is not None else None)


def evaluate_model(predict: Callable[[np.ndarray], np.ndarray], sets: EvalSets, settings: EvalSettings) -> dict:
  """{"test": metrics + curves, "corruptions": {kind: {severity: metrics}}, "ood": metrics} of one method;
  `predict(images uint8 [n, H, W, C]) -> probabilities [n, classes]`."""
  images, labels = sets.test
  probs = predict(images)
  out = {"test": {**set_metrics(probs, labels), **curves(probs, labels, settings.risk_points)}, "corruptions": {}}
  for (kind, severity), (x, y) in sets.corrupted.items():
    out["corruptions"].setdefault(kind, {})[str(severity)] = set_metrics(predict(x), y)
  if sets.ood is not None:
    out["ood"] = ood_metrics(probs.max(axis=1), predict(sets.ood).max(axis=1))
  return out


def method_predictors(kind: str, forward: Forward, settings: EvalSettings, validation=None) -> dict[str, Callable]:
  """{method: images -> probabilities} of a model of `kind` (`METHODS[kind]`); `validation` (images, labels)
  fits the temperature."""
  key = jax.random.PRNGKey(settings.seed)
  cache: dict[tuple, np.ndarray] = {}

  def logits(images, deterministic, samples):  # each set's forwards once, shared by the methods that read them
    name = (id(images), deterministic, samples)
    if name not in cache:
      cache[name] = forward.logits(images, deterministic=deterministic, samples=samples, key=key)
    return cache[name]

  predictors = {}
  if kind in ("softmax", "primal_plus"):
    predictors["msp"] = lambda x: softmax(logits(x, True, 1)[0])
  if kind == "softmax":
    images, labels = validation
    temperature = fit_temperature(forward.logits(images)[0], labels)
    predictors["temperature"] = lambda x: softmax(logits(x, True, 1)[0] / temperature)
    predictors["temperature"].temperature = temperature
    predictors["mc_dropout"] = lambda x: softmax(logits(x, False, settings.samples)).mean(axis=0)
  if kind.startswith("kep"):
    predictors["kep"] = lambda x: softmax(logits(x, True, settings.samples)).mean(axis=0)
    predictors["kep_logits"] = lambda x: softmax(logits(x, True, settings.samples).mean(axis=0))
  return predictors


def _load(workdir):
  from primal_jax.training.experiment import load_run_config, load_state

  config = load_run_config(workdir)
  experiment, state = load_state(config, workdir)
  return config, experiment, state


def evaluate_run(workdir, settings: EvalSettings = EvalSettings(), *, ood_images=None) -> dict:
  """The record of one trained run (`experiments.main`'s workdir, its latest checkpoint): {"kind", "seed",
  "step", "settings", "methods": {method: evaluate_model(...)}}, the temperature under methods.temperature."""
  config, experiment, state = _load(workdir)
  kind = model_kind(config)
  forward = Forward(experiment, state)
  sets = eval_sets(experiment.pipeline, settings, ood_images)
  validation = split_arrays(experiment.pipeline, "validation", settings.validation_examples)
  predictors = method_predictors(kind, forward, settings, validation if kind == "softmax" else None)
  methods = {}
  for name, predict in predictors.items():
    methods[name] = evaluate_model(predict, sets, settings)
    if hasattr(predict, "temperature"):
      methods[name]["temperature"] = predict.temperature
  return {
    "kind": kind,
    "seed": int(config.seed),
    "step": int(jax.device_get(state.step)),
    "settings": dataclasses.asdict(settings),
    "methods": methods,
  }


def evaluate_ensemble(workdirs: Sequence, settings: EvalSettings = EvalSettings(), *, ood_images=None) -> dict:
  """The record of the deep ensemble of the softmax runs in `workdirs` (mean of their probabilities; one
  deterministic forward each): {"members": [seeds], "settings", "methods": {"ensemble": ...}}."""
  if len(workdirs) < 2:
    raise ValueError(f"an ensemble needs at least 2 members, got {len(workdirs)}")
  forwards, seeds, sets = [], [], None
  for workdir in workdirs:
    config, experiment, state = _load(workdir)
    if model_kind(config) != "softmax":
      raise ValueError(f"{workdir}: ensemble members must be softmax models, got {model_kind(config)}")
    forwards.append(Forward(experiment, state))
    seeds.append(int(config.seed))
    sets = sets or eval_sets(experiment.pipeline, settings, ood_images)
  cache: dict[int, np.ndarray] = {}

  def predict(images):
    if id(images) not in cache:
      cache[id(images)] = np.mean([softmax(f.logits(images)[0]) for f in forwards], axis=0)
    return cache[id(images)]

  return {
    "members": seeds,
    "settings": dataclasses.asdict(settings),
    "methods": {"ensemble": evaluate_model(predict, sets, settings)},
  }


def write_record(path, record: dict) -> Path:
  """`record` as JSON at `path` (atomically), with the provenance of this process, its devices included (the
  evaluation ran on them)."""
  from primal_jax.atomic_files import write_json_atomically
  from primal_jax.provenance import provenance

  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  write_json_atomically(path, {**record, "provenance": provenance()}, indent=1)
  return path
