"""`train_and_evaluate`: the one train loop behind every experiment binary.

Resume order (first that applies):
  1. the latest checkpoint in `<workdir>/checkpoints` (same run, continued:
     step, optimizer state, RNG and data position are all restored, so a
     killed-and-resumed run ends bit-identical to an uninterrupted one);
  2. `config.init_from`, a workdir or checkpoint directory of another run:
     its params only, with a fresh optimizer at step 0;
  3. a fresh initialisation from `config.seed`.

Test protocols (`config.test_eval`):
  "every_eval" (default, the release's): every evaluation covers every split,
    test included, and the summary reports the best test accuracy over them.
  "best_validation" (no test-set selection): evaluations cover only the
    validation split (`data.val_fraction > 0`); the state at the best validation
    accuracy (the latest on ties, as the Checkpointer's best step) is kept on
    device and the test split is evaluated once, at the end, on it.
`config.checkpoint_on_eval=False` skips the checkpoint every evaluation would
write (short sweep runs); `checkpoint_every_steps` and SIGTERM still save.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from primal_jax.data.registry import get_input_pipeline
from primal_jax.launch import host_allocator
from primal_jax.models.builders import BuiltModel, build_model
from primal_jax.training.checkpoints import WORKDIR_SUBDIR, Checkpointer, PreemptionGuard
from primal_jax.training.metrics import MetricWriter, Progress, summary_table
from primal_jax.training.optimizers import make_optimizer
from primal_jax.training.sharding import (
  batch_sharding,
  global_batch,
  make_mesh,
  maybe_initialize_distributed,
  replicated,
)
from primal_jax.training.state import TrainState, abstract_state, init_state, make_init_fn
from primal_jax.training.steps import ksvd_spec, make_eval_step, make_train_step

TEST_EVALS: tuple[str, ...] = ("every_eval", "best_validation")


class TrainingError(RuntimeError):
  """A run cannot continue (diverged loss, bad batch); the message says where to resume from."""


def _evaluate(eval_step, state: TrainState, batches: Iterator, mesh) -> dict[str, float]:
  sums: dict[str, float] = {}
  for local in batches:
    out = jax.device_get(eval_step(state, global_batch(local, mesh)))
    for k, v in out.items():
      sums[k] = sums.get(k, 0.0) + float(v)
  count = max(sums.get("count", 0.0), 1.0)
  return {
    "accuracy": sums.get("correct_sum", 0.0) / count,
    "loss": sums.get("task_loss_sum", 0.0) / count,
    "ksvd_loss": sums.get("ksvd_loss_sum", 0.0) / count,
    "count": sums.get("count", 0.0),
  }


def _restore_or_init(config, ckpt: Checkpointer, init_fn, rng, abstract, shardings) -> tuple[TrainState, str]:
  latest = ckpt.latest_step()
  if latest is not None:
    state, _ = ckpt.restore(abstract, step=latest)
    return state, f"resumed from step {latest} of {ckpt.directory}"
  state = init_state(init_fn, rng, shardings)
  if config.get("init_from"):
    params = Checkpointer.restore_params(config.init_from, abstract.params)
    state = state.replace(params=params)
    return state, f"params initialised from {config.init_from}"
  return state, "initialised from scratch"


def evaluate(experiment: Experiment, state: TrainState, split: str = "test") -> dict[str, float]:
  """Accuracy, mean task loss and mean KSVD loss of `state` over every example of `split`.

  For analysis and notebooks: e.g. `evaluate(*load_state(config, workdir))`.
  """
  eval_step = jax.jit(
    make_eval_step(experiment.built, eta=experiment.config.ksvd.eta, spec=ksvd_spec(experiment.config.ksvd.spec)),
    in_shardings=(experiment.shardings, batch_sharding(experiment.mesh)),
    out_shardings=replicated(experiment.mesh),
  )
  return _evaluate(eval_step, state, experiment.pipeline.eval_batches(split), experiment.mesh)


def _best_row(history: list[dict], key: str) -> dict:
  """The evaluation with the highest `key`, the latest on ties (the Checkpointer's best-step rule)."""
  return max(enumerate(history), key=lambda ih: (ih[1][key], ih[0]))[1]


def _summary(history: list[dict], splits: list[str]) -> dict:
  """Final and best-over-evaluations accuracy per split (the release's protocol), and
  test accuracy at the best validation evaluation (the protocol without test selection).
  Ties go to the latest evaluation everywhere, as the Checkpointer's best step."""
  if not history:
    return {}
  summary = {"final": history[-1]}
  for split in splits:
    best = _best_row(history, f"{split}/accuracy")
    summary[f"best_{split}"] = {"step": best["step"], "accuracy": best[f"{split}/accuracy"]}
  if "validation" in splits and "test" in splits:
    best = _best_row(history, "validation/accuracy")
    summary["test_at_best_validation"] = {"step": best["step"], "accuracy": best["test/accuracy"]}
  return summary


def _eval_splits(config, splits: list[str]) -> tuple[str, list[str]]:
  """(test_eval, the splits every periodic evaluation covers), checked against the data."""
  test_eval = config.get("test_eval", "every_eval")
  if test_eval not in TEST_EVALS:
    raise ValueError(f"test_eval must be one of {', '.join(TEST_EVALS)}, got {test_eval!r}")
  if test_eval == "every_eval":
    return test_eval, splits
  if "validation" not in splits or "test" not in splits:
    raise ValueError(
      f"test_eval='best_validation' needs validation and test splits (data.val_fraction > 0), got {splits}"
    )
  if (config.get("best_metric") or None) != "validation/accuracy":
    raise ValueError(
      "test_eval='best_validation' selects on validation/accuracy; set best_metric='validation/accuracy' so a "
      f"resumed run finds that state among the checkpoints (got {config.get('best_metric')!r})"
    )
  return test_eval, ["validation"]


class _BestState:
  """A device copy of params and model_state at the best validation accuracy so far.

  A copy, not a reference: the train step donates the state's buffers. On device, not on the host, so it
  works for arrays spread over several processes. `params is None` while the best evaluation predates this
  process (a resumed run): the state then comes from the Checkpointer's best step.
  """

  def __init__(self, history: list[dict]):
    best = _best_row(history, "validation/accuracy") if history else None
    self.step = best["step"] if best else None
    self.accuracy = best["validation/accuracy"] if best else -math.inf
    self.params = self.model_state = None
    self._copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))

  def update(self, row: dict, state: TrainState) -> None:
    if row["validation/accuracy"] >= self.accuracy:
      self.step, self.accuracy = row["step"], row["validation/accuracy"]
      self.params, self.model_state = self._copy((state.params, state.model_state))

  def state(self, state: TrainState, ckpt: Checkpointer, abstract: TrainState) -> TrainState:
    """`state` carrying the best params and model_state."""
    if self.params is None:  # checked at the resume: the Checkpointer's best step is this one
      restored, _ = ckpt.restore(abstract, step=self.step)
      self.params, self.model_state = restored.params, restored.model_state
    return state.replace(params=self.params, model_state=self.model_state)


