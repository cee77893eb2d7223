"""The one registry from task name to input pipeline; the only module that imports the task modules.

A factory takes `(data_config, *, process_index=0, process_count=1)` and
returns the task's `InputPipeline` for that host. `get_input_pipeline` is what
a training binary calls, with `data_config.task` naming the task.

Why a registry module of its own: the task modules need the core types and
nothing else of each other, while something must know all of them. Keeping
that knowledge here, and only here, is what leaves the package without import
cycles. Adding a task is its module plus one line in `_BUILTIN`.

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
import types
from collections.abc import Iterator
from typing import Any, Protocol

from primal_jax.data import images, lra_image, lra_retrieval, lra_text, text_bytes, text_words, uea
from primal_jax.data.core import InputPipeline
from primal_jax.data.listops import make_listops_pipeline
from primal_jax.data.pathfinder import make_pathfinder_pipeline
from primal_jax.errors import ConfigError
from primal_jax.rl.segments import make_offline_rl_pipeline


class PipelineFactory(Protocol):
  def __call__(self, data_config: Any, *, process_index: int = 0, process_count: int = 1) -> InputPipeline: ...


_BUILTIN: dict[str, PipelineFactory] = {
  "uea": uea.make_uea_pipeline,
  "listops": make_listops_pipeline,
  "lra_image": lra_image.make_lra_image_pipeline,
  "lra_text": lra_text.make_lra_text_pipeline,
  "lra_retrieval": lra_retrieval.make_lra_retrieval_pipeline,
  "pathfinder": make_pathfinder_pipeline,
  "text_bytes": text_bytes.make_text_bytes_pipeline,
  "text_words": text_words.make_text_words_pipeline,
  "d4rl": make_offline_rl_pipeline,
  "images": images.make_image_pipeline,
}
_FACTORIES: dict[str, PipelineFactory] = dict(_BUILTIN)
# A read-only live view: registering goes through register_task, which checks names.
INPUT_PIPELINES = types.MappingProxyType(_FACTORIES)


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
  _FACTORIES[name] = factory


def unregister_task(name: str) -> None:
  """Removes a task added by `register_task`; a built-in task replaced by one gets its own factory back."""
  if name not in _FACTORIES:
    raise ValueError(f"name must be a registered task, got {name!r}; registered: {', '.join(sorted(_FACTORIES))}")
  if name in _BUILTIN:
    _FACTORIES[name] = _BUILTIN[name]
  else:
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
  return _FACTORIES[task](data_config, process_index=process_index, process_count=process_count)
