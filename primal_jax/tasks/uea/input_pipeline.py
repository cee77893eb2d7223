"""The UEA multivariate classification pipeline (the paper's Table 1), and the preprocessing it shares.

`make_uea_pipeline(data_config)` (task "uea") returns an `InputPipeline` whose
batches are per-host numpy dicts

  inputs  float32 [b, seq_len, C]   zero past each series' end
  mask    bool    [b, seq_len]      True at real time steps
  label   int32   [b]               class index (@classLabel order)
  weight  float32 [b]               1 for a real example, 0 for padding
  index   int64   [b]               case position in its .ts file; -1 for padding

with b = global batch size / process_count (see `pipeline` for the ordering).

UEA preprocessing follows the release (mvts_transformer, which the authors'
time-series code is built on): per-channel standardisation with the mean and
the (ddof=1, pandas') standard deviation over all real time steps of the
training cases, applied to every split. The release divides by std + float
eps; here std is floored at 1e-8, which differs only for a (near) constant
channel, where both leave ~0. The release pads/truncates to the longest
training series; `seq_len=0` here takes the longest over train and test, so no
test series is truncated.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from primal_jax.data.checks import check_fraction, check_nonnegative_int
from primal_jax.data.core import DatasetInfo, InputPipeline
from primal_jax.data.pipeline import Example, Subset
from primal_jax.data.splits import validation_split

NORMALIZATIONS: tuple[str, ...] = ("standardization", "none")
STD_FLOOR = 1e-8
_OPTIONAL = types.MappingProxyType(
  {"data_dir": None, "seq_len": 0, "normalization": "standardization", "val_fraction": 0.0, "missing": "raise"}
)


def _config_values(data_config: Any) -> dict[str, Any]:
  """The attributes the pipelines read, with defaults for the optional ones."""
  values = {}
  for key in ("task", "dataset", "source", "batch_size", "eval_batch_size", "seed"):
    if not hasattr(data_config, key):
      raise ValueError(f"data_config has no attribute {key!r}; it needs task, dataset, source, batch sizes and seed")
    values[key] = getattr(data_config, key)
  for key, default in _OPTIONAL.items():
    values[key] = getattr(data_config, key, default)
  return values


@dataclasses.dataclass(frozen=True)
class _SplitScan:
  """One pass over a split: lengths, labels and per-case channel moments (for merging into train statistics)."""

  lengths: np.ndarray  # [n] int64
  labels: np.ndarray  # [n] int64
  means: np.ndarray  # [n, C] float64 per-case channel means
  sq_devs: np.ndarray  # [n, C] float64 per-case sums of squared deviations from those means


def _scan(source: Sequence[Example], dataset: str, split: str, num_classes: int) -> _SplitScan:
  n = len(source)
  if n == 0:
    raise ValueError(f"dataset {dataset!r}, split {split!r} has no examples")
  lengths, labels, means, sq_devs = [], [], [], []
  for i in range(n):
    example = source[i]
    values = np.asarray(example["values"], dtype=np.float64)  # [length, C]
    index = int(example.get("index", i))
    if values.ndim != 2 or values.shape[0] == 0:
      raise ValueError(f"dataset {dataset!r}, split {split!r}, example {index}: values shape {values.shape}")
    if not np.isfinite(values).all():
      raise ValueError(
        f"dataset {dataset!r}, split {split!r}, example {index}: NaN or infinite values; impute them before "
        "training (ts_format.read_ts(missing='zero') or your own imputation)"
      )
    label = int(example["label"])
    if not 0 <= label < num_classes:
      where = f"dataset {dataset!r}, split {split!r}, example {index}"
      raise ValueError(f"{where}: label {label} not in [0, {num_classes})")
    mean = values.mean(axis=0)  # [C]
    lengths.append(values.shape[0])
    labels.append(label)
    means.append(mean)
    sq_devs.append(((values - mean) ** 2).sum(axis=0))
  channels = {m.shape[0] for m in means}
  if len(channels) != 1:
    raise ValueError(f"dataset {dataset!r}, split {split!r}: examples have different channel counts {sorted(channels)}")
  return _SplitScan(np.array(lengths, np.int64), np.array(labels, np.int64), np.stack(means), np.stack(sq_devs))


def channel_statistics(scan: _SplitScan, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(mean, std) [C] float64 over all time steps of the cases at `positions`, std with ddof=1 (pandas').

  Merges the per-case moments exactly (Chan et al.): the total sum of squared
  deviations is the within-case sums plus n_i * (mean_i - mean)^2.
  """
  counts = scan.lengths[positions].astype(np.float64)[:, None]  # [k, 1]
  total = counts.sum()
  mean = (counts * scan.means[positions]).sum(axis=0) / total  # [C]
  sq_dev = scan.sq_devs[positions].sum(axis=0) + (counts * (scan.means[positions] - mean) ** 2).sum(axis=0)
  std = np.sqrt(sq_dev / max(total - 1.0, 1.0))
  return mean, std


