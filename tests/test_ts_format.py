"""Tests of tasks.uea.ts_format and archive: the sktime/UEA `.ts` parser, pad_batch, the archive layout."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from primal_jax.tasks.uea.archive import load_uea, load_uea_split
from primal_jax.tasks.uea.ts_format import TimeSeriesDataset, pad_batch, parse_ts, read_ts

EQUAL_MULTI = """\
# A comment line, then the header.
@problemName Toy
@timeStamps false
@missing false
@univariate false
@dimensions 2
@equalLength true
@seriesLength 3
@classLabel true up down
@data
1,2,3:4,5,6:up
7,8,9:10,11,12:down
0.5,-1.5,2e3:0,0,0:up
"""

UNEQUAL_MULTI = """\
@problemName Ragged
@dimensions 3
@equalLength false
@classLabel true a b c
@data
1,2:3,4:5,6:c

1,2,3,4:5,6,7,8:9,10,11,12:a
% aeon's own test files also use '%' comments
1:2:3:b
"""

UNIVARIATE = """\
@problemName Uni
@univariate true
@equalLength false
@classLabel true 1 2
@data
1.0,2.0,3.0:2
4.0:1
"""

MISSING = """\
@problemName Gaps
@missing true
@dimensions 2
@classLabel true x y
@data
1,?,3:4,5,6:x
1,2:NaN,4:y
"""


def _write(tmp_path: Path, text: str, name: str = "case.ts") -> Path:
  path = tmp_path / name
  path.write_text(text, encoding="utf-8")
  return path


def test_equal_length_multivariate(tmp_path):
  """Dimensions become channels: series are [length, channels], labels index @classLabel order."""
  ds = read_ts(_write(tmp_path, EQUAL_MULTI))
  assert ds.name == "Toy"
  assert ds.class_names == ("up", "down")
  assert len(ds) == 3 and ds.num_channels == 2 and ds.num_classes == 2
  np.testing.assert_array_equal(ds.labels, np.array([0, 1, 0], dtype=np.int32))
  assert ds.labels.dtype == np.int32
  for s in ds.series:
    assert s.shape == (3, 2) and s.dtype == np.float32
  np.testing.assert_array_equal(ds.series[0], np.array([[1, 4], [2, 5], [3, 6]], dtype=np.float32))
  np.testing.assert_array_equal(ds.series[2][:, 0], np.array([0.5, -1.5, 2000.0], dtype=np.float32))


def test_unequal_length_multivariate(tmp_path):
  """Blank lines and '%' comments inside @data are skipped; lengths may differ between cases."""
  ds = read_ts(_write(tmp_path, UNEQUAL_MULTI))
  np.testing.assert_array_equal(ds.lengths, [2, 4, 1])
  assert [s.shape for s in ds.series] == [(2, 3), (4, 3), (1, 3)]
  np.testing.assert_array_equal(ds.labels, [2, 0, 1])
  np.testing.assert_array_equal(ds.series[1][:, 2], [9, 10, 11, 12])


def test_univariate(tmp_path):
  ds = read_ts(_write(tmp_path, UNIVARIATE))
  assert ds.num_channels == 1
  assert [s.shape for s in ds.series] == [(3, 1), (1, 1)]
  np.testing.assert_array_equal(ds.labels, [1, 0])


def test_dimensions_inferred_from_first_case_when_undeclared(tmp_path):
  """Some aeon files (JapaneseVowels_eq) omit @dimensions; the first case fixes it for the rest."""
  text = "@problemName NoDims\n@classLabel true a\n@data\n1,2:3,4:5,6:a\n7:8:9:a\n"
  ds = read_ts(_write(tmp_path, text))
  assert ds.num_channels == 3
  bad = text + "1:2:a\n"
  with pytest.raises(ValueError, match=r"line 6: expected 3 dimension\(s\)"):
    read_ts(_write(tmp_path, bad, "bad.ts"))


def test_header_tags_are_case_insensitive_and_crlf_is_accepted(tmp_path):
  text = "@PROBLEMNAME Caps\r\n@timestamps FALSE\r\n@ClassLabel true a b\r\n@DATA\r\n1,2:b\r\n"
  ds = read_ts(_write(tmp_path, text))
  assert ds.name == "Caps" and ds.num_channels == 1
  np.testing.assert_array_equal(ds.labels, [1])


def test_name_falls_back_to_file_stem(tmp_path):
  ds = read_ts(_write(tmp_path, "@classLabel true a\n@data\n1:a\n", "Stemmy_TRAIN.ts"))
  assert ds.name == "Stemmy_TRAIN"


def test_missing_raise_names_the_line(tmp_path):
  path = _write(tmp_path, MISSING)
  with pytest.raises(ValueError, match=r"line 6: missing value .* dimension 1 of 2, value 2") as e:
    read_ts(path)
  assert str(path) in str(e.value)
  assert "missing='keep'" in str(e.value)


def test_missing_keep_and_zero(tmp_path):
  path = _write(tmp_path, MISSING)
  kept = read_ts(path, missing="keep")
  assert np.isnan(kept.series[0][1, 0]) and np.isnan(kept.series[1][0, 1])
  assert np.isnan(kept.series[0]).sum() == 1 and np.isnan(kept.series[1]).sum() == 1
  zeroed = read_ts(path, missing="zero")
  np.testing.assert_array_equal(zeroed.series[0], np.array([[1, 4], [0, 5], [3, 6]], dtype=np.float32))
  np.testing.assert_array_equal(zeroed.series[1], np.array([[1, 0], [2, 4]], dtype=np.float32))


def test_missing_option_is_validated():
  with pytest.raises(ValueError, match="missing must be one of"):
    parse_ts(UNIVARIATE, missing="drop")  # type: ignore[arg-type]


HEADER = "@problemName Bad\n@dimensions 2\n@classLabel true a b\n@data\n"  # @data on line 4

MALFORMED = {
  "empty file": ("", 1, "empty file"),
  "whitespace-only file": ("\n  \n", 1, "empty file"),
  "missing @data": ("@problemName Bad\n@classLabel true a\n# no data tag\n", 3, "without '@data'"),
  "no cases after @data": (HEADER + "# nothing\n", 5, "no cases after @data"),
  "too few dimensions": (HEADER + "1,2:3,4:a\n1,2:a\n", 6, r"expected 2 dimension\(s\) .* got 2 fields"),
  "too many dimensions": (HEADER + "1:2:3:a\n", 5, r"expected 2 dimension\(s\) .* got 4 fields"),
  "undeclared label": (HEADER + "1:2:a\n1:2:z\n", 6, "class label 'z' is not declared in @classLabel"),
  "missing label": (HEADER + "1:2:\n", 5, "class label '' is not declared"),
  "non-numeric value": (HEADER + "1,abc:2,3:a\n", 5, "non-numeric value 'abc' at dimension 1 of 2, value 2"),
  "empty value": (HEADER + "1,,3:2,3,4:a\n", 5, "empty value at dimension 1 of 2, value 2"),
  "unequal dimension lengths": (HEADER + "1,2,3:4,5:a\n", 5, r"equal lengths, got lengths \[3, 2\]"),
  "infinite value": (HEADER + "1,inf:2,3:a\n", 5, "infinite value"),
  "text before header": ("hello\n@data\n", 1, "expected a header line starting with '@'"),
  "no classLabel": ("@problemName Bad\n@data\n1:a\n", 2, r"expected '@classLabel true <labels\.\.\.>' before @data"),
  "classLabel false": ("@classLabel false\n@data\n1\n", 1, "only labelled files"),
  "classLabel without labels": ("@classLabel true\n@data\n", 1, "at least one class label"),
  "duplicate labels": ("@classLabel true a b a\n@data\n", 1, "duplicate class labels"),
  "bad boolean": (
    "@univariate maybe\n@classLabel true a\n@data\n1:a\n",
    1,
    "expected 'true' or 'false' after @univariate",
  ),
  "bad dimensions": ("@dimensions zero\n@classLabel true a\n@data\n1:a\n", 1, "positive integer after @dimensions"),
  "timestamps": ("@timeStamps true\n@classLabel true a\n@data\n", 1, "not supported"),
  "regression": ("@targetLabel true\n@data\n1:0.5\n", 1, "regression files"),
  "univariate with 2 dimensions": ("@univariate true\n@dimensions 2\n@classLabel true a\n@data\n", 4, "@dimensions 2"),
  "bare @": ("@\n@classLabel true a\n@data\n1:a\n", 1, "tag name right after '@'"),
  "header after @data": (HEADER + "1:2:a\n@classLabel true a b\n", 6, "after @data"),
  "equalLength violated": (
    "@equalLength true\n@seriesLength 2\n@classLabel true a\n@data\n1,2:a\n1,2,3:a\n",
    6,
    r"'@equalLength true' \(length 2\), but this case has length 3",
  ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_files_name_file_line_and_expectation(tmp_path, case):
  text, lineno, pattern = MALFORMED[case]
  path = _write(tmp_path, text, "Bad_TRAIN.ts")
  with pytest.raises(ValueError, match=pattern) as e:
    read_ts(path)
  assert str(e.value).startswith(f"{path}, line {lineno}: "), str(e.value)


def test_non_utf8_file_is_a_value_error(tmp_path):
  path = tmp_path / "binary.ts"
  path.write_bytes(b"\xff\xfe@data\n")
  with pytest.raises(ValueError, match="not a UTF-8 text file"):
    read_ts(path)


def test_dataset_validates_its_fields():
  series = [np.zeros((3, 2), np.float32)]
  with pytest.raises(ValueError, match="one per series"):
    TimeSeriesDataset(series=series, labels=np.zeros(2, np.int32), class_names=("a",), name="x")
  with pytest.raises(ValueError, match="int32"):
    TimeSeriesDataset(series=series, labels=np.zeros(1, np.int64), class_names=("a",), name="x")
  with pytest.raises(ValueError, match="index class_names"):
    TimeSeriesDataset(series=series, labels=np.ones(1, np.int32), class_names=("a",), name="x")
  ds = TimeSeriesDataset(series=series, labels=np.zeros(1, np.int32), class_names=("a",), name="x")
  with pytest.raises(dataclasses.FrozenInstanceError):
    ds.name = "y"  # type: ignore[misc]


def _ragged(lengths: list[int], channels: int, seed: int = 0) -> list[np.ndarray]:
  rng = np.random.default_rng(seed)
  return [rng.standard_normal((n, channels)).astype(np.float32) for n in lengths]


def test_pad_batch_matches_numpy():
  lengths = [3, 5, 1]
  series = _ragged(lengths, channels=2)
  values, mask = pad_batch(series)
  assert values.shape == (3, 5, 2) and values.dtype == np.float32
  assert mask.shape == (3, 5) and mask.dtype == bool
  np.testing.assert_array_equal(mask, np.arange(5)[None, :] < np.array(lengths)[:, None])
  expected = np.zeros((3, 5, 2), np.float32)
  for i, s in enumerate(series):
    expected[i, : len(s)] = s
  np.testing.assert_array_equal(values, expected)


def test_pad_batch_max_len_and_truncation():
  series = _ragged([3, 5], channels=4)
  values, mask = pad_batch(series, max_len=8)
  assert values.shape == (2, 8, 4)
  np.testing.assert_array_equal(mask.sum(axis=1), [3, 5])
  assert not values[~mask].any()  # padding is exactly zero
  with pytest.raises(ValueError, match=r"series 1 has length 5 > max_len=4 .* truncate=True"):
    pad_batch(series, max_len=4)
  values, mask = pad_batch(series, max_len=4, truncate=True)
  np.testing.assert_array_equal(values[1], series[1][:4])
  np.testing.assert_array_equal(mask.sum(axis=1), [3, 4])


@pytest.mark.parametrize(
  "series, pattern",
  [
    ([], "at least one series"),
    ([np.zeros((3, 2)), np.zeros((3, 5))], "series 1 has 5 channels"),
    ([np.zeros(3)], r"expected \[length, channels\]"),
    ([np.zeros((0, 2))], "series 0 is empty"),
    ([np.zeros((2, 2)), np.array([[0.0, np.nan]])], "series 1 has NaN or infinite values"),
  ],
)
def test_pad_batch_rejects_bad_input(series, pattern):
  with pytest.raises(ValueError, match=pattern):
    pad_batch(series)


def test_pad_batch_on_parsed_dataset(tmp_path):
  ds = read_ts(_write(tmp_path, UNEQUAL_MULTI))
  values, mask = pad_batch(ds.series)
  assert values.shape == (3, 4, 3)
  np.testing.assert_array_equal(mask.sum(axis=1), ds.lengths)


def _archive(root: Path, name: str, train: str, test: str | None) -> None:
  (root / name).mkdir(parents=True)
  (root / name / f"{name}_TRAIN.ts").write_text(train, encoding="utf-8")
  if test is not None:
    (root / name / f"{name}_TEST.ts").write_text(test, encoding="utf-8")


def test_load_uea_split_archive_layout(tmp_path):
  _archive(tmp_path, "Toy", EQUAL_MULTI, EQUAL_MULTI.replace("@problemName Toy", "@problemName Toy_TEST_eq.ts"))
  train = load_uea_split(tmp_path, "Toy", "train")
  test = load_uea_split(str(tmp_path), "Toy", "TEST")
  assert train.name == test.name == "Toy"  # the requested name, not the file's @problemName
  assert len(train) == len(test) == 3
  pair = load_uea(tmp_path, "Toy")
  assert [len(d) for d in pair] == [3, 3]


def test_load_uea_split_missing_files(tmp_path):
  with pytest.raises(FileNotFoundError) as e:
    load_uea_split(tmp_path, "Absent", "train")
  message = str(e.value)
  assert str(tmp_path / "Absent" / "Absent_TRAIN.ts") in message
  assert str(tmp_path / "Absent" / "Absent_TEST.ts") in message
  assert "Multivariate2018_ts" in message and "<root>/<Name>/<Name>_TRAIN.ts" in message

  _archive(tmp_path, "Half", EQUAL_MULTI, None)
  assert len(load_uea_split(tmp_path, "Half", "train")) == 3
  with pytest.raises(FileNotFoundError) as e:
    load_uea_split(tmp_path, "Half", "test")
  assert f"missing {tmp_path / 'Half' / 'Half_TEST.ts'}." in str(e.value)
  assert "Half_TRAIN.ts" not in str(e.value)  # only the absent file is listed


def test_load_uea_split_hints_at_case_mismatch_and_checks_split(tmp_path):
  _archive(tmp_path, "JapaneseVowels", EQUAL_MULTI, EQUAL_MULTI)
  with pytest.raises(FileNotFoundError, match="case-sensitive: found JapaneseVowels"):
    load_uea_split(tmp_path, "japanesevowels", "train")
  with pytest.raises(ValueError, match="split must be 'train' or 'test'"):
    load_uea_split(tmp_path, "JapaneseVowels", "valid")


def test_load_uea_rejects_disagreeing_class_lists(tmp_path):
  _archive(tmp_path, "Mixed", EQUAL_MULTI, EQUAL_MULTI.replace("true up down", "true down up"))
  with pytest.raises(ValueError, match="different @classLabel lists"):
    load_uea(tmp_path, "Mixed")
