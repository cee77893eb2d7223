"""Parser for the sktime/UEA `.ts` time-series format, and padding into model batches (`archive`: file layout).

The UEA multivariate classification archive (`Multivariate2018_ts`, the paper's
Table 1) ships every problem as `<Name>/<Name>_TRAIN.ts` and `<Name>_TEST.ts`.
A file is a header of `@tag value` lines, then `@data`, then one case per line:

    @problemName Example
    @dimensions 2
    @equalLength false
    @classLabel true a b
    @data
    1.0,2.0,3.0:4.0,5.0,6.0:a      <- dimension 1 : dimension 2 : class label
    1.5,?:2.5,3.5:b                <- '?' (or NaN) marks a missing value

Lines starting with '#' (and '%', which some aeon test files use) are comments.

Why a hand-written parser rather than sktime/aeon: those pull in pandas and a
large dependency tree for what is a few hundred lines of text handling, and
their loaders accept malformed files silently in places. Here every malformed
file is a `ValueError` naming the file, the line and what was expected, and a
missing value can never silently reach a model: the default `missing="raise"`
refuses it, and `pad_batch` refuses non-finite values too.

Only what classification needs is supported: `@timeStamps true` (timestamped
values) and regression files (`@targetLabel`) are rejected with a clear error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from primal_jax.errors import ConfigError

Missing = Literal["raise", "keep", "zero"]

MISSING_OPTIONS: tuple[str, ...] = ("raise", "keep", "zero")

_COMMENT_PREFIXES = ("#", "%")
_MISSING_TOKENS = frozenset({"?", "nan", "+nan", "-nan"})
_BOOLEAN_TAGS = {
  "timestamps": "timeStamps",
  "missing": "missing",
  "univariate": "univariate",
  "equallength": "equalLength",
}


@dataclasses.dataclass(frozen=True)
class TimeSeriesDataset:
  """One split of a classification problem: variable-length multivariate series and their labels.

  Series stay unpadded (a list) because UEA problems such as JapaneseVowels have
  unequal lengths; `pad_batch` turns any subset into a dense batch plus mask.
  Frozen so a split cannot be rebound by accident; the arrays themselves are
  ordinary numpy arrays.
  """

  series: list[np.ndarray]  # num_cases x [length_i, channels] float32
  labels: np.ndarray  # [num_cases] int32, indices into class_names
  class_names: tuple[str, ...]  # in @classLabel declaration order
  name: str

  def __post_init__(self) -> None:
    if self.labels.ndim != 1 or len(self.labels) != len(self.series):
      raise ValueError(f"labels must have shape [{len(self.series)}] (one per series), got {self.labels.shape}")
    if self.labels.dtype != np.int32:
      raise ValueError(f"labels must be int32 class indices, got dtype {self.labels.dtype}")
    if len(self.labels) and (self.labels.min() < 0 or self.labels.max() >= len(self.class_names)):
      raise ValueError(f"labels must lie in [0, {len(self.class_names)}) to index class_names")
    for i, s in enumerate(self.series):
      if s.ndim != 2 or s.dtype != np.float32:
        raise ValueError(f"series {i} must be a [length, channels] float32 array, got {s.dtype} {s.shape}")
      if s.shape[1] != self.series[0].shape[1]:
        raise ValueError(f"series {i} has {s.shape[1]} channels, series 0 has {self.series[0].shape[1]}")

  def __len__(self) -> int:
    return len(self.series)

  @property
  def num_channels(self) -> int:
    return int(self.series[0].shape[1]) if self.series else 0

  @property
  def num_classes(self) -> int:
    return len(self.class_names)

  @property
  def lengths(self) -> np.ndarray:
    """[num_cases] int64 number of time steps of each series."""
    return np.array([s.shape[0] for s in self.series], dtype=np.int64)


def _error(source: str, lineno: int, message: str) -> ConfigError:
  """A malformed file is the user's data, not a bug: a `ConfigError` (a ValueError) that the CLI prints as one
  line naming the file and the line."""
  return ConfigError(f"{source}, line {lineno}: {message}")


def _preview(text: str, limit: int = 60) -> str:
  return text if len(text) <= limit else text[:limit] + "..."


def _parse_bool(source: str, lineno: int, tag: str, value: str) -> bool:
  lowered = value.strip().lower()
  if lowered not in ("true", "false"):
    raise _error(source, lineno, f"expected 'true' or 'false' after @{tag}, got {value.strip()!r}")
  return lowered == "true"


def _parse_positive_int(source: str, lineno: int, tag: str, value: str) -> int:
  try:
    number = int(value.strip())
  except ValueError:
    number = 0
  if number < 1:
    raise _error(source, lineno, f"expected a positive integer after @{tag}, got {value.strip()!r}")
  return number


def _parse_dimension(source: str, lineno: int, field: str, dim: int, num_dims: int, missing: Missing) -> np.ndarray:
  """[length] float64 values of one ':'-separated dimension of a case."""
  tokens = field.split(",")
  try:  # Fast path: numpy converts the whole dimension at once; only failures get the slow scan.
    values = np.array(tokens, dtype=np.float64)
  except ValueError:
    values = np.empty(len(tokens), dtype=np.float64)
    for i, token in enumerate(tokens):
      stripped = token.strip()
      where = f"dimension {dim + 1} of {num_dims}, value {i + 1}"
      if not stripped:
        raise _error(source, lineno, f"empty value at {where}: expected a number, '?' or NaN between commas") from None
      if stripped.lower() in _MISSING_TOKENS:
        values[i] = np.nan
        continue
      try:
        values[i] = float(stripped)
      except ValueError:
        raise _error(source, lineno, f"non-numeric value {_preview(stripped)!r} at {where}") from None
  nan_at = np.flatnonzero(np.isnan(values))
  if nan_at.size:
    if missing == "raise":
      raise _error(
        source,
        lineno,
        f"missing value ('?' or NaN) at dimension {dim + 1} of {num_dims}, value {nan_at[0] + 1}; "
        "pass missing='zero' to replace missing values with 0 (in a config: data.missing='zero') or missing='keep' "
        "to keep NaN",
      )
    if missing == "zero":
      values[nan_at] = 0.0
  return values


def parse_ts(
  text: str, *, source: str = "<string>", missing: Missing = "raise", default_name: str | None = None
) -> TimeSeriesDataset:
  """Parses the contents of a classification `.ts` file.

  Args:
    text: the whole file.
    source: how errors name the file.
    missing: what to do with '?'/NaN values: "raise" (default, a ValueError
      naming the line), "keep" (NaN, to impute later) or "zero" (replace by 0).
    default_name: dataset name when the header has no @problemName.

  Returns:
    A TimeSeriesDataset; series are [length, channels] float32.
  """
  if missing not in MISSING_OPTIONS:
    raise ValueError(f"missing must be one of {MISSING_OPTIONS}, got {missing!r}")
  lines = text.splitlines()
  if not any(line.strip() for line in lines):
    raise _error(source, 1, "empty file: expected a '.ts' header (@problemName, ..., @classLabel) followed by @data")

  header: dict[str, object] = {}
  class_names: tuple[str, ...] | None = None
  data_lineno: int | None = None
  num_dims: int | None = None
  expected_length: int | None = None
  series: list[np.ndarray] = []
  labels: list[int] = []
  label_index: dict[str, int] = {}

  for lineno, line in enumerate(lines, start=1):
    stripped = line.strip()
    if not stripped or stripped.startswith(_COMMENT_PREFIXES):
      continue

    if data_lineno is None:  # Header section.
      if not stripped.startswith("@"):
        raise _error(
          source,
          lineno,
          f"expected a header line starting with '@' or a '#' comment before @data, got {_preview(stripped)!r}",
        )
      if len(stripped) == 1 or stripped[1].isspace():
        raise _error(source, lineno, f"expected a tag name right after '@', got {_preview(stripped)!r}")
      tag, *rest = stripped[1:].split(None, 1)  # "@tag value", any whitespace between.
      value = rest[0] if rest else ""
      key = tag.lower()
      if key == "problemname":
        header["problemname"] = value.strip()
      elif key in _BOOLEAN_TAGS:
        header[key] = _parse_bool(source, lineno, _BOOLEAN_TAGS[key], value)
        if key == "timestamps" and header[key]:
          raise _error(source, lineno, "'@timeStamps true' (timestamped values) is not supported; expected false")
      elif key in ("dimensions", "dimension"):
        header["dimensions"] = _parse_positive_int(source, lineno, tag, value)
      elif key == "serieslength":
        header["serieslength"] = _parse_positive_int(source, lineno, tag, value)
      elif key == "targetlabel":
        raise _error(source, lineno, "regression files (@targetLabel) are not supported; expected @classLabel true")
      elif key == "classlabel":
        parts = value.split()
        if not parts or not _parse_bool(source, lineno, "classLabel", parts[0]):
          raise _error(
            source, lineno, "expected '@classLabel true <label> <label> ...': only labelled files can be loaded"
          )
        if len(parts) == 1:
          raise _error(source, lineno, "expected at least one class label after '@classLabel true'")
        names = tuple(parts[1:])
        if len(set(names)) != len(names):
          raise _error(source, lineno, f"duplicate class labels in @classLabel: {' '.join(names)}")
        class_names = names
        label_index = {name: i for i, name in enumerate(names)}
      elif key == "data":
        if class_names is None:
          raise _error(source, lineno, "expected '@classLabel true <labels...>' before @data")
        declared = header.get("dimensions")
        if header.get("univariate") is True:
          if declared not in (None, 1):
            raise _error(source, lineno, f"header says '@univariate true' but '@dimensions {declared}'")
          declared = 1
        num_dims = declared  # type: ignore[assignment]  # None: inferred from the first case.
        if header.get("equallength") is True:
          expected_length = header.get("serieslength")  # type: ignore[assignment]
        data_lineno = lineno
      # Other tags (there are none in the UEA archive) are ignored, as sktime does.
      continue

    # Data section: one case per line.
    if stripped.startswith("@"):
      raise _error(source, lineno, f"header line {_preview(stripped)!r} after @data (line {data_lineno})")
    fields = stripped.split(":")
    if num_dims is None:
      if len(fields) < 2:
        raise _error(source, lineno, "expected '<values>:<values>:...:<class label>' with at least one dimension")
      num_dims = len(fields) - 1
    if len(fields) != num_dims + 1:
      raise _error(
        source,
        lineno,
        f"expected {num_dims} dimension(s) then the class label ({num_dims + 1} ':'-separated fields), "
        f"got {len(fields)} fields",
      )
    label = fields[-1].strip()
    if label not in label_index:
      raise _error(
        source, lineno, f"class label {_preview(label)!r} is not declared in @classLabel ({' '.join(class_names)})"
      )
    dims = [_parse_dimension(source, lineno, f, d, num_dims, missing) for d, f in enumerate(fields[:-1])]
    dim_lengths = [len(d) for d in dims]
    if len(set(dim_lengths)) != 1:
      raise _error(
        source, lineno, f"dimensions of one case must have equal lengths, got lengths {dim_lengths} per dimension"
      )
    if header.get("equallength") is True:
      if expected_length is None:
        expected_length = dim_lengths[0]
      elif dim_lengths[0] != expected_length:
        raise _error(
          source,
          lineno,
          f"header says '@equalLength true' (length {expected_length}), but this case has length {dim_lengths[0]}",
        )
    values = np.stack(dims, axis=1).astype(np.float32)  # [length, channels]
    if np.isinf(values).any():
      raise _error(source, lineno, "infinite value (or one outside the float32 range): expected finite numbers")
    series.append(values)
    labels.append(label_index[label])

  if data_lineno is None:
    raise _error(
      source, len(lines), "reached the end of the file without '@data': expected the header to end with @data"
    )
  if not series:
    raise _error(source, len(lines), f"no cases after @data (line {data_lineno}): expected one case per line")
  name = str(header.get("problemname") or default_name or "<unnamed>")
  return TimeSeriesDataset(series=series, labels=np.array(labels, dtype=np.int32), class_names=class_names, name=name)


def read_ts(path: str | Path, *, missing: Missing = "raise") -> TimeSeriesDataset:
  """Reads and parses one `.ts` file (see `parse_ts`); errors name `path`."""
  path = Path(path)
  try:
    text = path.read_text(encoding="utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"{path}: not a UTF-8 text file ({e}); expected a '.ts' file") from e
  return parse_ts(text, source=str(path), missing=missing, default_name=path.stem)


def pad_batch(
  series_list: Sequence[np.ndarray], max_len: int | None = None, *, truncate: bool = False
) -> tuple[np.ndarray, np.ndarray]:
  """Zero-pads series at the end into a dense batch and a padding mask.

  Args:
    series_list: B arrays, each [length_i, C].
    max_len: L, the padded length; default the longest series.
    truncate: with `max_len` shorter than a series, keep its first `max_len`
      steps (what Time-Series-Library's `collate_fn`, used by the paper's UEA
      code, does). Off by default so data is never dropped unnoticed.

  Returns:
    values [B, L, C] float32 (0 at padding) and mask [B, L] bool, True at real
    steps (the convention of `primal_jax.masks`).
  """
  if len(series_list) == 0:
    raise ValueError("pad_batch needs at least one series")
  arrays = [np.asarray(s) for s in series_list]
  for i, a in enumerate(arrays):
    if a.ndim != 2:
      raise ValueError(f"series {i} has shape {a.shape}; expected [length, channels]")
    if a.shape[0] == 0:
      raise ValueError(f"series {i} is empty; a fully padded row would make masked pooling divide by zero")
    if a.shape[1] != arrays[0].shape[1]:
      raise ValueError(f"series {i} has {a.shape[1]} channels, series 0 has {arrays[0].shape[1]}")
    if not np.isfinite(a).all():
      raise ValueError(
        f"series {i} has NaN or infinite values; impute them first (or load with missing='zero') "
        "so they cannot reach the model"
      )
  lengths = [a.shape[0] for a in arrays]
  if max_len is None:
    max_len = max(lengths)
  elif max_len < 1:
    raise ValueError(f"max_len must be positive, got {max_len}")
  too_long = [i for i, n in enumerate(lengths) if n > max_len]
  if too_long and not truncate:
    i = too_long[0]
    raise ValueError(
      f"series {i} has length {lengths[i]} > max_len={max_len} ({len(too_long)} series too long); "
      "pass truncate=True to keep the first max_len steps"
    )
  batch, channels = len(arrays), arrays[0].shape[1]
  values = np.zeros((batch, max_len, channels), dtype=np.float32)  # [B, L, C]
  mask = np.zeros((batch, max_len), dtype=bool)  # [B, L]
  for i, a in enumerate(arrays):
    n = min(lengths[i], max_len)
    values[i, :n] = a[:n]
    mask[i, :n] = True
  return values, mask