@dataclasses.dataclass(frozen=True)
class Standardize:
  """(values - mean) / max(std, STD_FLOOR) per channel, computed in float64 and returned as float32."""

  mean: np.ndarray  # [C] float64
  scale: np.ndarray  # [C] float64, std floored at STD_FLOOR

  def __call__(self, example: Example) -> Example:
    values = (np.asarray(example["values"], dtype=np.float64) - self.mean) / self.scale
    return {**example, "values": values.astype(np.float32)}


def pipeline_from_splits(
  name: str,
  splits: Mapping[str, Sequence[Example]],
  class_names: Sequence[str],
  data_config: Any,
  *,
  process_index: int = 0,
  process_count: int = 1,
) -> InputPipeline:
  """The InputPipeline of a classification problem given its "train" and "test" sources.

  Scans every example once (finiteness, labels, lengths, moments), carves the
  validation split out of train if `val_fraction > 0`, and fits the
  normalisation on what remains of train.
  """
  cfg = _config_values(data_config)
  if set(splits) != {"train", "test"}:
    raise ValueError(f"splits must be exactly 'train' and 'test', got {sorted(splits)}")
  if cfg["normalization"] not in NORMALIZATIONS:
    raise ValueError(f"normalization must be one of {', '.join(NORMALIZATIONS)}, got {cfg['normalization']!r}")
  fraction = check_fraction(cfg["val_fraction"], "val_fraction")
  seq_len = check_nonnegative_int(cfg["seq_len"], "seq_len")
  seed = check_nonnegative_int(cfg["seed"], "seed")

  scans = {split: _scan(source, name, split, len(class_names)) for split, source in splits.items()}
  channels = {split: scan.means.shape[1] for split, scan in scans.items()}
  if len(set(channels.values())) != 1:
    raise ValueError(f"dataset {name!r}: splits have different channel counts {channels}")
  train_positions = np.arange(len(splits["train"]), dtype=np.int64)
  sources: dict[str, Sequence[Example]] = {"train": splits["train"], "test": splits["test"]}
  if fraction > 0.0:
    train_positions, val_positions = validation_split(scans["train"].labels, fraction, seed)
    sources = {
      "train": Subset(splits["train"], train_positions),
      "validation": Subset(splits["train"], val_positions),
      "test": splits["test"],
    }

  transform = None
  if cfg["normalization"] == "standardization":
    mean, std = channel_statistics(scans["train"], train_positions)
    transform = Standardize(mean=mean, scale=np.maximum(std, STD_FLOOR))

  max_length = int(max(scan.lengths.max() for scan in scans.values()))
  info = DatasetInfo(
    name=name,
    num_classes=len(class_names),
    num_features=channels["train"],
    seq_len=seq_len or max_length,
    max_length=max_length,
    split_sizes=types.MappingProxyType({split: len(source) for split, source in sources.items()}),
    class_names=tuple(class_names),
  )
  return InputPipeline(
    info=info,
    sources=types.MappingProxyType(sources),
    transform=transform,
    batch_size=cfg["batch_size"],
    eval_batch_size=cfg["eval_batch_size"],
    seed=seed,
    process_index=process_index,
    process_count=process_count,
  )


def make_uea_pipeline(data_config: Any, *, process_index: int = 0, process_count: int = 1) -> InputPipeline:
  """A UEA problem (`data_config.dataset`) prepared as TFDS ArrayRecords from `data_config.source`.

  Every host prepares (or finds) the dataset under `data_dir`; with a shared
  `data_dir`, prepare it once first (e.g. on process 0 before the others start).
  `data_config.missing` ("raise", the default, or "zero") is what preparing does
  with the files' missing values ('?' or NaN).
  """
  from primal_jax.tasks.uea.tfds_dataset import prepare_uea  # tfds is imported only by the tasks that need it

  cfg = _config_values(data_config)
  builder = prepare_uea(cfg["dataset"], cfg["source"], cfg["data_dir"], missing=cfg["missing"])
  splits = {split: builder.as_data_source(split) for split in ("train", "test")}
  class_names = builder.info.features["label"].names
  return pipeline_from_splits(
    cfg["dataset"], splits, class_names, data_config, process_index=process_index, process_count=process_count
  )
