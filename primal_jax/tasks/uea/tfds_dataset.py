"""The UEA classification problems as a TFDS dataset in ArrayRecord files, readable without TensorFlow.

Why TFDS on top of the `.ts` parser: preparing once gives every later run (and
every host of a multi-host run) random access to individual cases through
`builder.as_data_source(split)`, with the class names, split sizes and a
checksum of the source files recorded next to the data. The ArrayRecord format
is the one TFDS can write and read with numpy alone (TensorFlow is not
installed); `tfds.load`/`as_dataset` would need TensorFlow and are never used.

One `BuilderConfig` per problem, named as in the archive (`JapaneseVowels`,
`PEMS-SF`, ...); `uea_config(name)` makes one for any other problem name.
Records are written in file order (`disable_shuffling`), and each carries its
position in the file as `index`, so consumers can check that no case is lost or
duplicated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from primal_jax.data.cache import default_data_dir, sha256_file
from primal_jax.errors import ConfigError, MissingFileError
from primal_jax.tasks.uea.aeon_wheel import AEON_DATASETS, AEON_VERSION, fetch_aeon_dataset
from primal_jax.tasks.uea.archive import SPLITS, load_uea, uea_split_paths
from primal_jax.tasks.uea.ts_format import Missing, TimeSeriesDataset

# The paper's Table 1, plus BasicMotions (small, ships in the aeon wheel, used in tests).
TABLE1_DATASETS: tuple[str, ...] = (
  "EthanolConcentration",
  "FaceDetection",
  "Handwriting",
  "Heartbeat",
  "JapaneseVowels",
  "PEMS-SF",
  "SelfRegulationSCP1",
  "SelfRegulationSCP2",
  "SpokenArabicDigits",
  "UWaveGestureLibrary",
)
KNOWN_DATASETS: tuple[str, ...] = (*TABLE1_DATASETS, "BasicMotions")
AEON_SOURCE = "aeon"
MISSING_POLICIES: tuple[str, ...] = ("raise", "zero")  # of ts_format's, those that keep NaN from the model
DATASET_VERSION = "1.0.0"

_GET_FILES = (
  "Download the UEA multivariate archive (Multivariate2018_ts.zip, https://www.timeseriesclassification.com) "
  "and pass its root, laid out as <root>/<Name>/<Name>_TRAIN.ts and <Name>_TEST.ts, as `source`; or pass "
  f"source='{AEON_SOURCE}' for {' or '.join(sorted(AEON_DATASETS))}, which are fetched from the aeon wheel on PyPI."
)


class UeaConfig(tfds.core.BuilderConfig):
  """A UEA problem; its name is the archive's directory name (case-sensitive)."""


def uea_config(name: str) -> UeaConfig:
  """The registered config for a known problem, else a new one, so any archive problem can be prepared."""
  if not name or "/" in name or name != name.strip():
    raise ValueError(f"name must be a UEA problem name such as 'JapaneseVowels' (a directory name), got {name!r}")
  for config in UeaClassification.BUILDER_CONFIGS:
    if config.name == name:
      return config
  return _new_config(name)


def _new_config(name: str) -> UeaConfig:
  return UeaConfig(name=name, version=DATASET_VERSION, description=f"UEA multivariate problem {name}")


def check_source_files(source_dir: str | Path, name: str) -> dict[str, Path]:
  """{"train": path, "test": path} of a problem under an archive root; FileNotFoundError naming what is absent."""
  paths = uea_split_paths(source_dir, name)
  absent = [str(p) for p in paths.values() if not p.is_file()]
  if absent:
    raise MissingFileError(f"data.source: UEA problem {name!r}: missing {', '.join(absent)}. {_GET_FILES}")
  return paths


