"""`train_and_evaluate`: the one train loop behind every experiment binary, whatever the task.

Resume order (first that applies):
  1. the latest checkpoint in `<workdir>/checkpoints` (same run, continued: step, optimizer state,
     RNG and data position are all restored, so a killed-and-resumed run ends bit-identical to an
     uninterrupted one; the consumed batches of the current epoch are skipped without being read);
  2. `config.init_from`, a workdir or checkpoint directory of another run: its params only, with a
     fresh optimizer at step 0;
  3. a fresh initialisation from `config.seed`.

The host runs ahead of the device: a step's scalars are fetched only after the next step is
dispatched, or at a sync point (a log, evaluation or checkpoint step, a preemption, the first and
the last step), where every pending step is fetched. A non-finite loss is therefore found at most
one step late; the error still names the step it happened at. Every step up to a checkpoint is
checked before that checkpoint is written, so a state after a non-finite step is never saved.

Test protocols and "best": `evaluation`. `config.checkpoint_on_eval=False` skips the checkpoint every
evaluation would write (short sweep runs); `checkpoint_every_steps` and SIGTERM still save.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import jax

from primal_jax.atomic_files import write_json_atomically
from primal_jax.launch import host_allocator
from primal_jax.models.config import stack_name
from primal_jax.provenance import checkout, provenance
from primal_jax.training.checkpointing import WORKDIR_SUBDIR, Checkpointer, check_init_from, has_checkpoints
from primal_jax.training.evaluation import TEST_EVALS, Evaluations, eval_protocol, summary_rows
from primal_jax.training.experiment import Experiment, build_experiment, evaluate, load_state, restore_or_init
from primal_jax.training.guards import PreemptionGuard, check_fallback, check_resume, lock_workdir, record_changes
from primal_jax.training.metrics import (
  CONFIG_FILE,
  MetricWriter,
  Progress,
  ksvd_ratio,
  read_metrics,
  summary_table,
  validation_curve,
)
from primal_jax.training.objectives import metric_mode
from primal_jax.training.sharding import global_batch, maybe_initialize_distributed
from primal_jax.training.state import TrainState
from primal_jax.training.steps import train_scalars

# The experiment helpers are re-exported: `from primal_jax.training.loop import load_state, evaluate` in analysis.
__all__ = [
  "TEST_EVALS",
  "Experiment",
  "TrainingError",
  "build_experiment",
  "evaluate",
  "load_state",
  "train_and_evaluate",
]


SUMMARY_FILE = "summary.json"


class TrainingError(RuntimeError):
  """A run cannot continue (diverged loss, bad batch); the message says where to resume from."""


class _PendingScalars:
  """Device scalars of dispatched steps, fetched late so that the host never waits for the step it just sent."""

  def __init__(self, objective, ckpt: Checkpointer):
    self._objective, self._ckpt = objective, ckpt
    self._pending: list[tuple[int, dict]] = []

  def push(self, step: int, scalars: dict) -> None:
    self._pending.append((step, scalars))

  def check(self, *, all_steps: bool) -> dict[str, float]:
    """Fetches and checks every pending step but the newest (all of them with `all_steps`).

    Returns the host scalars of the newest fetched step; raises TrainingError at the first non-finite loss.
    """
    keep = 0 if all_steps else 1
    fetch, self._pending = self._pending[: len(self._pending) - keep], self._pending[len(self._pending) - keep :]
    values = {}
    for step, scalars in fetch:
      values = train_scalars(self._objective, jax.device_get(scalars))
      if not math.isfinite(values["loss"]):
        self._ckpt.wait_until_finished()
        good, latest = self._ckpt.last_verified_step(), self._ckpt.latest_step()
        damaged = f" (the later step {latest} fails its checksums)" if latest not in (good, None) else ""
        raise TrainingError(
          f"non-finite loss ({values['loss']}) at step {step}; nothing was saved after it. Last good checkpoint "
          f"(its checksums verified): step {good} in {self._ckpt.directory}{damaged} (lower the learning rate, "
          f"enable optimizer.grad_clip_norm or check the data, then rerun with --config.resume_step={good} to "
          "resume from it)"
        )
    return values


def _train_batches(pipeline, start: int, total_steps: int) -> Iterator[tuple[int, dict]]:
  """(step reached once the batch is applied, local batch), from step `start` to `total_steps`."""
  epoch, offset = divmod(start, pipeline.steps_per_epoch)
  step = start
  while step < total_steps:
    for local in pipeline.train_batches(epoch, start=offset):  # a resumed run skips what it consumed, unread
      step += 1
      yield step, local
      if step >= total_steps:
        return
    epoch, offset = epoch + 1, 0


def _train(
  exp: Experiment, state: TrainState, start: int, ckpt: Checkpointer, evals: Evaluations, writer: MetricWriter,
  log: Callable[[str], None],
) -> tuple[TrainState, int, bool]:  # fmt: skip
  """Trains from step `start`; returns (state, steps reached, whether a SIGTERM stopped the run)."""
  config, total = exp.config, exp.total_steps
  eval_every = config.get("eval_every_steps") or config.eval_every_epochs * exp.pipeline.steps_per_epoch
  shown = ("loss", "task_loss", "ksvd_loss", *exp.objective.metric_names)
  progress = Progress(
    total, start_step=start, batch_size=config.data.batch_size, log_every_steps=config.log_every_steps, print_fn=log
  )
  train_step, pending = exp.train_step(), _PendingScalars(exp.objective, ckpt)
  step = start
  with PreemptionGuard() as guard:
    for step, local in _train_batches(exp.pipeline, start, total):
      state, scalars = train_step(state, global_batch(local, exp.mesh))
      pending.push(step, scalars)
      log_due = step % config.log_every_steps == 0 or step in (1, total)  # step 1: the KSVD ratio's start
      eval_due = step % eval_every == 0 or step == total
      periodic = step % config.checkpoint_every_steps == 0
      if not (log_due or eval_due or periodic or guard.requested or step == start + 1):
        pending.check(all_steps=False)  # the previous step, while this one runs
        continue
      values = pending.check(all_steps=True)  # before anything is evaluated or saved
      if log_due:
        writer.write(step, values, prefix="train")
      progress.update(step, {k: values[k] for k in shown})
      metrics = evals.run(step, state) if eval_due else None
      on_eval = metrics is not None and config.get("checkpoint_on_eval", True)
      if on_eval or periodic or guard.requested:  # requested may have turned true since the check above
        ckpt.save(step, state, metrics=metrics, force=True)
      if guard.requested:
        log(f"termination requested: saved step {step} to {ckpt.directory}; rerun the same command to resume")
        return state, step, True
  return state, step, False


def train_and_evaluate(config, workdir: str | Path, *, print_fn: Callable[[str], None] = print) -> dict:
  """Train `config` in `workdir` (resuming if it holds a checkpoint); returns the summary dict.

  The summary has "final" (metrics of the last evaluation), "best_<split>" (the best value of the
  task's selection metric over evaluations and its step), "test_at_best_validation" when a validation
  split exists, "steps", "num_params", "test_eval", and "preempted" if a SIGTERM stopped the run
  (after saving; run again to continue).

  The workdir is locked for the whole run (`workdir_lock`: a second writer is refused at once), and a
  run already in it is continued only with a config that keeps its continuity (`run_config`), checked
  before anything is written; `config.json` keeps the config the run started with.
  """
  maybe_initialize_distributed(config.get("distributed", "auto"))
  workdir, primary = Path(workdir), jax.process_index() == 0
  with lock_workdir(workdir, primary=primary):
    return _train_and_evaluate(config, workdir, primary, print_fn if primary else (lambda _: None))


def _train_and_evaluate(config, workdir: Path, primary: bool, log: Callable[[str], None]) -> dict:
  checkout()  # the commit the record will name: the code this process loaded, read before the run's minutes
  resume = check_resume(config, workdir)  # reads only: a refused config leaves the run's records as they were
  check_init_from(config, starting=not has_checkpoints(workdir))  # before the data and the model are built
  exp = build_experiment(config)
  protocol = eval_protocol(config, exp.pipeline.info.split_sizes, exp.objective)
  best_metric = config.get("best_metric") or None
  # allow_corrupt: a damaged latest step is reported by the restore, with the step to fall back to.
  ckpt = Checkpointer(
    workdir / WORKDIR_SUBDIR, max_to_keep=config.max_to_keep, best_metric=best_metric,
    best_mode=metric_mode(best_metric) if best_metric else "max", allow_corrupt=True,
  )  # fmt: skip
  check_fallback(workdir, config.get("resume_step", -1), ckpt.latest_step())
  steps = set(ckpt.all_steps())
  state, origin = restore_or_init(exp, ckpt)  # before any run file is opened: a failed restore writes nothing
  start = int(jax.device_get(state.step))
  writer = MetricWriter(workdir, is_primary=primary)
  if primary and not (workdir / CONFIG_FILE).exists():
    writer.write_config(config.to_dict())
  if primary:
    record_changes(workdir, start, resume, set_aside=steps - set(ckpt.all_steps()))
  if hint := host_allocator.speed_hint(jax.devices()[0].platform):  # after jax.distributed's initialisation
    log(f"note: {hint}")
  log(
    f"{config.model.name}/{stack_name(config.model.layers)}: {exp.num_params:,} params, {exp.total_steps} steps "
    f"({exp.pipeline.steps_per_epoch}/epoch), mesh {dict(exp.mesh.shape)}, {jax.process_count()} process(es); {origin}"
  )
  evals = Evaluations(exp, protocol, workdir, writer, start=start, log=log)
  if (missing := evals.missing_best_checkpoint(ckpt)) is not None:  # fail now: the test split needs that state
    raise TrainingError(
      f"resumed at step {start}, but the best validation evaluation (step {missing}) was not checkpointed "
      f"(best checkpoint: {ckpt.best_step()}; checkpoint_on_eval=False?); rerun in an empty workdir"
    )

  state, step, preempted = _train(exp, state, start, ckpt, evals, writer, log)
  ckpt.wait_until_finished()
  summary = {**evals.summary(), "steps": step, "preempted": preempted, "num_params": exp.num_params}
  summary["host_allocator"] = host_allocator.loaded_allocator()  # CPU step times depend on it
  origin = provenance()  # commit, argv, date, versions; devices: tables of runs made on several machines
  summary["devices"] = origin["devices"]
  summary["jax_version"] = jax.__version__
  summary["provenance"] = origin
  summary["ksvd_ratio"] = ksvd_ratio(read_metrics(workdir, dedupe=True, prefix="train"), float(config.ksvd.eta))
  if best_metric and best_metric.startswith("validation/"):  # the curve shows whether the run converged
    curve = validation_curve(read_metrics(workdir, dedupe=True, prefix="validation"), best_metric.split("/", 1)[1])
    summary["validation_curve"] = curve
  if not preempted and (test := evals.test_at_best_validation(state, ckpt)) is not None:
    summary["test_at_best_validation"] = test
  ckpt.close()
  summary["test_eval"] = protocol.test_eval
  if primary:
    write_json_atomically(workdir / SUMMARY_FILE, summary, indent=1)
    if rows := summary_rows(summary, protocol.metric):
      log(summary_table(rows, ["metric", "step", "value"]))
  writer.close()
  return summary
