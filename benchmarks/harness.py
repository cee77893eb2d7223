"""Measurement helpers of the efficiency benchmark (`benchmarks/efficiency.py`, the paper's Table 3).

Separate from the script, so they are importable and tested on their own:
XLA's FLOP and memory accounting of a compiled step, process and device memory, interleaved timing,
the machine's matmul peak, log-log scaling fits, the Markdown tables (ratios against a reference
variant), JSON persistence and the scaling plot.

A result is a dict {"meta": {...}, "matmul_peak": {...}, "records": [record, ...]} where a record
describes one (variant, sequence length) pair: "variant", "seq_len", "sec_per_1k_steps",
"flops_per_step", "xla_memory" (see `compiled_memory`), optionally "rss", "device_memory",
"achieved_flops_per_s", "peak_fraction" and "error".
"""

from __future__ import annotations

import json
import math
import resource
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

MIB = 2**20


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


# ---------------------------------------------------------------------------------------------------------------------
# Process and device memory.


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


def roofline(flops_per_step: float | None, sec_per_step: float | None, peak_flops_per_s: float | None) -> dict:
  """Achieved FLOP/s of a step and its fraction of the measured matmul peak (None where unknown)."""
  if not flops_per_step or not sec_per_step:
    return {"achieved_flops_per_s": None, "peak_fraction": None}
  achieved = flops_per_step / sec_per_step
  return {"achieved_flops_per_s": achieved, "peak_fraction": achieved / peak_flops_per_s if peak_flops_per_s else None}


# ---------------------------------------------------------------------------------------------------------------------
# Scaling fits and tables.


