"""Datasets of the TFDS catalog, read as ArrayRecord files without TensorFlow (`catalog_splits`).

TFDS catalog datasets are read with `builder.as_data_source(split)` from
ArrayRecord files, the one TFDS format readable with numpy alone, which is what
`tfds.data_source(name, builder_kwargs={"file_format": "array_record"})` does;
`tfds.load`/`as_dataset` would need TensorFlow and are never used.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from primal_jax.data.cache import DatasetFetchError, default_data_dir
from primal_jax.data.pipeline import Example
from primal_jax.errors import MissingFileError

ARRAY_RECORD = "array_record"
# cifar10's label order in the catalog (its batches.meta.txt); the LRA Image task and the vision family read it.
CIFAR10_CLASSES: tuple[str, ...] = (
  "airplane",
  "automobile",
  "bird",
  "cat",
  "deer",
  "dog",
  "frog",
  "horse",
  "ship",
  "truck",
)


def _prepare_instructions(name: str, data_dir: Path) -> str:
  return (
    f"Prepare it once where TensorFlow and the network are available, e.g. `pip install tensorflow-cpu "
    f"importlib_resources && tfds build {name} --file_format={ARRAY_RECORD} --data_dir={data_dir}` (or copy a "
    f"prepared `{name}/` folder there); reading it back needs neither. Fashion-MNIST (dataset='fashion_mnist') "
    "needs no network beyond the Debian package registry."
  )


def catalog_splits(
  name: str, splits: Sequence[str], data_dir: str | Path | None = None, *, download: bool = True
) -> dict[str, Sequence[Example]]:
  """{split: random-access data source} of a TFDS catalog dataset, prepared as ArrayRecord under `data_dir`.

  Equivalent to `tfds.data_source(name, split=split, data_dir=data_dir,
  download=download, builder_kwargs={"file_format": "array_record"})`, which
  is spelled out so a missing dataset gets a message saying how to obtain it.
  The file format is passed explicitly because `tfds.data_source` defaults to
  ArrayRecord only when neither data_dir nor builder_kwargs are given.

  Raises:
    FileNotFoundError: not prepared under data_dir and download=False.
    DatasetFetchError: preparing failed, e.g. for want of TensorFlow (the
      catalog's CIFAR-10 reader and PNG encoder use it) or of the network.
  """
  import tensorflow_datasets as tfds  # imported only by the catalog datasets

  data_dir = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
  builder = tfds.builder(name, data_dir=str(data_dir), file_format=ARRAY_RECORD)
  if not builder.is_prepared():
    if not download:
      raise MissingFileError(
        f"TFDS dataset {name!r} is not prepared under {data_dir} and download=False. Set download=True to "
        f"download and prepare it there. {_prepare_instructions(name, data_dir)}"
      )
    try:
      builder.download_and_prepare()
    except Exception as e:  # re-raised with what to do; the cause stays chained
      raise DatasetFetchError(
        f"could not download and prepare TFDS dataset {name!r} into {data_dir}: {type(e).__name__}: {e}. "
        f"{_prepare_instructions(name, data_dir)}"
      ) from e
  return {split: builder.as_data_source(split) for split in splits}