class UeaClassification(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """UEA multivariate time-series classification, one config per problem.

  Not registered with TFDS (no import-time global state): build it through
  `prepare_uea`, or construct it with `source_dir`, the archive root holding
  `<Name>/<Name>_{TRAIN,TEST}.ts`. `source_dir` is only read by
  `download_and_prepare`; a prepared dataset is read from `data_dir` alone.
  `missing` is what preparing does with '?'/NaN values (`ts_format.parse_ts`);
  the metadata records it with the number of values that were missing.
  """

  VERSION = tfds.core.Version(DATASET_VERSION)
  RELEASE_NOTES = {DATASET_VERSION: "Cases of the .ts files in file order, with their file index and length."}
  BUILDER_CONFIGS = [_new_config(name) for name in KNOWN_DATASETS]
  # TFDS locates the builder's source file only to find a checksums file for downloads, which this builder
  # has none of; its lookup imports `importlib_resources`, which tensorflow-datasets 4.9.10 does not declare
  # on Python >= 3.9 (tensorflow/datasets#11212), so it is skipped.
  code_path = None

  def __init__(self, *, source_dir: str | Path | None = None, missing: Missing = "raise", **kwargs: Any):
    self._source_dir = Path(source_dir).expanduser() if source_dir is not None else None
    self._missing = missing
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
      features=tfds.features.FeaturesDict(
        {
          # [length, channels]; two unknown dimensions need an encoded tensor.
          "values": tfds.features.Tensor(shape=(None, None), dtype=np.float32, encoding="bytes"),
          "label": tfds.features.ClassLabel(),  # names are set from @classLabel when preparing
          "length": tfds.features.Scalar(dtype=np.int32),
          "index": tfds.features.Scalar(dtype=np.int64),
        }
      ),
      supervised_keys=None,
      disable_shuffling=True,  # keep file order: record i is case i of the file
      metadata=tfds.core.MetadataDict(),
      homepage="https://www.timeseriesclassification.com",
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict[str, Iterator]:
    del dl_manager  # the files are local: an archive root or the aeon cache
    if self._source_dir is None:
      raise ValueError(f"UEA problem {self.builder_config.name!r} is not prepared; pass source_dir. {_GET_FILES}")
    name = self.builder_config.name
    paths = check_source_files(self._source_dir, name)
    # Parsed with NaN kept (unless missing values are refused) so that they can be counted, then replaced.
    train, test = load_uea(self._source_dir, name, missing="raise" if self._missing == "raise" else "keep")
    num_missing = sum(int(np.isnan(series).sum()) for split in (train, test) for series in split.series)
    if self._missing == "zero":
      train, test = (_zero_missing(split) for split in (train, test))
    self.info.features["label"].names = list(train.class_names)
    self.info.metadata["source_sha256"] = {split: sha256_file(path) for split, path in paths.items()}
    self.info.metadata["num_channels"] = train.num_channels
    self.info.metadata["missing"] = {"policy": self._missing, "values": num_missing}
    return {"train": self._generate_examples(train), "test": self._generate_examples(test)}

  def _generate_examples(self, dataset: TimeSeriesDataset) -> Iterator[tuple[int, dict[str, Any]]]:
    for i, (values, label) in enumerate(zip(dataset.series, dataset.labels, strict=True)):
      yield i, {"values": values, "label": int(label), "length": np.int32(values.shape[0]), "index": np.int64(i)}


def _zero_missing(dataset: TimeSeriesDataset) -> TimeSeriesDataset:
  series = [np.where(np.isnan(values), 0.0, values).astype(values.dtype) for values in dataset.series]
  return dataclasses.replace(dataset, series=series)


def _check_recorded_missing(builder: UeaClassification, missing: Missing) -> None:
  """Data prepared with missing values replaced one way is refused for another (a dataset without missing
  values, or prepared before this was recorded, which refused them, serves every policy)."""
  recorded = dict(builder.info.metadata.get("missing", {}))
  if recorded.get("values", 0) and recorded.get("policy") != missing:
    raise ConfigError(
      f"data.missing={missing!r}, but UEA problem {builder.builder_config.name!r} in {builder.data_dir} was prepared "
      f"with missing={recorded['policy']!r} ({recorded['values']} missing values); delete that directory or pass "
      "another data.data_dir"
    )


def _check_recorded_source(builder: UeaClassification, expected: dict[str, str], where: str) -> None:
  recorded = dict(builder.info.metadata.get("source_sha256", {}))
  if recorded and recorded != expected:
    raise ValueError(
      f"UEA problem {builder.builder_config.name!r} in {builder.data_dir} was prepared from other files than "
      f"{where} (sha256 {recorded} vs {expected}); delete that directory or pass another data_dir"
    )


def prepare_uea(
  name: str, source: str | Path, data_dir: str | Path | None = None, *, missing: Missing = "raise"
) -> UeaClassification:
  """The builder of problem `name`, prepared (ArrayRecord files) under `data_dir` if it was not already.

  Args:
    name: the archive's problem name, e.g. "JapaneseVowels" or "PEMS-SF".
    source: "aeon" (fetch the pinned files from the aeon wheel, for the problems
      in `aeon_wheel.AEON_DATASETS`) or the root of a `Multivariate2018_ts`
      archive, `<source>/<name>/<name>_TRAIN.ts` and `_TEST.ts`.
    data_dir: where TFDS keeps prepared data; default `default_data_dir()`.
    missing: '?'/NaN values in the files: "raise" (an error naming the file
      and line) or "zero" (replaced by 0; config `data.missing`). NaN is never
      kept, since no model may see it.

  A dataset prepared earlier is reused without reading `source`, except that
  its recorded source checksums must match the files `source` names, so data
  prepared from one copy of a problem is never silently used for another.

  Raises:
    FileNotFoundError: a `.ts` file is missing (naming it and how to get it).
    ValueError: the prepared data came from different files, or with missing
      values replaced differently; a `.ts` file is malformed.
  """
  if missing not in MISSING_POLICIES:
    raise ConfigError(
      f"data.missing must be one of {', '.join(MISSING_POLICIES)}, got {missing!r} "
      "(NaN never reaches a model: 'zero' replaces missing values with 0)"
    )
  data_dir = Path(data_dir).expanduser() if data_dir else default_data_dir()  # "" (a config default) too
  from_aeon = str(source) == AEON_SOURCE
  if from_aeon:
    if name not in AEON_DATASETS:
      available = ", ".join(sorted(AEON_DATASETS))
      raise ConfigError(f"data.dataset: source='{AEON_SOURCE}' has only {available}, not {name!r}. {_GET_FILES}")
    expected = {split: AEON_DATASETS[name][f"{name}_{tag}.ts"] for split, tag in SPLITS.items()}
    where = f"the pinned aeon=={AEON_VERSION} wheel files"
  else:
    source_dir = Path(source).expanduser()
    expected = {split: sha256_file(path) for split, path in check_source_files(source_dir, name).items()}
    where = str(source_dir)
  builder = UeaClassification(config=uea_config(name), data_dir=data_dir, file_format="array_record")
  if builder.is_prepared():
    _check_recorded_source(builder, expected, where)
    _check_recorded_missing(builder, missing)
    return builder
  if from_aeon:
    source_dir = fetch_aeon_dataset(name).parent  # checks the pinned checksums
  builder = UeaClassification(
    config=uea_config(name), data_dir=data_dir, file_format="array_record", source_dir=source_dir, missing=missing
  )
  builder.download_and_prepare(file_format="array_record")
  return builder
