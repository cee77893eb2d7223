"""Evaluations during a run: the test protocol, the history of evaluations, the best state and the summary.

Test protocols (`config.test_eval`):
  "every_eval" (default, the release's): every evaluation covers every split, test included, and the
    summary reports the best test value of the task's selection metric over them.
  "best_validation" (no test-set selection): evaluations cover only the validation split
    (`data.val_fraction > 0`); the state at the best validation value (the latest on ties, as the
    Checkpointer's best step) is kept on device and the test split is evaluated once, at the end, on it.

"Best" is the objective's selection metric and direction (`objectives`): accuracy (max) for
classification, mse (min) for regression, bits_per_byte (min) for language modelling.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from primal_jax.atomic_files import read_json, write_json_atomically
from primal_jax.training.checkpointing import Checkpointer
from primal_jax.training.metrics import MetricWriter
from primal_jax.training.objectives import Objective
from primal_jax.training.sharding import global_batch
from primal_jax.training.state import TrainState
from primal_jax.training.steps import eval_metrics

TEST_EVALS: tuple[str, ...] = ("every_eval", "best_validation")
HISTORY_FILE = "eval_history.json"
# Eval batches in flight before the host fetches the oldest one's sums: the device never waits for the
# host, and at most this many batches of inputs sit on the device at once.
_EVAL_LAG = 2


def evaluate_batches(eval_step, state: TrainState, batches: Iterable, mesh, objective: Objective) -> dict[str, float]:
  """The objective's metrics, loss, ksvd_loss and count of `state` over every batch (sums added in float64)."""
  sums: dict[str, float] = {}
  pending: collections.deque = collections.deque()

  def add(out) -> None:
    for k, v in jax.device_get(out).items():
      sums[k] = sums.get(k, 0.0) + float(v)

  for local in batches:
    pending.append(eval_step(state, global_batch(local, mesh)))
    if len(pending) > _EVAL_LAG:
      add(pending.popleft())
  while pending:
    add(pending.popleft())
  if not sums:
    raise ValueError("evaluate_batches got no batches")
  return eval_metrics(objective, sums)


def evaluate_split(experiment, state: TrainState, split: str, eval_step=None) -> dict[str, float]:
  """The metrics of `state` on `split`: by the pipeline's own `evaluate_split` where it sets one (offline RL
  evaluates by rollouts in the environment), else over every eval batch of the split with `eval_step`."""
  own = experiment.pipeline.evaluate_split
  if own is not None:
    return own(experiment.built.module.apply, state.params, split)
  step = eval_step or experiment.eval_step()
  return evaluate_batches(step, state, experiment.pipeline.eval_batches(split), experiment.mesh, experiment.objective)


@dataclasses.dataclass(frozen=True)
class EvalProtocol:
  """What each periodic evaluation covers and how its best is chosen.

  Attributes:
    test_eval: one of TEST_EVALS.
    splits: the splits every periodic evaluation covers.
    metric, mode: the selection metric ("accuracy") and whether larger ("max") or smaller ("min") is better.
  """

  test_eval: str
  splits: tuple[str, ...]
  metric: str
  mode: str

  def better_or_equal(self, value: float, than: float) -> bool:
    return value >= than if self.mode == "max" else value <= than

  def best_row(self, history: list[dict], key: str) -> dict:
    """The evaluation with the best `key`, the latest on ties (the Checkpointer's best-step rule)."""
    sign = 1.0 if self.mode == "max" else -1.0
    return max(enumerate(history), key=lambda ih: (sign * ih[1][key], ih[0]))[1]


def eval_protocol(config, data_splits: Iterable[str], objective: Objective) -> EvalProtocol:
  """The protocol of `config.test_eval`, checked against the data's splits and `config.best_metric`."""
  splits = tuple(s for s in data_splits if s != "train")
  metric = objective.selection_metric
  test_eval = config.get("test_eval", "every_eval")
  if test_eval not in TEST_EVALS:
    raise ValueError(f"test_eval must be one of {', '.join(TEST_EVALS)}, got {test_eval!r}")
  protocol = EvalProtocol(test_eval, splits, metric, objective.selection_mode)
  if test_eval == "every_eval":
    return protocol
  if "validation" not in splits or "test" not in splits:
    raise ValueError(
      f"test_eval='best_validation' needs validation and test splits (data.val_fraction > 0), got {list(splits)}"
    )
  if (config.get("best_metric") or None) != f"validation/{metric}":
    raise ValueError(
      f"test_eval='best_validation' selects on validation/{metric}; set best_metric='validation/{metric}' so a "
      f"resumed run finds that state among the checkpoints (got {config.get('best_metric')!r})"
    )
  return dataclasses.replace(protocol, splits=("validation",))


def summarize(history: list[dict], protocol: EvalProtocol) -> dict:
  """Final metrics, the best value per split over evaluations (the release's protocol), and test at the
  best validation evaluation (the protocol without test selection). Ties go to the latest evaluation."""
  if not history:
    return {}
  metric = protocol.metric
  summary = {"final": history[-1]}
  for split in protocol.splits:
    best = protocol.best_row(history, f"{split}/{metric}")
    summary[f"best_{split}"] = {"step": best["step"], metric: best[f"{split}/{metric}"]}
  if "validation" in protocol.splits and "test" in protocol.splits:
    best = protocol.best_row(history, f"validation/{metric}")
    summary["test_at_best_validation"] = {"step": best["step"], metric: best[f"test/{metric}"]}
  return summary


