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
from primal_jax.models.config import stack_name
from primal_jax.models.registry import BuiltModel, build_model
from primal_jax.training.checkpointing import WORKDIR_SUBDIR, Checkpointer, resume_state, warm_start_state
from primal_jax.training.evaluation import evaluate_split
from primal_jax.training.guards import lock_workdir
from primal_jax.training.guards.run_config import run_config, unflatten
from primal_jax.training.objectives import Objective, get_objective
from primal_jax.training.optimizers import make_optimizer
from primal_jax.training.sharding import batch_sharding, make_mesh, replicated
from primal_jax.training.state import TrainState, abstract_state, init_state, make_init_fn
from primal_jax.training.steps import ksvd_spec, make_eval_step, make_train_step


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
  objective = get_objective(config.get("task") or built.task).configured(config, pipeline.info.split_sizes)
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

  `config.init_from_mode="matching"` fine-tunes from pretrained params of another model (`INIT_FROM_MODES`); the
  model's `BuiltModel.adapt_pretrained` (e.g. `VisionTransformer`'s position-embedding resize) adapts leaves of
  another shape, its `keep_init_on_finetune(path)` names leaves to keep initialised (the release's fresh Primal
  query and key).
  """
  config, built = experiment.config, experiment.built
  resumed = resume_state(ckpt, experiment.abstract, config.get("resume_step", -1))
  if resumed is not None:
    return resumed
  state = init_state(experiment.init_fn, experiment.rng, experiment.shardings)
  return warm_start_state(
    config,
    state,
    experiment.abstract.params,
    adapt=built.adapt_pretrained,
    keep_init=built.keep_init_on_finetune,
    target=f"{config.model.name} {stack_name(config.model.layers)}, dim {config.model.get('dim', '?')}",
  )


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


def load_state(
  config, workdir: str | Path, step: int | None = None, *, allow_corrupt: bool = False
) -> tuple[Experiment, TrainState]:
  """The experiment of `config` and the state saved in `workdir` (latest step by default). `allow_corrupt`: open
  the checkpoints even when the latest step is damaged (to read an earlier `step`; see `Checkpointer`)."""
  experiment = build_experiment(config)
  with Checkpointer(Path(workdir) / WORKDIR_SUBDIR, allow_corrupt=allow_corrupt) as ckpt:
    state, _ = ckpt.restore(experiment.abstract, step=step)
  return experiment, state


def evaluate(experiment: Experiment, state: TrainState, split: str = "test") -> dict[str, float]:
  """The task's metrics, mean task loss, mean KSVD loss and count of `state` over every example of `split`
  (an offline-RL run: its rollout metrics on the split's environment seeds).

  For analysis and notebooks: e.g. `evaluate(*load_state(config, workdir))`.
  """
  return evaluate_split(experiment, state, split)
