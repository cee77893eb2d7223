"""The plumbing every family's input pipeline shares: numpy data sources, batched per host by grain.

Layout (dependencies point down this list; no module here knows a family, `primal_jax.tasks` does)::

  registry        the task registry: task name -> pipeline factory; `get_input_pipeline(data_config)`,
                  `register_task` (the built-in tasks are registered by `primal_jax.tasks`)
  core            `DatasetInfo`, `InputPipeline` and the collators
  pipeline        deterministic multi-host orders and grain batching
  splits          validation splits held out of train (LRA's tail, a stratified share by seed)
  sources/        one module per place data comes from: `debian` (Debian packages), `pypi_wheel` (wheels on
                  PyPI), `fashion_mnist`, `gensim_enwiki`, `tfds_catalog`
  cache, checks   the cache directory, atomic writes, checksums; argument checks

The names below are imported on first use, so importing this package costs nothing.
"""

import importlib

_LAZY_EXPORTS = {
  "DatasetInfo": "core",
  "TASKS": "registry",
  "InputPipeline": "core",
  "get_input_pipeline": "registry",
  "get_task": "registry",
  "register_task": "registry",
  "registered_task": "registry",
  "unregister_task": "registry",
}

__all__ = sorted(_LAZY_EXPORTS)


def __getattr__(name: str):
  if name in _LAZY_EXPORTS:
    return getattr(importlib.import_module(f"{__name__}.{_LAZY_EXPORTS[name]}"), name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