def fit_loglog_slope(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
  """(slope, intercept) of the least-squares line log(y) = slope * log(x) + intercept.

  The slope is the empirical exponent of y ~ x^slope: ~1 for linear-cost attention, ~2 for softmax once
  the N^2 terms dominate.
  """
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if x.shape != y.shape or x.ndim != 1:
    raise ValueError(f"x and y must be 1-D of equal length, got shapes {x.shape} and {y.shape}")
  if len(x) < 2 or len(np.unique(x)) < 2:
    raise ValueError("a slope needs at least two distinct x values")
  if np.any(x <= 0) or np.any(y <= 0):
    raise ValueError("log-log fits need positive x and y")
  slope, intercept = np.polyfit(np.log(x), np.log(y), 1)
  return float(slope), float(intercept)


def metric_value(record: Mapping[str, Any], path: str) -> float | None:
  """The record's value at a dotted `path` ("xla_memory.total_bytes"), or None if missing."""
  value: Any = record
  for key in path.split("."):
    if not isinstance(value, Mapping) or value.get(key) is None:
      return None
    value = value[key]
  return float(value)


def scaling_slopes(records: Sequence[Mapping[str, Any]], path: str) -> dict[str, float | None]:
  """{variant: log-log slope of `path` against seq_len} (None with fewer than two lengths)."""
  points: dict[str, list[tuple[float, float]]] = {}
  for rec in records:
    value = metric_value(rec, path)
    points.setdefault(rec["variant"], [])
    if value is not None and value > 0:
      points[rec["variant"]].append((rec["seq_len"], value))
  slopes = {}
  for variant, pts in points.items():
    xs = [p[0] for p in pts]
    slopes[variant] = fit_loglog_slope(xs, [p[1] for p in pts])[0] if len(set(xs)) >= 2 else None
  return slopes


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  lines = [
    "| " + " | ".join(header) + " |",
    "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|",
  ]
  lines += ["| " + " | ".join(row) + " |" for row in rows]
  return "\n".join(lines)


def ratio_table(
  records: Sequence[Mapping[str, Any]],
  path: str,
  *,
  reference: str,
  scale: float = 1.0,
  digits: int = 2,
) -> str:
  """Markdown table: a row per variant, a column per seq_len, "value (ratio x)" against `reference`.

  The ratio divides by the reference variant's value at the same length (the paper's Table 3 reports
  time and memory relative to the softmax Transformer); "-" where a variant was not run or failed, and
  no ratio where the reference is missing. The last column is the log-log slope over the lengths run.
  """
  lengths = sorted({rec["seq_len"] for rec in records})
  variants = list(dict.fromkeys(rec["variant"] for rec in records))
  table = {(rec["variant"], rec["seq_len"]): metric_value(rec, path) for rec in records}
  slopes = scaling_slopes(records, path)
  rows = []
  for variant in variants:
    row = [variant]
    for n in lengths:
      value, ref = table.get((variant, n)), table.get((reference, n))
      if value is None:
        row.append("-")
        continue
      cell = f"{value / scale:.{digits}f}"
      if ref:
        cell += f" ({value / ref:.2f}x)"
      row.append(cell)
    slope = slopes.get(variant)
    row.append("-" if slope is None else f"{slope:.2f}")
    rows.append(row)
  return _markdown(["variant", *[f"N={n}" for n in lengths], "slope"], rows)


def roofline_table(records: Sequence[Mapping[str, Any]]) -> str:
  """Markdown table of GFLOP per step, achieved GFLOP/s and % of the measured matmul peak."""
  order = {name: i for i, name in enumerate(dict.fromkeys(r["variant"] for r in records))}
  rows = []
  for rec in sorted(records, key=lambda r: (r["seq_len"], order[r["variant"]])):
    flops, achieved, frac = (metric_value(rec, k) for k in ("flops_per_step", "achieved_flops_per_s", "peak_fraction"))
    rows.append(
      [
        rec["variant"],
        str(rec["seq_len"]),
        "-" if flops is None else f"{flops / 1e9:.3f}",
        "-" if achieved is None else f"{achieved / 1e9:.2f}",
        "-" if frac is None else f"{100 * frac:.1f}%",
      ]
    )
  return _markdown(["variant", "N", "GFLOP/step", "GFLOP/s", "% of matmul peak"], rows)


# Table sections of `results_markdown`: (title, record path, divisor for display, digits).
TABLE_METRICS = (
  ("Training time (seconds per 1,000 steps)", "sec_per_1k_steps", 1.0, 2),
  ("XLA memory of the step (MiB: arguments + outputs + temporaries - aliased)", "xla_memory.total_bytes", MIB, 1),
  ("XLA temporaries of the step (MiB)", "xla_memory.temp_bytes", MIB, 1),
  ("Peak RSS growth of a fresh process (MiB, peak - baseline after imports)", "rss.peak_delta_bytes", MIB, 1),
  ("Peak RSS growth during steps only (MiB, VmHWM reset after compiling)", "rss.step_delta_bytes", MIB, 1),
  ("Device peak bytes in use (MiB, allocator statistics)", "device_memory.peak_bytes_in_use", MIB, 1),
)


def results_markdown(results: Mapping[str, Any], *, reference: str) -> str:
  """All tables of a result (sections with no data are left out), ratios against `reference`."""
  records = [r for r in results["records"] if not r.get("error")]
  parts = []
  for title, path, scale, digits in TABLE_METRICS:
    if any(metric_value(r, path) is not None for r in records):
      parts.append(f"### {title}\n\nRatio in parentheses: vs `{reference}` at the same N. Slope: log-log fit over N.\n")
      parts.append(ratio_table(records, path, reference=reference, scale=scale, digits=digits) + "\n")
  if any(metric_value(r, "flops_per_step") is not None for r in records):
    peak = results.get("matmul_peak") or {}
    peak_note = (
      f" Matmul peak: {peak['flops_per_s'] / 1e9:.1f} GFLOP/s ({peak['size']}^3 {peak['dtype']})." if peak else ""
    )
    parts.append(
      "### Roofline (FLOPs from XLA's cost analysis)\n\n"
      f"Achieved FLOP/s = FLOPs per step / median step time.{peak_note}\n"
    )
    parts.append(roofline_table(records) + "\n")
  failed = [r for r in results["records"] if r.get("error")]
  if failed:
    parts.append("### Failed\n")
    parts.append(_markdown(["variant", "N", "error"], [[r["variant"], str(r["seq_len"]), r["error"]] for r in failed]))
  return "\n".join(parts)


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


def load_results(path: str | Path) -> dict[str, Any]:
  return json.loads(Path(path).read_text())


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
