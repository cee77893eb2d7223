"""Metric logs and console progress for the train loop, written by the primary process only.

`<workdir>/metrics.jsonl` gets one JSON object per `MetricWriter.write` call:
`{"step": 120, "prefix": "train", "wall_time": 1718000000.0, "scalars": {"loss": 1.23}}`.
The file is opened in append mode so a resumed run continues it; a run resumed from a checkpoint
re-logs the steps after that checkpoint, so readers should keep the last entry per (step, prefix):
`read_metrics(workdir, dedupe=True)` does. Non-finite values are written as `NaN`/`Infinity`, which
Python's json reads back (strict JSON parsers do not). TensorBoard event files go to
`<workdir>/tensorboard` when tensorboardX is installed.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from primal_jax import markdown
from primal_jax.atomic_files import write_json_atomically

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
TENSORBOARD_DIR = "tensorboard"


def _to_float(value, name: str) -> float:
  if np.size(value) != 1:
    raise ValueError(f"scalar {name!r} must hold one number, got shape {np.shape(value)}")
  try:
    return float(np.asarray(value).reshape(()))
  except (TypeError, ValueError) as err:
    raise ValueError(f"scalar {name!r} must be a number, got {value!r}") from err


def _json_default(obj: Any):
  """Makes configs serialisable: dataclasses, mappings, numpy values, paths, enums; anything else as str."""
  if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
    return dataclasses.asdict(obj)
  if isinstance(obj, Mapping):
    return dict(obj)
  if hasattr(obj, "to_dict") and callable(obj.to_dict):  # ml_collections.ConfigDict
    return obj.to_dict()
  if isinstance(obj, np.generic):
    return obj.item()
  if isinstance(obj, np.ndarray):
    return obj.tolist()
  if isinstance(obj, enum.Enum):
    return obj.value if isinstance(obj.value, (str, int, float, bool)) else obj.name
  if isinstance(obj, (set, frozenset)):
    return sorted(obj, key=repr)
  return str(obj)


def config_record(config) -> dict:
  """`config` (a ConfigDict or a mapping) as `config.json` holds it: JSON types only, tuples as lists."""
  return json.loads(json.dumps(config, default=_json_default))


def _ends_with_newline(path: Path) -> bool:
  """True for an empty file or one whose last byte is a newline (reads one byte, not the file)."""
  with open(path, "rb") as f:
    if f.seek(0, os.SEEK_END) == 0:
      return True
    f.seek(-1, os.SEEK_END)
    return f.read(1) == b"\n"


class MetricWriter:
  """Appends scalars to `<workdir>/metrics.jsonl` (and TensorBoard) on the primary process.

  Non-primary processes (`is_primary=False`) write nothing and create no files, so every process can
  call `write` unconditionally. Each line is flushed at once, so a crash loses at most the line being
  written; a partial last line left by one is terminated before the next run appends.
  """

  def __init__(self, workdir, *, is_primary: bool, tensorboard: bool = True):
    self._workdir = Path(workdir)
    self._is_primary = bool(is_primary)
    self._file = None
    self._tb = None
    self._tensorboard_status = "disabled" if not tensorboard else "not primary"
    if not self._is_primary:
      return
    self._workdir.mkdir(parents=True, exist_ok=True)
    path = self._workdir / METRICS_FILE
    self._file = open(path, "a", encoding="utf-8")  # closed in close()
    if not _ends_with_newline(path):
      self._file.write("\n")
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter
      except ImportError as err:
        self._tensorboard_status = f"unavailable ({err})"
      else:
        self._tb = SummaryWriter(logdir=str(self._workdir / TENSORBOARD_DIR))
        self._tensorboard_status = "enabled"

  @property
  def is_primary(self) -> bool:
    return self._is_primary

  @property
  def tensorboard(self) -> bool:
    """Whether TensorBoard event files are being written."""
    return self._tb is not None

  @property
  def tensorboard_status(self) -> str:
    """'enabled', 'disabled', 'not primary' or 'unavailable (<import error>)'."""
    return self._tensorboard_status

  @property
  def path(self) -> Path:
    return self._workdir / METRICS_FILE

  def write(self, step: int, scalars: Mapping[str, Any], prefix: str = "train") -> None:
    """Logs `scalars` (numbers, 0-d or 1-element arrays) at `step` under `prefix` ('train', 'eval', ...)."""
    if not self._is_primary:
      return
    if self._file is None:
      raise ValueError(f"MetricWriter for {self._workdir} is closed")
    values = {str(name): _to_float(value, name) for name, value in scalars.items()}
    now = time.time()
    record = {"step": int(step), "prefix": prefix, "wall_time": now, "scalars": values}
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()
    if self._tb is not None:
      for name, value in values.items():
        self._tb.add_scalar(f"{prefix}/{name}", value, global_step=int(step), walltime=now)

  def write_config(self, config) -> Path | None:
    """Writes `<workdir>/config.json` (replacing it atomically, fsynced); returns its path, None off the primary."""
    if not self._is_primary:
      return None
    path = self._workdir / CONFIG_FILE
    write_json_atomically(path, config, indent=2, sort_keys=True, default=_json_default)
    return path

  def flush(self) -> None:
    if self._file is not None:
      self._file.flush()
    if self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None
    if self._tb is not None:
      self._tb.close()
      self._tb = None

  def __enter__(self) -> MetricWriter:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def read_metrics(workdir, *, dedupe: bool = False, prefix: str | None = None) -> list[dict]:
  """The records of `<workdir>/metrics.jsonl` in file order ([] if absent).

  dedupe: keep only the last record per (step, prefix), the one written after a resume, ordered by
    step and then by position in the file. prefix: keep only that prefix.
  An unterminated last line (a write cut short by a crash) is skipped; any other bad line raises.
  """
  path = Path(workdir) / METRICS_FILE
  if not path.exists():
    return []
  text = path.read_text(encoding="utf-8")
  lines = text.split("\n")
  records = []
  for number, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError as err:
      if number == len(lines):  # no newline after it: interrupted write
        continue
      raise ValueError(f"{path}:{number} is not a JSON metrics record ({err}): {line[:120]!r}") from err
  if prefix is not None:
    records = [r for r in records if r.get("prefix") == prefix]
  if dedupe:
    last = {(r["step"], r["prefix"]): (i, r) for i, r in enumerate(records)}
    records = [r for _, r in sorted(last.values(), key=lambda ir: (ir[1]["step"], ir[0]))]
  return records


def ksvd_ratio(records: Sequence[Mapping[str, Any]], eta: float) -> dict | None:
  """eta x KSVD loss / task loss at the first, middle and last logged train steps: how much the KSVD term weighs.

  `records`: `read_metrics(workdir, dedupe=True, prefix="train")`. Returns {"start": ..., "middle": ..., "end": ...},
  "middle" the logged step nearest half-way between the first and last (the earlier on a tie), each
  {"step", "task_loss", "ksvd_loss", "eta", "ratio"} (ratio nan for a zero task loss), None without train records
  holding both losses. A run with no KSVD layer has ksvd_loss 0, so its ratio is 0.
  """
  logged = [r for r in records if {"task_loss", "ksvd_loss"} <= set(r.get("scalars", {}))]
  if not logged:
    return None

  def entry(record) -> dict:
    task, ksvd = record["scalars"]["task_loss"], record["scalars"]["ksvd_loss"]
    ratio = eta * ksvd / task if task else math.nan
    return {"step": record["step"], "task_loss": task, "ksvd_loss": ksvd, "eta": eta, "ratio": ratio}

  half = (logged[0]["step"] + logged[-1]["step"]) / 2
  middle = min(logged, key=lambda r: (abs(r["step"] - half), r["step"]))
  return {"start": entry(logged[0]), "middle": entry(middle), "end": entry(logged[-1])}


def validation_curve(records: Sequence[Mapping[str, Any]], metric: str) -> list[list[float]] | None:
  """[[step, value], ...] of validation `metric` (e.g. "accuracy") at every evaluation, in step order: whether a run
  converged (its best evaluation before the last, or a plateau) is read from it.

  `records`: `read_metrics(workdir, dedupe=True, prefix="validation")`. None where no record holds `metric`.
  """
  curve = [[r["step"], r["scalars"][metric]] for r in records if metric in r.get("scalars", {})]
  return sorted(curve) or None


def format_duration(seconds: float) -> str:
  """'42s', '3m12s', '1h05m', '2d03h'."""
  if not math.isfinite(seconds):
    return "?"
  s = max(0, int(round(seconds)))
  if s < 60:
    return f"{s}s"
  if s < 3600:
    return f"{s // 60}m{s % 60:02d}s"
  if s < 86400:
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
  return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _format_value(value) -> str:
  if isinstance(value, (bool, np.bool_)):
    return str(value)
  if isinstance(value, (int, np.integer)):
    return str(int(value))
  if isinstance(value, (float, np.floating)) or (np.size(value) == 1 and np.asarray(value).dtype.kind == "f"):
    return f"{float(value):.4g}"
  return str(value)


class Progress:
  """Periodic one-line progress: `step 120/1700 | loss 1.234 | 512.3 ex/s | ETA 3m12s`.

  `update(step, scalars)` is called after each step with the number of steps completed. A line is
  printed on the first update, then every `log_every_steps` steps (multiples of it) and/or once
  `log_every_seconds` have passed since the previous line, and at `total_steps`. Throughput covers
  the steps since the previous line (the first line's includes compilation); the ETA uses the mean
  step time since the first update, so the first step, which includes compilation, is excluded.
  """

  def __init__(
    self,
    total_steps: int,
    *,
    start_step: int = 0,
    batch_size: int,
    log_every_steps: int | None = None,
    log_every_seconds: float | None = None,
    print_fn: Callable[[str], Any] = print,
    time_fn: Callable[[], float] = time.monotonic,
  ):
    if log_every_steps is None and log_every_seconds is None:
      raise ValueError("Progress needs log_every_steps and/or log_every_seconds, got neither")
    if log_every_steps is not None and log_every_steps < 1:
      raise ValueError(f"log_every_steps must be >= 1, got {log_every_steps}")
    if log_every_seconds is not None and log_every_seconds <= 0:
      raise ValueError(f"log_every_seconds must be > 0, got {log_every_seconds}")
    self.total_steps = int(total_steps)
    self.batch_size = int(batch_size)
    self._every_steps = log_every_steps
    self._every_seconds = log_every_seconds
    self._print = print_fn
    self._time = time_fn
    self._last_step = int(start_step)
    self._last_time = time_fn()
    self._first: tuple[int, float] | None = None  # (step, time) of the first update

  def eta_seconds(self, step: int, now: float) -> float:
    """Remaining time from the mean step time after the first update; inf until it is known."""
    if self._first is None or step <= self._first[0]:
      return math.inf
    per_step = (now - self._first[1]) / (step - self._first[0])
    return per_step * max(0, self.total_steps - step)

  def update(self, step: int, scalars: Mapping[str, Any] | None = None) -> str | None:
    """Prints (and returns) the progress line if one is due at `step`, else returns None."""
    step, now = int(step), self._time()
    first = self._first is None
    if first:
      self._first = (step, now)
    due = first or step >= self.total_steps
    if self._every_steps is not None and step % self._every_steps == 0:
      due = True
    if self._every_seconds is not None and now - self._last_time >= self._every_seconds:
      due = True
    if not due or step == self._last_step:
      return None
    elapsed = now - self._last_time
    rate = (step - self._last_step) * self.batch_size / elapsed if elapsed > 0 else math.inf
    parts = [f"step {step}/{self.total_steps}"]
    parts += [f"{name} {_format_value(value)}" for name, value in (scalars or {}).items()]
    parts += [f"{rate:.1f} ex/s", f"ETA {format_duration(self.eta_seconds(step, now))}"]
    line = " | ".join(parts)
    self._last_step, self._last_time = step, now
    self._print(line)
    return line

  @staticmethod
  def summary_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    return summary_table(rows, columns)


def _is_numeric_column(values) -> bool:
  present = [v for v in values if v is not None]
  return bool(present) and all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in present)


def summary_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
  """A Markdown table with padded, aligned columns (numbers right-aligned), readable as plain text.

  Missing values are blank; floats use 4 significant digits.
  """
  if not columns:
    raise ValueError("summary_table needs at least one column")
  cells = [[_format_value(row[c]) if row.get(c) is not None else "" for c in columns] for row in rows]
  aligns = ["r" if _is_numeric_column([row.get(c) for row in rows]) else "l" for c in columns]
  return markdown.table(list(columns), cells, aligns=aligns, pad=True)


__all__ = ["MetricWriter", "Progress", "format_duration", "read_metrics", "summary_table"]
