"""Data loading for the paper's experiments: numpy data sources, batched per host by grain.

Layout (dependencies point down this list; only `registry` knows the tasks)::

  registry        task name -> pipeline factory; `get_input_pipeline(data_config)`, `register_task`
  uea, listops, pathfinder, lra_image, lra_text, lra_retrieval, text_bytes
                  the tasks: each turns its data into sources and returns an `InputPipeline`
  token_tasks     `token_pipeline`, shared by the token-sequence (LRA) tasks
  core            `DatasetInfo`, `InputPipeline` and the collators
  pipeline        deterministic multi-host orders and grain batching
  lra_catalog, uea_tfds, uea_archive, ts_format, aeon_wheel, fashion_mnist, debian
                  obtaining and parsing data
  cache, checks   the cache directory, atomic writes, checksums; argument checks

`ts_format`, `uea_archive` and `aeon_wheel`, and ListOps and Pathfinder
generation, need neither grain nor TensorFlow; the names below are imported on
first use, so importing this package costs nothing.
"""

import importlib

_LAZY_EXPORTS = {
  "DatasetInfo": "core",
  "INPUT_PIPELINES": "registry",
  "InputPipeline": "core",
  "get_input_pipeline": "registry",
  "register_task": "registry",
  "registered_task": "registry",
  "unregister_task": "registry",
  "make_uea_pipeline": "uea",
  "UeaClassification": "uea_tfds",
  "prepare_uea": "uea_tfds",
}

__all__ = sorted(_LAZY_EXPORTS)


def __getattr__(name: str):
  if name in _LAZY_EXPORTS:
    return getattr(importlib.import_module(f"{__name__}.{_LAZY_EXPORTS[name]}"), name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
