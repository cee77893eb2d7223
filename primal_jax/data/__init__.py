"""Data loading for the paper's experiments, kept free of JAX so it runs anywhere numpy does.

`ts_format` parses the sktime/UEA `.ts` files of the UEA multivariate time-series
classification archive (the paper's Table 1); `aeon_wheel` obtains the few of
those files that ship inside the `aeon` wheel on PyPI (JapaneseVowels,
BasicMotions), so the default experiment needs no download beyond the package
registry.

`uea_tfds` prepares a UEA problem as TFDS ArrayRecord files (read with numpy,
no TensorFlow); `pipeline` batches any random-access source deterministically
across hosts with grain; `tasks` is the registry from task name to
`InputPipeline` (`get_input_pipeline(data_config)`).

The names below are imported on first use, so `ts_format` and `aeon_wheel`
work without the `data` extra (tensorflow-datasets, grain).
"""

import importlib

_LAZY_EXPORTS = {
  "DatasetInfo": "tasks",
  "INPUT_PIPELINES": "tasks",
  "InputPipeline": "tasks",
  "get_input_pipeline": "tasks",
  "make_uea_pipeline": "tasks",
  "UeaClassification": "uea_tfds",
  "prepare_uea": "uea_tfds",
}

__all__ = sorted(_LAZY_EXPORTS)


def __getattr__(name: str):
  if name in _LAZY_EXPORTS:
    return getattr(importlib.import_module(f"{__name__}.{_LAZY_EXPORTS[name]}"), name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
