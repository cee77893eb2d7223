"""`Experiment`: everything a config determines before any step runs, shared by training and analysis.

`build_experiment(config)` gives the mesh, input pipeline, model, objective, optimizer and the sharded
abstract state; `load_state` adds a saved state and `evaluate` measures it, so notebooks and analysis
scripts use exactly what the train loop used.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from primal_jax.data.registry import get_input_pipeline
from primal_jax.models.builders import BuiltModel, build_model
from primal_jax.models.config import stack_name
from primal_jax.training.checkpoint_checksums import SET_ASIDE_SUFFIX
from primal_jax.training.checkpoints import WORKDIR_SUBDIR, Checkpointer, CheckpointError
from primal_jax.training.evaluation import evaluate_split
from primal_jax.training.objectives import Objective, get_objective
from primal_jax.training.optimizers import make_optimizer
from primal_jax.training.run_config import run_config, unflatten
from primal_jax.training.sharding import batch_sharding, make_mesh, replicated
from primal_jax.training.state import TrainState, abstract_state, init_state, make_init_fn
from primal_jax.training.steps import ksvd_spec, make_eval_step, make_train_step
from primal_jax.training.warm_start import (
  DEFAULT_MIN_LOADED,
  check_init_from,
  check_loaded,
  describe_checkpoint,
  restore_matching_params,
)
from primal_jax.training.workdir_lock import lock_workdir


@dataclasses.dataclass(frozen=True)
class Experiment:
  """Everything derived from a config before any step runs."""

  config: Any
  mesh: Mesh
  pipeline: Any
  built: BuiltModel
  objective: Objective
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

  def train_step(self):
    """The jitted train step: (state, global batch) -> (state, device scalars), the state donated."""
    step = make_train_step(
      self.built, self.tx, self.schedule, eta=self.config.ksvd.eta, spec=ksvd_spec(self.config.ksvd.spec),
      objective=self.objective,
    )  # fmt: skip
    data = batch_sharding(self.mesh)
    return jax.jit(
      step, in_shardings=(self.shardings, data), out_shardings=(self.shardings, replicated(self.mesh)), donate_argnums=0
    )

  def eval_step(self):
    """The jitted eval step: (state, global batch) -> summed terms, replicated."""
    step = make_eval_step(
      self.built, eta=self.config.ksvd.eta, spec=ksvd_spec(self.config.ksvd.spec), objective=self.objective
    )
    return jax.jit(step, in_shardings=(self.shardings, batch_sharding(self.mesh)), out_shardings=replicated(self.mesh))


def build_experiment(config) -> Experiment:
  """Mesh, input pipeline, model, objective, optimizer and the sharded abstract state of `config`.

  The objective is `config.task` when set, else the model's (`BuiltModel.task`).
  """
  mesh = make_mesh(config.mesh_shape)
  if jax.process_count() > 1:  # process 0 prepares shared data files once; the others then only read them
    if jax.process_index() == 0:
      get_input_pipeline(config.data, process_index=0, process_count=jax.process_count())
    multihost_utils.sync_global_devices("primal_jax: input data prepared")
  pipeline = get_input_pipeline(config.data, process_index=jax.process_index(), process_count=jax.process_count())
  built = build_model(config.model, pipeline.info)
  objective = get_objective(config.get("task") or built.task)
  total_steps = config.total_steps or config.num_epochs * pipeline.steps_per_epoch
  if total_steps <= 0:
    raise ValueError(f"total_steps must be > 0 (or num_epochs > 0), got {config.total_steps} / {config.num_epochs}")
  tx, schedule = make_optimizer(config.optimizer, total_steps)
  first = next(iter(pipeline.train_batches(0)))
  example = tuple(np.asarray(first[k][:1]) for k in built.input_keys)
  rng = jax.random.PRNGKey(config.seed)
  init_fn = make_init_fn(built.module, tx, example)
  abstract, shardings = abstract_state(init_fn, rng, mesh)
  return Experiment(
    config, mesh, pipeline, built, objective, tx, schedule, total_steps, init_fn, rng, abstract, shardings
  )


def restore_or_init(experiment: Experiment, ckpt: Checkpointer) -> tuple[TrainState, str]:
  """The run's state and where it came from, in the resume order of `loop`'s docstring.

  `config.resume_step` N >= 0 resumes from step N instead of the latest: once N is restored (its checksums
  verified), the steps after it are moved to `<checkpoints>.set_aside/` (kept, never deleted). A damaged
  latest step is a CheckpointError naming the step and the file and offering the latest step that verifies.

  `config.init_from_mode="matching"` fine-tunes from pretrained params of another model (`INIT_FROM_MODES`); a
  module's `adapt_pretrained` (e.g. `VisionTransformer`'s position-embedding resize) adapts leaves of another shape,
  its `keep_init_on_finetune(path)` names leaves to keep initialised (the release's fresh Primal query and key).
  """
  config = experiment.config
  latest, wanted = ckpt.latest_step(), config.get("resume_step", -1)
  if wanted >= 0:
    if wanted not in ckpt.all_steps():
      raise CheckpointError(f"resume_step={wanted}: no such checkpoint in {ckpt.directory}; steps: {ckpt.all_steps()}")
    state, _ = _restore(experiment, ckpt, wanted)
    moved = ckpt.set_aside_after(wanted)
    aside = f"; steps {[int(p.name.split('-')[0]) for p in moved]} set aside in {moved[0].parent}" if moved else ""
    return state, f"resumed from step {wanted} of {ckpt.directory}{aside}"
  if latest is not None:
    state, _ = _restore(experiment, ckpt, latest)
    return state, f"resumed from step {latest} of {ckpt.directory}"
  check_init_from(config)
  state = init_state(experiment.init_fn, experiment.rng, experiment.shardings)
  if config.get("init_from"):
    if config.get("init_from_mode", "exact") == "exact":
      params = Checkpointer.restore_params(config.init_from, experiment.abstract.params)
      return state.replace(params=params), f"params initialised from {config.init_from}"
    module = experiment.built.module
    adapt, keep = getattr(module, "adapt_pretrained", None), getattr(module, "keep_init_on_finetune", None)
    params, report = restore_matching_params(config.init_from, state.params, adapt=adapt, keep_init=keep)
    target = f"{config.model.name} {stack_name(config.model.layers)}, dim {config.model.get('dim', '?')}"
    check_loaded(
      report,
      state.params,
      min_loaded=config.get("init_from_min_loaded", DEFAULT_MIN_LOADED),
      source=describe_checkpoint(config.init_from),
      target=target,
    )
    counts = ", ".join(f"{len(paths)} {what}" for what, paths in report.items() if paths)
    return state.replace(params=params), f"params initialised from {config.init_from} where they match ({counts})"
  return state, "initialised from scratch"


def _restore(experiment: Experiment, ckpt: Checkpointer, step: int):
  """`ckpt.restore`, a damaged step's error extended with how to continue from the latest step that verifies."""
  try:
    return ckpt.restore(experiment.abstract, step=step)
  except CheckpointError as err:
    if err.step is None:  # not damage (a different model, no such step): nothing to fall back to
      raise
    previous = err.previous_good if err.previous_good is not None else ckpt.last_verified_step(before=err.step)
    hint = (
      f" To continue the run from step {previous}, rerun with --config.resume_step={previous} (resume_step="
      f"{previous} in the config): the steps after it are moved to {ckpt.directory}{SET_ASIDE_SUFFIX}/, not deleted."
      if previous is not None
      else " No earlier step verifies: start the run again in a new workdir."
    )
    raise CheckpointError(f"{err}{hint}", step=err.step, previous_good=previous) from err


def write_initial_run(config, workdir: str | Path) -> str:
  """A run workdir (`config.json` and a step-0 checkpoint) holding `config`'s initial state, without training.

  With `config.init_from` (a converted pretrained checkpoint, `python -m primal_jax.convert timm`) the state is
  those weights, so tools that read runs (`experiments.spectrum`, `evaluate(*load_state(...))`) analyse
  pretrained models as they analyse trained ones. Returns where the params came from.
  """
  from primal_jax.training.metrics import MetricWriter

  workdir = Path(workdir)
  experiment = build_experiment(config)
  with (
    lock_workdir(workdir, primary=jax.process_index() == 0),
    Checkpointer(workdir / WORKDIR_SUBDIR, max_to_keep=None, async_save=False) as ckpt,
  ):
    if ckpt.latest_step() is not None:
      raise ValueError(f"workdir {workdir} already holds a run (step {ckpt.latest_step()}); choose a new directory")
    state, origin = restore_or_init(experiment, ckpt)
    ckpt.save(0, state, force=True)
    MetricWriter(workdir, is_primary=jax.process_index() == 0, tensorboard=False).write_config(config.to_dict())
  return origin


def load_run_config(workdir: str | Path, data_dir: str | None = None):
  """The ConfigDict a run last trained with: `<workdir>/config.json` with the changes accepted on resume
  (`run_config`) applied, `data.data_dir` replaced when given."""
  import ml_collections

  flat = run_config(workdir)
  if flat is None:
    path = Path(workdir) / "config.json"
    raise FileNotFoundError(f"{path} does not exist: --workdir must be a directory written by experiments.main")
  config = ml_collections.ConfigDict(unflatten(flat))
  if data_dir is not None:
    config.data.data_dir = data_dir
  return config


def load_state(config, workdir: str | Path, step: int | None = None) -> tuple[Experiment, TrainState]:
  """The experiment of `config` and the state saved in `workdir` (latest step by default)."""
  experiment = build_experiment(config)
  with Checkpointer(Path(workdir) / WORKDIR_SUBDIR) as ckpt:
    state, _ = ckpt.restore(experiment.abstract, step=step)
  return experiment, state


def evaluate(experiment: Experiment, state: TrainState, split: str = "test") -> dict[str, float]:
  """The task's metrics, mean task loss, mean KSVD loss and count of `state` over every example of `split`
  (an offline-RL run: its rollout metrics on the split's environment seeds).

  For analysis and notebooks: e.g. `evaluate(*load_state(config, workdir))`.
  """
  return evaluate_split(experiment, state, split)