def summary_rows(summary: dict, metric: str) -> list[dict]:
  """Rows of the closing table: the final value per split, then every best-of entry."""
  final = summary.get("final", {})
  rows = [
    {"metric": f"final {k}", "step": final["step"], "value": f"{v:.4f}"}
    for k, v in final.items()
    if k.endswith(f"/{metric}")
  ]
  rows += [
    {"metric": k.replace("_", " "), "step": v["step"], "value": f"{v[metric]:.4f}"}
    for k, v in summary.items()
    if isinstance(v, dict) and metric in v
  ]
  return rows


class _BestState:
  """A device copy of params and model_state at the best validation value so far.

  A copy, not a reference: the train step donates the state's buffers. On device, not on the host, so it
  works for arrays spread over several processes. `params is None` while the best evaluation predates this
  process (a resumed run): the state then comes from the Checkpointer's best step.
  """

  def __init__(self, history: list[dict], protocol: EvalProtocol):
    self._protocol = protocol
    self._key = f"validation/{protocol.metric}"
    best = protocol.best_row(history, self._key) if history else None
    self.step = best["step"] if best else None
    self.value = best[self._key] if best else (-math.inf if protocol.mode == "max" else math.inf)
    self.params = self.model_state = None
    self._copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))

  def update(self, row: dict, state: TrainState) -> None:
    if self._protocol.better_or_equal(row[self._key], self.value):
      self.step, self.value = row["step"], row[self._key]
      self.params, self.model_state = self._copy((state.params, state.model_state))

  def state(self, state: TrainState, ckpt: Checkpointer, abstract: TrainState) -> TrainState:
    """`state` carrying the best params and model_state."""
    if self.params is None:  # checked at the resume: the Checkpointer's best step is this one
      restored, _ = ckpt.restore(abstract, step=self.step)
      self.params, self.model_state = restored.params, restored.model_state
    return state.replace(params=self.params, model_state=self.model_state)


class Evaluations:
  """The periodic evaluations of one run: runs them, logs them, keeps `eval_history.json` and the best state.

  A resumed run (`start` > 0) continues the history saved in the workdir, dropping evaluations after
  `start` (they belonged to steps being redone).
  """

  def __init__(
    self, experiment, protocol: EvalProtocol, workdir: Path, writer: MetricWriter, *, start: int,
    log: Callable[[str], None],
  ):  # fmt: skip
    self._exp, self.protocol, self._writer, self._log = experiment, protocol, writer, log
    self._eval_step = experiment.eval_step()
    self._path = Path(workdir) / HISTORY_FILE
    self.history: list[dict] = []
    if start and self._path.exists():
      remedy = "Remove it to resume with an empty history (the summary's best-of values then cover later evaluations)."
      self.history = [h for h in read_json(self._path, "the run's evaluations", remedy=remedy) if h["step"] <= start]
    self.best = _BestState(self.history, protocol) if protocol.test_eval == "best_validation" else None

  def missing_best_checkpoint(self, ckpt: Checkpointer) -> int | None:
    """The best validation step if a resumed run cannot restore it (it was never checkpointed), else None."""
    if self.best is None or self.best.step is None or ckpt.best_step() == self.best.step:
      return None
    return self.best.step

  def split(self, state: TrainState, split: str) -> dict[str, float]:
    return evaluate_split(self._exp, state, split, self._eval_step)

  def run(self, step: int, state: TrainState) -> dict[str, float]:
    """Evaluates every split of the protocol at `step`; returns {"<split>/<metric>": value}."""
    metrics = {}
    for split in self.protocol.splits:
      values = self.split(state, split)
      self._writer.write(step, values, prefix=split)
      metrics.update({f"{split}/{k}": v for k, v in values.items() if k != "count"})
    row = {"step": step, **metrics}
    self.history.append(row)
    if self.best is not None:
      self.best.update(row, state)
    if self._writer.is_primary:
      write_json_atomically(self._path, self.history, indent=1)
    epoch = step / self._exp.pipeline.steps_per_epoch
    self._log(f"  eval at step {step} (epoch {epoch:g}): " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    return metrics

  def test_at_best_validation(self, state: TrainState, ckpt: Checkpointer) -> dict | None:
    """best_validation protocol: the test split evaluated once, on the best validation state (None otherwise)."""
    if self.best is None or self.best.step is None:
      return None
    metric = self.protocol.metric
    test = self.split(self.best.state(state, ckpt, self._exp.abstract), "test")
    self._writer.write(self.best.step, test, prefix="test")
    self._log(f"  test at the best validation evaluation (step {self.best.step}): {metric} {test[metric]:.4f}")
    return {"step": self.best.step, metric: test[metric], **({"loss": test["loss"]} if "loss" in test else {})}

  def summary(self) -> dict[str, Any]:
    return summarize(self.history, self.protocol)
