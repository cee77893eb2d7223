"""What the benchmarks measure with JAX: XLA's FLOP and memory accounting of a compiled step, device memory,
interleaved timing, the machine's matmul peak and triad bandwidth, the roofline, JSON persistence and the scaling
plot. Process memory and load are in `benchmarks.harness.process` (stdlib only); the Markdown tables of the
results in `experiments.tables.efficiency`.

A result is a dict {"meta": {...}, "matmul_peak": {...}, "records": [record, ...]} where a record
describes one (variant, sequence length) pair: "variant", "seq_len", "sec_per_1k_steps",
"flops_per_step", "xla_memory" (see `compiled_memory`), optionally "rss", "device_memory",
"achieved_flops_per_s", "peak_fraction" and "error".
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from experiments.tables.efficiency import MIB, metric_value, scaling_slopes

# ---------------------------------------------------------------------------------------------------------------------
# XLA's static accounting of a compiled computation.


def compiled_flops(compiled) -> float | None:
  """FLOPs of one call of a `jax.stages.Compiled`, from XLA's cost analysis (None if it reports none).

  jax 0.10 returns one dict; older versions returned a list with one dict per partition, summed here.
  XLA counts 2*m*n*k for a matmul and one FLOP per element for elementwise ops; loops count one trip.
  """
  costs = compiled.cost_analysis()
  if costs is None:
    return None
  if isinstance(costs, Mapping):
    costs = [costs]
  values = [float(c["flops"]) for c in costs if c and "flops" in c]
  return sum(values) if values else None


def compiled_memory(compiled) -> dict[str, int]:
  """Buffer sizes (bytes) XLA assigned to a compiled computation (`compiled.memory_analysis()`).

  "total_bytes" = arguments + outputs + temporaries - aliased (donated arguments reused as outputs are
  counted once): the device memory the call needs beyond code. "peak_bytes" is XLA's own peak estimate
  where the backend reports one (GPU/TPU; absent on CPU).
  """
  stats = compiled.memory_analysis()
  if stats is None:
    return {}
  out = {
    name: int(getattr(stats, f"{name}_size_in_bytes", 0) or 0)
    for name in ("argument", "output", "temp", "alias", "generated_code")
  }
  out = {f"{k}_bytes": v for k, v in out.items()}
  out["total_bytes"] = out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"] - out["alias_bytes"]
  peak = getattr(stats, "peak_memory_in_bytes", None)
  if peak:
    out["peak_bytes"] = int(peak)
  return out


def jit_flops(fn: Callable, *args) -> float | None:
  """FLOPs of `jax.jit(fn)(*args)` as XLA counts them (compiles, does not run)."""
  return compiled_flops(jax.jit(fn).lower(*args).compile())


def device_memory(device: jax.Device | None = None) -> dict[str, int] | None:
  """The allocator's counters of `device` ("peak_bytes_in_use", "bytes_in_use", "bytes_limit"); None on CPU."""
  device = device or jax.devices()[0]
  try:
    stats = device.memory_stats()
  except Exception:  # some backends raise instead of returning None
    return None
  if not stats:
    return None
  keys = ("peak_bytes_in_use", "bytes_in_use", "bytes_limit", "largest_alloc_size")
  return {k: int(stats[k]) for k in keys if k in stats}


# ---------------------------------------------------------------------------------------------------------------------
# Timing.


def timed_steps(step: Callable, state, batch, steps: int) -> tuple[Any, Any, float]:
  """Run `state, out = step(state, batch)` `steps` times; (state, last out, seconds).

  Dispatch is asynchronous, so the clock stops only after `block_until_ready` on the final state and
  outputs; the input state is made ready first so earlier work is not billed to this call.
  """
  if steps < 1:
    raise ValueError(f"steps must be >= 1, got {steps}")
  jax.block_until_ready(state)
  out = None
  start = time.perf_counter()
  for _ in range(steps):
    state, out = step(state, batch)
  jax.block_until_ready((state, out))
  return state, out, time.perf_counter() - start


