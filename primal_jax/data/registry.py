"""The task registry: task name -> input pipeline factory (`get_input_pipeline(data_config)`).

A factory takes `(data_config, *, process_index=0, process_count=1)` and returns the task's `InputPipeline`
for that host; `data_config.task` names the task. The registry is a `primal_jax.registry.Registry` with the
same verbs as every other kind (`register_task`, `get_task`, `unregister_task`, `registered_task`, and the
read-only mapping `TASKS`).

This module knows no task: the built-in ones are registered by `primal_jax.tasks` (the one list of
families) as lazy `"module:function"` entries naming the setup.cfg extras that install their imports, so
importing the training binary imports no task (a UEA run never imports Pillow or MuJoCo) and a task whose
dependency is missing is refused in one line naming the module and the extra.

Tests and experiments can add a task of their own without touching a file:

  with registered_task("toy_regression", make_toy_pipeline):
    ...  # get_input_pipeline(config) with config.task == "toy_regression"
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from primal_jax.errors import ConfigError
from primal_jax.registry import Lazy, Registry

if TYPE_CHECKING:
  from primal_jax.data.core import InputPipeline


class PipelineFactory(Protocol):
  def __call__(self, data_config: Any, *, process_index: int = 0, process_count: int = 1) -> InputPipeline: ...


def _check_factory(factory: Any) -> None:
  if not callable(factory):
    raise ValueError(f"a task must be callable (data_config, *, process_index, process_count), got {factory!r}")


# task name -> pipeline factory: a read-only Mapping; extend it with `register_task`.
TASKS: Registry[PipelineFactory] = Registry("task", "data.task", _check_factory)


def register_task(name: str, factory: PipelineFactory | Lazy, *, replace: bool = False, builtin: bool = False) -> None:
  """Makes `get_input_pipeline` build `factory(data_config, ...)` for `data_config.task == name`.

  `builtin` is for `primal_jax.tasks` alone: a built-in entry survives `unregister_task` (a replaced one
  gets its own factory back).
  """
  TASKS.register(name, factory, replace=replace, builtin=builtin)


def unregister_task(name: str) -> None:
  """Removes a task added by `register_task`; a built-in task replaced by one gets its own factory back."""
  TASKS.unregister(name)


def registered_task(name: str, factory: PipelineFactory, *, replace: bool = False):
  """`register_task` for the duration of a `with` block (then `unregister_task`)."""
  return TASKS.registered(name, factory, replace=replace)


def get_task(name: str) -> PipelineFactory:
  """The factory registered as `name` (imported now if it is a built-in not used yet)."""
  return TASKS.get(name)


def get_input_pipeline(data_config: Any, *, process_index: int = 0, process_count: int = 1) -> InputPipeline:
  """The InputPipeline of `data_config.task` (a name in TASKS) for this host."""
  task = getattr(data_config, "task", None)
  if task not in TASKS:
    raise ConfigError(f"data.task: unknown task {task!r}; registered tasks: {', '.join(TASKS)}")
  return TASKS.get(task)(data_config, process_index=process_index, process_count=process_count)
