"""The one registry from task name to input pipeline; the only module that imports the task modules.

A factory takes `(data_config, *, process_index=0, process_count=1)` and
returns the task's `InputPipeline` for that host. `get_input_pipeline` is what
a training binary calls, with `data_config.task` naming the task.

Why a registry module of its own: the task modules need the core types and
nothing else of each other, while something must know all of them. Keeping
that knowledge here, and only here, is what leaves the package without import
cycles. The built-in tasks are named as `"module:function"` strings
(`BUILTIN_TASKS`) and imported on first use, so importing this module (and the
training binary) imports no task: a UEA run never imports Pillow or MuJoCo.
Each task also names the extra that installs its third-party dependencies
(`tests/test_extras.py` checks them against setup.cfg); a task whose
dependency is missing is refused in one line naming the module and the extra.
Adding a task is its module plus one line in `BUILTIN_TASKS`.

Tests and experiments can add a task of their own without touching this file:

  register_task("toy_regression", make_toy_pipeline)
  try:
    ...  # get_input_pipeline(config) with config.task == "toy_regression"
  finally:
    unregister_task("toy_regression")

(or `with registered_task("toy_regression", make_toy_pipeline): ...`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from primal_jax.errors import ConfigError

if TYPE_CHECKING:
  from primal_jax.data.core import InputPipeline


class PipelineFactory(Protocol):
  def __call__(self, data_config: Any, *, process_index: int = 0, process_count: int = 1) -> InputPipeline: ...


@dataclasses.dataclass(frozen=True)
class BuiltinTask:
  """A built-in task: its factory as `"module:function"`, imported on first use, and the setup.cfg extras
  (besides the base requirements) that install the module's third-party imports."""

  target: str
  extras: tuple[str, ...] = ("train",)

  @property
  def module(self) -> str:
    return self.target.partition(":")[0]


BUILTIN_TASKS: dict[str, BuiltinTask] = {
  "uea": BuiltinTask("primal_jax.data.uea:make_uea_pipeline"),
  "listops": BuiltinTask("primal_jax.data.listops:make_listops_pipeline"),
  "lra_image": BuiltinTask("primal_jax.data.lra_image:make_lra_image_pipeline"),
  "lra_text": BuiltinTask("primal_jax.data.lra_text:make_lra_text_pipeline"),
  "lra_retrieval": BuiltinTask("primal_jax.data.lra_retrieval:make_lra_retrieval_pipeline"),
  "pathfinder": BuiltinTask("primal_jax.data.pathfinder:make_pathfinder_pipeline"),
  "text_bytes": BuiltinTask("primal_jax.data.text_bytes:make_text_bytes_pipeline"),
  "text_words": BuiltinTask("primal_jax.data.text_words:make_text_words_pipeline"),
  "d4rl": BuiltinTask("primal_jax.rl.segments:make_offline_rl_pipeline", ("train", "rl")),
  "images": BuiltinTask("primal_jax.data.images:make_image_pipeline"),
}


def _import_builtin(name: str) -> PipelineFactory:
  """The factory of built-in task `name`, importing its module now; a missing third-party module is a
  `ConfigError` naming it and the extra that installs it (a missing module of this package is a bug)."""
  task = BUILTIN_TASKS[name]
  module_name, _, attribute = task.target.partition(":")
  try:
    module = importlib.import_module(module_name)
  except ModuleNotFoundError as err:
    if err.name is None or err.name.partition(".")[0] == __name__.partition(".")[0]:
      raise
    extras = ",".join(task.extras)
    raise ConfigError(
      f"data.task={name!r} needs the {err.name!r} module, which is not installed: pip install 'primal-jax[{extras}]'"
    ) from err
  return getattr(module, attribute)


class _TaskTable(Mapping):
  """task name -> factory: a read-only view that imports a built-in task's module on first access."""

  def __init__(self, entries: dict[str, PipelineFactory | None]):
    self._entries = entries  # None: a built-in task not imported yet

  def __getitem__(self, name: str) -> PipelineFactory:
    factory = self._entries[name]
    if factory is None:
      factory = self._entries[name] = _import_builtin(name)
    return factory

  def __iter__(self) -> Iterator[str]:
    return iter(self._entries)

  def __len__(self) -> int:
    return len(self._entries)

  def __repr__(self) -> str:
    return f"INPUT_PIPELINES({', '.join(sorted(self._entries))})"


_FACTORIES: dict[str, PipelineFactory | None] = dict.fromkeys(BUILTIN_TASKS)
_REPLACED: dict[str, PipelineFactory | None] = {}  # a built-in task's entry while register_task replaces it
# A read-only live view: registering goes through register_task, which checks names.
INPUT_PIPELINES: Mapping[str, PipelineFactory] = _TaskTable(_FACTORIES)


def register_task(name: str, factory: PipelineFactory, *, replace: bool = False) -> None:
  """Makes `get_input_pipeline` build `factory(data_config, ...)` for `data_config.task == name`.

  Raises:
    ValueError: `name` is not a non-empty string, `factory` is not callable,
      or `name` is taken and `replace` is False.
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f"name must be a non-empty string, got {name!r}")
  if not callable(factory):
    raise ValueError(f"factory must be callable (data_config, *, process_index, process_count), got {factory!r}")
  if name in _FACTORIES and not replace:
    raise ValueError(f"task {name!r} is already registered; pass replace=True to replace it")
  if name in BUILTIN_TASKS and name not in _REPLACED:
    _REPLACED[name] = _FACTORIES[name]
  _FACTORIES[name] = factory


def unregister_task(name: str) -> None:
  """Removes a task added by `register_task`; a built-in task replaced by one gets its own factory back."""
  if name not in _FACTORIES:
    raise ValueError(f"name must be a registered task, got {name!r}; registered: {', '.join(sorted(_FACTORIES))}")
  if name in _REPLACED:
    _FACTORIES[name] = _REPLACED.pop(name)
  elif name not in BUILTIN_TASKS:  # a built-in task not replaced stays as it is
    del _FACTORIES[name]


@contextlib.contextmanager
def registered_task(name: str, factory: PipelineFactory, *, replace: bool = False) -> Iterator[None]:
  """`register_task` for the duration of a `with` block (then `unregister_task`)."""
  register_task(name, factory, replace=replace)
  try:
    yield
  finally:
    unregister_task(name)


def get_input_pipeline(data_config: Any, *, process_index: int = 0, process_count: int = 1) -> InputPipeline:
  """The InputPipeline of `data_config.task` (a key of INPUT_PIPELINES) for this host."""
  task = getattr(data_config, "task", None)
  if task not in _FACTORIES:
    raise ConfigError(f"data.task: unknown task {task!r}; registered tasks: {', '.join(sorted(_FACTORIES))}")
  return INPUT_PIPELINES[task](data_config, process_index=process_index, process_count=process_count)
