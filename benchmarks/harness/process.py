"""Stdlib-only measuring of the process and the machine: memory, load, allocator, threads.

Used by every benchmark, and by both sides of `benchmarks/vs_release.py`.

Why stdlib only: the release's side runs in a separate interpreter (a venv with torch and no JAX), so what
both sides measure with must import nothing but the standard library. What it measures:

- the CPU time that *other* processes used while one step ran (the machine's busy time from /proc/stat minus
  this process's own CPU time), so a step timed on a contended machine says so in the results;
- the process's resident memory (now, its peak (VmHWM), a reset of the peak) and which malloc is mapped into it
  (the same probe as `primal_jax.launch.host_allocator.loaded_allocator`, here without importing the library);
- the thread setup both sides share: the process pinned to the same cores (XLA's CPU runtime sizes its
  intra-op pool from the affinity mask), and the OpenMP/MKL environment torch reads.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

# /proc/stat "cpu" columns counted as busy: user nice system idle iowait irq softirq steal (guest is in user).
_BUSY = (0, 1, 2, 5, 6, 7)
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def machine_busy_seconds(stat_path: str | Path = "/proc/stat") -> float | None:
  """CPU-seconds every process on the machine has been busy since boot (None where /proc/stat is missing)."""
  try:
    fields = Path(stat_path).read_text().splitlines()[0].split()
  except (OSError, IndexError):
    return None
  if not fields or fields[0] != "cpu":
    return None
  ticks = [int(v) for v in fields[1:]]
  return sum(ticks[i] for i in _BUSY if i < len(ticks)) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
  """CPU-seconds of this process, all its threads (XLA's and torch's pools included), user + system."""
  times = os.times()
  return times.user + times.system


def timed_with_load(fn: Callable[[], object]) -> dict:
  """Run `fn()` once; {"seconds", "other_cores", "own_cores", "loadavg_1m"}.

  other_cores: the average number of cores that processes other than this one kept busy during the call
  ((machine busy time - own CPU time) / wall time; None without /proc/stat). At /proc/stat's 10 ms
  resolution it is noisy for calls under ~100 ms; a quiet machine reads close to 0.
  """
  busy0, own0 = machine_busy_seconds(), own_cpu_seconds()
  start = time.perf_counter()
  fn()
  seconds = time.perf_counter() - start
  busy1, own1 = machine_busy_seconds(), own_cpu_seconds()
  own = own1 - own0
  other = None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0) - own) / seconds
  return {
    "seconds": seconds,
    "other_cores": other,
    "own_cores": own / seconds,
    "loadavg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
  }


def ru_maxrss_bytes() -> int:
  """`getrusage(RUSAGE_SELF).ru_maxrss` in bytes (the kernel reports KiB on Linux, bytes on macOS).

  On Linux it is the maximum of this process's own peak and the peak of the process image it replaced
  at exec: a child forked from a large process inherits the parent's peak (`subprocess` forks, then
  execs). Prefer `peak_rss_bytes`, which avoids that where it can.
  """
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def peak_rss_bytes() -> int:
  """Peak resident set size of this process image: VmHWM where /proc has it, else `ru_maxrss_bytes`.

  VmHWM starts afresh at exec, so it measures a subprocess on its own (see `ru_maxrss_bytes`); it is
  lowered by `reset_rss_high_water`.
  """
  high_water = rss_high_water_bytes()
  return high_water if high_water is not None else ru_maxrss_bytes()


def _proc_status_bytes(field: str) -> int | None:
  try:
    for line in Path("/proc/self/status").read_text().splitlines():
      if line.startswith(field + ":"):
        return int(line.split()[1]) * 1024  # "VmHWM:   123 kB"
  except (OSError, ValueError, IndexError):
    return None
  return None


def current_rss_bytes() -> int | None:
  """Resident set size now (Linux /proc; None elsewhere)."""
  return _proc_status_bytes("VmRSS")


def rss_high_water_bytes() -> int | None:
  """Peak RSS since the process started or since the last `reset_rss_high_water` (Linux; None elsewhere)."""
  return _proc_status_bytes("VmHWM")


def reset_rss_high_water() -> bool:
  """Reset the kernel's RSS high-water mark to the current RSS (Linux >= 4.0: "5" > /proc/self/clear_refs).

  Without a reset the peak includes compilation (LLVM's memory on CPU); a reset after compiling lets
  `rss_high_water_bytes` isolate the steps themselves. False where unsupported.
  """
  try:
    Path("/proc/self/clear_refs").write_text("5")
  except OSError:
    return False
  return True


def mapped_allocator(maps_path: str | Path = "/proc/self/maps") -> str:
  """ "tcmalloc", "jemalloc" or "system": the malloc mapped into this process (as `host_allocator` reports)."""
  try:
    maps = Path(maps_path).read_text()
  except OSError:
    return "system"
  for name in ("tcmalloc", "jemalloc"):
    if f"lib{name}" in maps:
      return name
  return "system"


def pin_threads(threads: int) -> list[int]:
  """Pin this process to its first `threads` allowed cores and set the OpenMP/MKL thread variables.

  Call before importing torch or JAX: XLA:CPU sizes its Eigen pool from the affinity mask at client start
  and OpenMP reads its variable once. Returns the cores pinned to (all allowed ones where affinity is not
  available).
  """
  for name in THREAD_ENV:
    os.environ[name] = str(threads)
  if not hasattr(os, "sched_setaffinity"):
    return list(range(threads))
  allowed = sorted(os.sched_getaffinity(0))
  if threads > len(allowed):
    raise ValueError(f"asked for {threads} threads, this process may run on {len(allowed)} cores ({allowed})")
  cores = allowed[:threads]
  os.sched_setaffinity(0, cores)
  return cores


def thread_count() -> int | None:
  """Threads of this process now (Linux /proc/self/task)."""
  try:
    return len(os.listdir("/proc/self/task"))
  except OSError:
    return None