@dataclasses.dataclass(frozen=True)
class Experiment:
  """Everything derived from a config before any step runs (shared by training and analysis)."""

  config: Any
  mesh: Mesh
  pipeline: Any
  built: BuiltModel
  tx: optax.GradientTransformation
  schedule: Callable
  total_steps: int
  init_fn: Callable
  rng: jax.Array
  abstract: TrainState  # ShapeDtypeStructs with shardings
  shardings: Any

  @property
  def num_params(self) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(self.abstract.params))


def build_experiment(config) -> Experiment:
  """Mesh, input pipeline, model, optimizer and the sharded abstract state of `config`."""
  mesh = make_mesh(config.mesh_shape)
  if jax.process_count() > 1:  # process 0 prepares shared data files once; the others then only read them
    if jax.process_index() == 0:
      get_input_pipeline(config.data, process_index=0, process_count=jax.process_count())
    multihost_utils.sync_global_devices("primal_jax: input data prepared")
  pipeline = get_input_pipeline(config.data, process_index=jax.process_index(), process_count=jax.process_count())
  built = build_model(config.model, pipeline.info)
  total_steps = config.total_steps or config.num_epochs * pipeline.steps_per_epoch
  if total_steps <= 0:
    raise ValueError(f"total_steps must be > 0 (or num_epochs > 0), got {config.total_steps} / {config.num_epochs}")
  tx, schedule = make_optimizer(config.optimizer, total_steps)
  first = next(iter(pipeline.train_batches(0)))
  example = tuple(np.asarray(first[k][:1]) for k in built.input_keys)
  rng = jax.random.PRNGKey(config.seed)
  init_fn = make_init_fn(built.module, tx, example)
  abstract, shardings = abstract_state(init_fn, rng, mesh)
  return Experiment(config, mesh, pipeline, built, tx, schedule, total_steps, init_fn, rng, abstract, shardings)


