"""Tests of tasks.uea.tfds_dataset: UEA `.ts` files prepared as TFDS ArrayRecords and read back without TensorFlow.

The real JapaneseVowels files come from the pinned aeon wheel via
`fetch_aeon_dataset` (cached in the default cache dir after the first
download; the tests that need them are skipped if they can be neither found
nor fetched). Everything else uses tiny hand-written archives in tmp dirs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from primal_jax.tasks.uea.aeon_wheel import AEON_DATASETS, DatasetFetchError, fetch_aeon_dataset
from primal_jax.tasks.uea.archive import load_uea_split
from primal_jax.tasks.uea.tfds_dataset import (
  KNOWN_DATASETS,
  TABLE1_DATASETS,
  UeaClassification,
  default_data_dir,
  prepare_uea,
  uea_config,
)

# Labels declared as "b a": index 0 is "b" although "a" appears first in the data.
TOY_TRAIN = (
  "@problemName Toy\n@dimensions 2\n@equalLength false\n@classLabel true b a\n@data\n"
  "1,2,3:4,5,6:a\n7:8:b\n9,10:11,12:a\n"
)
TOY_TEST = "@problemName Toy\n@dimensions 2\n@classLabel true b a\n@data\n0.5,1.5:2.5,3.5:b\n"


def write_archive(root: Path, name: str, train: str | None, test: str | None) -> Path:
  """A Multivariate2018_ts-style archive root holding <name>/<name>_{TRAIN,TEST}.ts (None: file left out)."""
  (root / name).mkdir(parents=True, exist_ok=True)
  for tag, text in (("TRAIN", train), ("TEST", test)):
    if text is not None:
      (root / name / f"{name}_{tag}.ts").write_text(text)
  return root


@pytest.fixture(scope="module")
def aeon_root() -> Path:
  try:
    return fetch_aeon_dataset("JapaneseVowels").parent
  except DatasetFetchError as e:
    pytest.skip(f"JapaneseVowels is not cached and the aeon wheel could not be fetched: {e}")


@pytest.fixture(scope="module")
def jv_builder(aeon_root, tmp_path_factory):
  return prepare_uea("JapaneseVowels", "aeon", tmp_path_factory.mktemp("tfds"))


def test_round_trip_japanese_vowels(jv_builder, aeon_root):
  """Every case comes back exactly as the .ts parser reads it, in file order."""
  info = jv_builder.info
  assert {s: info.splits[s].num_examples for s in ("train", "test")} == {"train": 270, "test": 370}
  assert info.features["label"].names == [str(i) for i in range(1, 10)]
  assert info.metadata["num_channels"] == 12
  pins = AEON_DATASETS["JapaneseVowels"]
  assert dict(info.metadata["source_sha256"]) == {
    "train": pins["JapaneseVowels_TRAIN.ts"],
    "test": pins["JapaneseVowels_TEST.ts"],
  }
  assert sorted(Path(jv_builder.data_dir).glob("*.array_record-*"))  # ArrayRecord files, not TFRecord
  for split in ("train", "test"):
    source = jv_builder.as_data_source(split)
    reference = load_uea_split(aeon_root, "JapaneseVowels", split)
    assert len(source) == len(reference)
    for i in range(len(source)):
      example = source[i]
      values = example["values"]
      assert values.dtype == np.float32 and values.shape[1] == 12
      np.testing.assert_array_equal(values, reference.series[i])
      assert (example["label"], example["length"], example["index"]) == (reference.labels[i], values.shape[0], i)


def test_prepared_dataset_is_reused(jv_builder, monkeypatch):
  def fail(*args, **kwargs):
    raise AssertionError("a prepared dataset must not be prepared again")

  monkeypatch.setattr(UeaClassification, "download_and_prepare", fail)
  again = prepare_uea("JapaneseVowels", "aeon", Path(jv_builder.data_dir).parents[2])  # data_dir/<name>/<config>/<v>
  assert again.data_dir == jv_builder.data_dir and again.is_prepared()


def test_archive_root_any_problem_name(tmp_path):
  """A name outside the known configs, labels indexed in @classLabel order, unequal lengths."""
  root = write_archive(tmp_path / "archive", "Toy", TOY_TRAIN, TOY_TEST)
  builder = prepare_uea("Toy", root, tmp_path / "tfds")
  assert builder.info.features["label"].names == ["b", "a"]
  train = builder.as_data_source("train")
  assert [train[i]["label"] for i in range(3)] == [1, 0, 1]
  assert [train[i]["length"] for i in range(3)] == [3, 1, 2]
  np.testing.assert_array_equal(train[2]["values"], np.array([[9, 11], [10, 12]], np.float32))
  test = builder.as_data_source("test")
  assert len(test) == 1 and test[0]["label"] == 0 and test[0]["index"] == 0


def test_missing_file_names_the_path_and_how_to_get_it(tmp_path):
  root = write_archive(tmp_path / "archive", "Toy", TOY_TRAIN, None)
  with pytest.raises(FileNotFoundError, match=r"missing .*Toy_TEST\.ts\. Download the UEA") as e:
    prepare_uea("Toy", root, tmp_path / "tfds")
  assert "Toy_TRAIN.ts" not in str(e.value).split(". Download")[0]  # only the absent file is named
  assert "source='aeon'" in str(e.value)
  with pytest.raises(FileNotFoundError, match=r"Nope_TRAIN\.ts, .*Nope_TEST\.ts"):
    prepare_uea("Nope", root, tmp_path / "tfds")
  assert not (tmp_path / "tfds").exists() or not any((tmp_path / "tfds").rglob("*.array_record*"))


def test_prepared_from_other_files_is_refused(tmp_path):
  root = write_archive(tmp_path / "archive", "Toy", TOY_TRAIN, TOY_TEST)
  prepare_uea("Toy", root, tmp_path / "tfds")
  other = write_archive(tmp_path / "other", "Toy", TOY_TRAIN, TOY_TEST.replace("0.5", "0.25"))
  with pytest.raises(ValueError, match="was prepared from other files than .*other"):
    prepare_uea("Toy", other, tmp_path / "tfds")


def test_aeon_source_only_for_pinned_problems(tmp_path):
  with pytest.raises(ValueError, match=r"source='aeon' has only BasicMotions, JapaneseVowels, not 'Heartbeat'"):
    prepare_uea("Heartbeat", "aeon", tmp_path)


def test_builder_without_source_dir_cannot_prepare(tmp_path):
  builder = UeaClassification(config=uea_config("Toy"), data_dir=tmp_path, file_format="array_record")
  with pytest.raises(ValueError, match="is not prepared; pass source_dir"):
    builder.download_and_prepare(file_format="array_record")


def test_configs(monkeypatch, tmp_path):
  assert len(TABLE1_DATASETS) == 10 and set(TABLE1_DATASETS) < set(KNOWN_DATASETS)
  assert "BasicMotions" in KNOWN_DATASETS and "PEMS-SF" in TABLE1_DATASETS
  assert {c.name for c in UeaClassification.BUILDER_CONFIGS} == set(KNOWN_DATASETS)
  assert uea_config("PEMS-SF") is next(c for c in UeaClassification.BUILDER_CONFIGS if c.name == "PEMS-SF")
  assert uea_config("ArticularyWordRecognition").name == "ArticularyWordRecognition"
  for bad in ("", "a/b", " Toy"):
    with pytest.raises(ValueError, match="name must be a UEA problem name"):
      uea_config(bad)
  monkeypatch.setenv("PRIMAL_JAX_DATA", str(tmp_path))
  assert default_data_dir() == tmp_path / "tfds"