def interleaved_timings(runners: Mapping[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
  """{name: [seconds of each repeat]}, every runner called once per repeat.

  Repeat r calls every runner once, starting with runner r mod V, so slow drift of the machine (thermal
  state, other jobs) spreads over all variants instead of biasing whichever ran last; take the median.
  """
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")
  names = list(runners)
  times: dict[str, list[float]] = {name: [] for name in names}
  for r in range(repeats):
    offset = r % len(names) if names else 0
    for name in names[offset:] + names[:offset]:
      times[name].append(float(runners[name]()))
  return times


def call_seconds(fn: Callable, *args, repeats: int) -> list[float]:
  """Wall seconds of `repeats` calls of `fn(*args)`, each waited for, after one untimed warm-up call."""
  jax.block_until_ready(fn(*args))
  samples = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    samples.append(time.perf_counter() - start)
  return samples


def measure_matmul_peak(
  size: int = 2048, repeats: int = 5, dtype=jnp.float32, device: jax.Device | None = None
) -> dict[str, Any]:
  """The machine's achievable matmul throughput: median FLOP/s of a jitted [size, size] @ [size, size].

  The roofline reference of the benchmark (the model's own matmuls run at the same default precision,
  e.g. TF32 for float32 on recent NVIDIA GPUs). FLOPs are XLA's count (2 * size^3).
  """
  device = device or jax.devices()[0]
  keys = jax.random.split(jax.random.PRNGKey(0), 2)
  a, b = (jax.device_put(jax.random.normal(k, (size, size), dtype), device) for k in keys)
  compiled = jax.jit(jnp.matmul).lower(a, b).compile()
  flops = 2.0 * size**3  # by definition; XLA's cost analysis counts extra on some platforms (GPU: +2.7% at 128)
  samples = call_seconds(compiled, a, b, repeats=repeats)
  seconds = statistics.median(samples)
  return {
    "size": size,
    "dtype": jnp.dtype(dtype).name,
    "flops": flops,
    "seconds": samples,
    "median_seconds": seconds,
    "flops_per_s": flops / seconds,
  }


def triad_bandwidth(elements: int, repeats: int = 20, *, in_place: bool = False) -> float:
  """Best bytes per second of a jitted triad `a * 2 + b` over float32 arrays of `elements` (3 arrays moved).

  `in_place`: `a` is donated and overwritten (a <- 2 a + b, as STREAM does), so no call allocates its output.
  A fresh output per call costs XLA:CPU a mapping and its first-touch page faults under glibc malloc, which on
  a busy machine measure the allocator more than the memory; a step that updates donated buffers (a decoding
  cache) is bounded by the in-place figure.
  """
  a, b = jnp.ones((elements,), jnp.float32), jnp.full((elements,), 2.0, jnp.float32)
  if not in_place:
    seconds = call_seconds(jax.jit(lambda a, b: a * 2.0 + b), a, b, repeats=repeats)
  else:
    triad = jax.jit(lambda a, b: a * 2.0 + b, donate_argnums=0)
    a = jax.block_until_ready(triad(a, b))  # compile and warm up
    seconds = []
    for _ in range(repeats):
      start = time.perf_counter()
      a = jax.block_until_ready(triad(a, b))
      seconds.append(time.perf_counter() - start)
  return 3 * 4 * elements / min(seconds)  # the best repeat: what the memory system can deliver


def read_bandwidth(elements: int, repeats: int = 20) -> dict[str, float]:
  """Best bytes per second of read-only streams over `elements` float32 (one array read, nothing written back).

  A decode step only reads its cache, so a triad (two reads and a write per element) is not its pattern: this is
  what reading alone reaches here, by four programs (the best is the bound): XLA's full `sum`, XLA's [1, 64] x
  [64, elements / 64] product (the decode contraction's shape) and, where JAX runs on the host CPU, NumPy's `sum`
  (one thread) and its BLAS matrix-vector product [elements / 64, 64] x [64] (BLAS's threads). Returns each rate
  and `best`. One buffer is alive at a time (each program's own), so a stream as large as a decode step's state
  fits where that state did.
  """
  if elements < 64 or elements % 64:
    raise ValueError(f"elements must be a positive multiple of 64 (the product's rows), got {elements}")

  def xla_sum():
    x = jnp.ones((elements,), jnp.float32)
    return 4 * elements / min(call_seconds(jax.jit(jnp.sum), x, repeats=repeats))

  def xla_gemv():
    keys, query = jnp.ones((64, elements // 64), jnp.float32), jnp.ones((1, 64), jnp.float32)
    return 4 * elements / min(call_seconds(jax.jit(jnp.matmul), query, keys, repeats=repeats))

  def numpy_sum():
    host = np.ones((elements,), np.float32)
    return 4 * elements / min(call_seconds(host.sum, repeats=repeats))  # its warm-up call touches every page

  def blas_gemv():
    rows, vector = np.ones((elements // 64, 64), np.float32), np.ones((64,), np.float32)
    return 4 * elements / min(call_seconds(lambda: rows @ vector, repeats=repeats))

  programs = {"xla_sum": xla_sum, "xla_gemv": xla_gemv}
  if jax.devices()[0].platform == "cpu":  # NumPy reads host memory, not the device's
    programs |= {"numpy_sum": numpy_sum, "blas_gemv": blas_gemv}
  rates = {name: program() for name, program in programs.items()}  # each frees its buffer on return
  return {**rates, "best": max(rates.values())}


def read_bandwidth_at(nbytes: int, repeats: int = 5) -> dict[str, float]:
  """`read_bandwidth` over a buffer of `nbytes` (rounded down to whole [64] float32 rows, at least one): what
  reading a working set of that size reaches. The rate falls where the set outgrows a cache level, so a step that
  reads its state again at every token is bounded by the rate at its own size, not by a smaller stream's."""
  if nbytes < 4 * 64:
    raise ValueError(f"nbytes must be at least 256 (one row of 64 float32), got {nbytes}")
  return read_bandwidth(nbytes // (4 * 64) * 64, repeats=repeats)


def one_thread_bandwidth(elements: int, repeats: int = 20) -> float:
  """Best bytes per second of NumPy's `a <- b + c` over float32 arrays of `elements` (3 arrays moved): the memory
  bandwidth one thread reaches (a NumPy ufunc runs on the calling thread), the bound of a step XLA runs on one."""
  a, b, c = (np.full((elements,), v, np.float32) for v in (0.0, 1.0, 2.0))
  np.add(b, c, out=a)  # touch every page first
  seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    np.add(b, c, out=a)
    seconds.append(time.perf_counter() - start)
  return 3 * 4 * elements / min(seconds)


def roofline(flops_per_step: float | None, sec_per_step: float | None, peak_flops_per_s: float | None) -> dict:
  """Achieved FLOP/s of a step and its fraction of the measured matmul peak (None where unknown)."""
  if not flops_per_step or not sec_per_step:
    return {"achieved_flops_per_s": None, "peak_fraction": None}
  achieved = flops_per_step / sec_per_step
  return {"achieved_flops_per_s": achieved, "peak_fraction": achieved / peak_flops_per_s if peak_flops_per_s else None}


# ---------------------------------------------------------------------------------------------------------------------
# Persistence and plot.


def save_results(path: str | Path, results: Mapping[str, Any]) -> Path:
  """Write `results` as indented JSON (non-finite floats become null so the file stays valid JSON)."""

  def clean(value):
    if isinstance(value, float) and not math.isfinite(value):
      return None
    if isinstance(value, Mapping):
      return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
      return [clean(v) for v in value]
    if isinstance(value, np.generic):
      return clean(value.item())
    return value

  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(clean(results), indent=1) + "\n")
  return path


# Panels of `plot_scaling`: (record path, y label, divisor).
PLOT_METRICS = (
  ("sec_per_1k_steps", "seconds / 1,000 steps", 1.0),
  ("xla_memory.total_bytes", "XLA step memory (MiB)", MIB),
  ("rss.peak_delta_bytes", "peak RSS growth (MiB)", MIB),
  ("device_memory.peak_bytes_in_use", "device peak in use (MiB)", MIB),
)


def plot_scaling(
  results: Mapping[str, Any], path: str | Path, *, title: str = "", metrics=PLOT_METRICS,
  xlabel: str = "sequence length N",
) -> Path:  # fmt: skip
  """Log-log PNG of time and memory against N, a line per variant with its fitted slope in the legend.

  Uses matplotlib's object API (no pyplot), so it neither needs a display nor touches global state.
  Panels with no data are left out.
  """
  from matplotlib.figure import Figure

  records = [r for r in results["records"] if not r.get("error")]
  panels = [m for m in metrics if any(metric_value(r, m[0]) is not None for r in records)]
  variants = list(dict.fromkeys(r["variant"] for r in records))
  fig = Figure(figsize=(6 * max(len(panels), 1), 4.8), layout="constrained")
  axes = fig.subplots(1, max(len(panels), 1), squeeze=False)[0]
  for ax, (metric, label, scale) in zip(axes, panels, strict=False):
    slopes = scaling_slopes(records, metric)
    for variant in variants:
      pts = sorted(
        (r["seq_len"], metric_value(r, metric)) for r in records if r["variant"] == variant and metric_value(r, metric)
      )
      if not pts:
        continue
      slope = slopes.get(variant)
      legend = f"{variant} (slope {slope:.2f})" if slope is not None else variant
      ax.plot([p[0] for p in pts], [p[1] / scale for p in pts], marker="o", label=legend)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(label)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
  if title:
    fig.suptitle(title, fontsize=9)
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  return path