def load_state(config, workdir: str | Path, step: int | None = None) -> tuple[Experiment, TrainState]:
  """The experiment of `config` and the state saved in `workdir` (latest step by default)."""
  experiment = build_experiment(config)
  with Checkpointer(Path(workdir) / WORKDIR_SUBDIR) as ckpt:
    state, _ = ckpt.restore(experiment.abstract, step=step)
  return experiment, state


def train_and_evaluate(config, workdir: str | Path, *, print_fn: Callable[[str], None] = print) -> dict:
  """Train `config` in `workdir` (resuming if it holds a checkpoint); returns the summary dict.

  The summary has "final" (metrics of the last evaluation), "best_<split>"
  (best accuracy over evaluations and its step), "test_at_best_validation"
  when a validation split exists, "steps", and "preempted" if a SIGTERM
  stopped the run (after saving; run again to continue).
  """
  maybe_initialize_distributed(config.get("distributed", "auto"))
  workdir = Path(workdir)
  primary = jax.process_index() == 0
  log = print_fn if primary else (lambda _: None)
  exp = build_experiment(config)
  mesh, pipeline, built, tx, schedule = exp.mesh, exp.pipeline, exp.built, exp.tx, exp.schedule
  total_steps, abstract, shardings = exp.total_steps, exp.abstract, exp.shardings
  test_eval, eval_splits = _eval_splits(config, [s for s in pipeline.info.split_sizes if s != "train"])
  checkpoint_on_eval = config.get("checkpoint_on_eval", True)
  steps_per_epoch = pipeline.steps_per_epoch
  spec = ksvd_spec(config.ksvd.spec)

  ckpt = Checkpointer(
    workdir / WORKDIR_SUBDIR,
    max_to_keep=config.max_to_keep,
    best_metric=config.get("best_metric") or None,
    best_mode="max",
  )
  writer = MetricWriter(workdir, is_primary=primary)
  writer.write_config(config.to_dict())
  state, origin = _restore_or_init(config, ckpt, exp.init_fn, exp.rng, abstract, shardings)
  start = int(jax.device_get(state.step))
  num_params = exp.num_params
  log(
    f"{config.model.name}/{config.model.family}: {num_params:,} params, {total_steps} steps "
    f"({steps_per_epoch}/epoch), mesh {dict(mesh.shape)}, {jax.process_count()} process(es); {origin}"
  )

  data_sharding = batch_sharding(mesh)
  train_step = jax.jit(
    make_train_step(built, tx, schedule, eta=config.ksvd.eta, spec=spec),
    in_shardings=(shardings, data_sharding),
    out_shardings=(shardings, replicated(mesh)),
    donate_argnums=0,
  )
  eval_step = jax.jit(
    make_eval_step(built, eta=config.ksvd.eta, spec=spec),
    in_shardings=(shardings, data_sharding),
    out_shardings=replicated(mesh),
  )

  history: list[dict] = []
  history_path = workdir / "eval_history.json"
  if start and history_path.exists():
    history = [h for h in json.loads(history_path.read_text()) if h["step"] <= start]
  best = _BestState(history) if test_eval == "best_validation" else None
  if best is not None and best.step is not None and ckpt.best_step() != best.step:
    raise TrainingError(  # fail now, not after training: the test split must see the best state
      f"resumed at step {start}, but the best validation evaluation (step {best.step}) was not checkpointed "
      f"(best checkpoint: {ckpt.best_step()}; checkpoint_on_eval=False?); rerun in an empty workdir"
    )

  def run_eval(step: int) -> dict:
    row = {"step": step}
    for split in eval_splits:
      metrics = _evaluate(eval_step, state, pipeline.eval_batches(split), mesh)
      writer.write(step, metrics, prefix=split)
      row.update({f"{split}/{k}": v for k, v in metrics.items() if k != "count"})
    history.append(row)
    if best is not None:
      best.update(row, state)
    if primary:
      history_path.write_text(json.dumps(history, indent=1))
    return row

  progress = Progress(
    total_steps, start_step=start, batch_size=config.data.batch_size, log_every_steps=config.log_every_steps,
    print_fn=log,
  )  # fmt: skip
  eval_every = config.get("eval_every_steps") or config.eval_every_epochs * steps_per_epoch
  step, preempted = start, False
  with PreemptionGuard() as guard:
    epoch, offset = divmod(start, steps_per_epoch)
    while step < total_steps and not preempted:
      for i, local in enumerate(pipeline.train_batches(epoch)):
        if i < offset:
          continue  # consumed before the restart
        state, scalars = train_step(state, global_batch(local, mesh))
        step += 1
        scalars = {k: float(v) for k, v in jax.device_get(scalars).items()}
        if not math.isfinite(scalars["loss"]):
          ckpt.wait_until_finished()
          raise TrainingError(
            f"non-finite loss ({scalars['loss']}) at step {step}; nothing was saved after it. Last good "
            f"checkpoint: step {ckpt.latest_step()} in {ckpt.directory} (lower the learning rate, enable "
            "optimizer.grad_clip_norm or check the data, then rerun to resume from it)"
          )
        if step % config.log_every_steps == 0 or step == total_steps:
          writer.write(step, scalars, prefix="train")
        progress.update(step, {k: scalars[k] for k in ("loss", "task_loss", "ksvd_loss", "accuracy")})
        metrics = None
        if step % eval_every == 0 or step == total_steps:
          row = run_eval(step)
          metrics = {k: v for k, v in row.items() if k != "step"}
          log(
            f"  eval at step {step} (epoch {step / steps_per_epoch:g}): "
            + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
          )
        on_eval = metrics is not None and checkpoint_on_eval
        if on_eval or step % config.checkpoint_every_steps == 0 or guard.requested:
          ckpt.save(step, state, metrics=metrics, force=True)
        if guard.requested:
          preempted = True
          log(f"termination requested: saved step {step} to {ckpt.directory}; rerun the same command to resume")
          break
        if step >= total_steps:
          break
      epoch, offset = epoch + 1, 0
  ckpt.wait_until_finished()
  summary = {**_summary(history, eval_splits), "steps": step, "preempted": preempted, "num_params": num_params}
  summary["host_allocator"] = host_allocator.loaded_allocator()  # CPU step times depend on it
  if best is not None and best.step is not None and not preempted:
    test = _evaluate(eval_step, best.state(state, ckpt, abstract), pipeline.eval_batches("test"), mesh)
    writer.write(best.step, test, prefix="test")
    summary["test_at_best_validation"] = {"step": best.step, "accuracy": test["accuracy"], "loss": test["loss"]}
    log(f"  test at the best validation evaluation (step {best.step}): accuracy {test['accuracy']:.4f}")
  ckpt.close()
  summary["test_eval"] = test_eval
  if primary:
    (workdir / "summary.json").write_text(json.dumps(summary, indent=1))
    rows = [
      {"metric": f"final {k}", "step": summary["final"]["step"], "value": f"{v:.4f}"}
      for k, v in summary.get("final", {}).items()
      if k.endswith("/accuracy")
    ]
    rows += [
      {"metric": k.replace("_", " "), "step": v["step"], "value": f"{v['accuracy']:.4f}"}
      for k, v in summary.items()
      if isinstance(v, dict) and "accuracy" in v
    ]
    if rows:
      log(summary_table(rows, ["metric", "step", "value"]))
  writer.close()
  return summary
