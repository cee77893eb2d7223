"""What produced a record: the commit, the exact argv, the date, the platform and the library versions.

Every training summary (`summary.json`, hence every sweep run's `result.json`) and every benchmark record carries
`provenance()`, so a table can say which code, command and machine gave each number. No JAX import at module
level: the benchmarks' process helpers use `git_commit` without starting a backend.

The checkout's commit and state are read once per process (`checkout`, cached): a record names the code the
process loaded, even when the checkout moves on while a long sweep runs. `train_and_evaluate` and
`python -m experiments.sweep` take that snapshot when they start.
"""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent  # git, run here, finds the checkout holding the package (if any)
COMMIT_ENV = "PRIMAL_JAX_COMMIT"  # names the commit of a tree copied without its history (an accelerator host)
LIBRARIES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml-collections")
# The vector extensions XLA:CPU compiles for when the host has them: two hosts that differ in these can round a
# float32 reduction differently, so the same config and seed need not repeat bit for bit across them.
SIMD_FLAGS = (
  "avx",
  "avx2",
  "fma",
  "avx512f",
  "avx512bw",
  "avx512vl",
  "avx512_bf16",
  "avx512_fp16",
  "amx_tile",
  "asimd",
  "sve",
)
CPUINFO = Path("/proc/cpuinfo")


def _git(*args: str) -> str | None:
  try:
    out = subprocess.run(["git", *args], cwd=_PACKAGE, capture_output=True, text=True, timeout=10)
  except (OSError, subprocess.TimeoutExpired):
    return None
  return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str | None:
  """HEAD of the checkout the package runs from, `$PRIMAL_JAX_COMMIT` where set, None outside git."""
  return os.environ.get(COMMIT_ENV) or _git("rev-parse", "HEAD") or None


# Records, not code: a sweep rewrites its own results.md / results.csv after every run, and a record names the code
# that ran, so changes inside a `results` folder (the repository keeps its records in such folders) leave a tree
# clean (before, a sweep's second run was marked dirty).
RECORD_PATHSPEC = ":(top,exclude,glob)**/results/**"


def git_dirty() -> bool | None:
  """Whether tracked files other than records (`RECORD_PATHSPEC`: inside a `results` folder) differ from HEAD (None
  outside git or with `$PRIMAL_JAX_COMMIT`)."""
  if os.environ.get(COMMIT_ENV):
    return None
  status = _git("status", "--porcelain", "--untracked-files=no", "--", ":(top)", RECORD_PATHSPEC)
  return None if status is None else bool(status)


@functools.cache
def checkout() -> tuple[str | None, bool | None]:
  """(commit, dirty) of the checkout, read at this process's first call and kept (see the module doc)."""
  return git_commit(), git_dirty()


def library_versions(names: tuple[str, ...] = LIBRARIES) -> dict[str, str | None]:
  """Installed distribution versions (None where one is not installed), plus Python's and primal_jax's."""
  versions: dict[str, str | None] = {"python": platform.python_version()}
  for name in ("primal_jax", *names):
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      versions[name] = None
  return versions


def device_summary() -> dict:
  """The JAX platform, device kind and count, and the default matmul precision (imports JAX). The precision is
  what decides float32 against TF32 / bf16 passes on a GPU (`JAX_DEFAULT_MATMUL_PRECISION`); None: the
  platform's default."""
  import jax

  device = jax.devices()[0]
  precision = jax.config.jax_default_matmul_precision
  return {
    "platform": device.platform,
    "kind": device.device_kind,
    "count": jax.device_count(),
    "matmul_precision": None if precision is None else str(precision),
  }


def cores() -> int | None:
  """The cores this process may run on (its affinity: `taskset` pins a run below the host's `cpus`)."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def parse_cpuinfo(text: str) -> dict:
  """The first processor of a Linux /proc/cpuinfo: vendor, model name, family and model numbers, and which of
  `SIMD_FLAGS` it has (x86 `flags`, Arm `Features`); a field the text lacks is None."""
  fields: dict[str, str] = {}
  for line in text.splitlines():
    if not line.strip():
      if fields:
        break  # the first processor's block has ended
      continue
    key, _, value = line.partition(":")
    fields.setdefault(key.strip(), value.strip())
  flags = set((fields.get("flags") or fields.get("Features") or "").split())

  def number(key: str) -> int | None:
    value = fields.get(key, "")
    return int(value, 0) if value.isdigit() or value.startswith("0x") else None

  return {
    "vendor": fields.get("vendor_id") or fields.get("CPU implementer"),
    "model_name": fields.get("model name"),
    "family": number("cpu family"),
    "model": number("model") if "model" in fields else number("CPU part"),
    "simd": [flag for flag in SIMD_FLAGS if flag in flags],
  }


@functools.cache
def cpu() -> dict:
  """This host's CPU (`parse_cpuinfo` of /proc/cpuinfo; elsewhere only `platform.processor()` as model_name)."""
  try:
    return parse_cpuinfo(CPUINFO.read_text())
  except OSError:
    return {"vendor": None, "model_name": platform.processor() or None, "family": None, "model": None, "simd": []}


def provenance(argv: list[str] | None = None, *, devices: bool = True) -> dict:
  """The record's origin: commit and whether the tree was dirty (the process's `checkout` snapshot), argv
  (`sys.argv` unless given), UTC date, host (its CPU too: `cpu`), devices (`devices=False` leaves JAX
  unimported), library versions."""
  commit, dirty = checkout()
  record = {
    "commit": commit,
    "dirty": dirty,
    "argv": list(sys.argv if argv is None else argv),
    "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "host": {
      "system": platform.system(),
      "machine": platform.machine(),
      "cpus": os.cpu_count(),
      "cores": cores(),
      "cpu": cpu(),
    },
    "versions": library_versions(),
  }
  if devices:
    record["devices"] = device_summary()
  return record
