"""The efficiency benchmark's records (benchmarks/efficiency.py, `efficiency.json`) as Markdown: ratio tables against
a reference variant, log-log slopes, the roofline, and the docs table `benchmark:<dir>`.

A result is a dict {"meta": {...}, "matmul_peak": {...}, "records": [record, ...]} where a record
describes one (variant, sequence length) pair: "variant", "seq_len", "sec_per_1k_steps",
"flops_per_step", "xla_memory", optionally "rss", "device_memory", "achieved_flops_per_s",
"peak_fraction" and "error".
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments.tables.common import BENCHMARK_RESULTS, link
from primal_jax import markdown
from primal_jax.dotted import get_dotted

MIB = 2**20


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
  value = get_dotted(record, path)
  return None if value is None else float(value)


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
    row.append("-" if slope is None else markdown.fixed(slope))
    rows.append(row)
  return markdown.table(["variant", *[f"N={n}" for n in lengths], "slope"], rows)


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
  return markdown.table(["variant", "N", "GFLOP/step", "GFLOP/s", "% of matmul peak"], rows)


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
    parts.append(
      markdown.table(["variant", "N", "error"], [[r["variant"], str(r["seq_len"]), r["error"]] for r in failed])
    )
  return "\n".join(parts)


def load_results(path: str | Path) -> dict[str, Any]:
  return json.loads(Path(path).read_text())


def _seconds(value: float) -> str:
  return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


NOT_RUN = {"memory": "over memory budget", "time": "over time budget"}


def _commit(meta: dict) -> str:
  """The commit a record names (its first 9 hex digits), or that it names none."""
  commit = meta.get("git_commit")
  return f"commit {commit[:9]}" if commit else "no commit recorded"


def docs_table(name: str, base: Path) -> str:
  """The docs table `benchmark:<dir>`: seconds per 1,000 steps, memory and slopes of benchmarks/results/<dir>/."""
  folder = BENCHMARK_RESULTS / name
  results = load_results(folder / "efficiency.json")
  meta, reference = results["meta"], results["meta"].get("reference", "softmax")
  records = [r for r in results["records"] if not r.get("error")]
  # A (variant, N) the run could not time is a cell saying why (efficiency.py's budgets), never a gap.
  failed = {(r["variant"], r["seq_len"]): r.get("not_run", "failed") for r in results["records"] if r.get("error")}
  lengths = sorted({r["seq_len"] for r in results["records"]})
  variants = list(dict.fromkeys(r["variant"] for r in results["records"]))
  # Memory at the longest N that every variant ran, so the column compares like with like.
  shared = [n for n in lengths if all(any(r["seq_len"] == n and r["variant"] == v for r in records) for v in variants)]
  mem_n = max(shared or lengths)
  value = {(r["variant"], r["seq_len"]): r for r in records}
  time_slopes = scaling_slopes(records, "sec_per_1k_steps")
  memory_slopes = scaling_slopes(records, "xla_memory.total_bytes")

  def ratio(variant: str, n: int, path: str) -> str:
    ref = value.get((reference, n))
    mine = metric_value(value[variant, n], path)
    ref_value = None if ref is None or variant == reference else metric_value(ref, path)
    return f" ({mine / ref_value:.2f}x)" if ref_value else ""

  body = []
  for variant in variants:
    row = [variant]
    for n in lengths:
      rec = value.get((variant, n))
      if rec is not None:
        row.append(_seconds(rec["sec_per_1k_steps"]) + ratio(variant, n, "sec_per_1k_steps"))
      else:
        not_run = failed.get((variant, n))
        row.append(NOT_RUN.get(not_run, "failed") if not_run else "-")
    rec = value.get((variant, mem_n))
    mem = None if rec is None else metric_value(rec, "xla_memory.total_bytes")
    row.append("-" if mem is None else f"{mem / MIB:,.0f}" + ratio(variant, mem_n, "xla_memory.total_bytes"))
    slopes = (time_slopes.get(variant), memory_slopes.get(variant))
    row.append(" / ".join("-" if s is None else markdown.fixed(s) for s in slopes))
    body.append(row)
  header = ["variant", *(f"N={n}" for n in lengths), f"XLA MiB, N={mem_n}", "slope: time / memory"]
  args = meta["args"]
  ratios = f" (ratio to `{reference}`)" if reference in variants else ""
  caption = (
    f"Seconds per 1,000 training steps{ratios}; {meta['device_kind']} ({meta['platform']}), "
    f"{meta.get('cpu_count', '?')} CPUs, host allocator {meta.get('allocator', 'system')}, {args['steps']} timed "
    f"steps x {args['repeats']} repeats, batch {args['batch_size']}, {meta['date'][:10]}, "
    f"{_commit(meta)}; {link(folder / 'efficiency.md', base, 'all tables')}."
  )
  return markdown.table(header, body) + "\n\n" + caption


def relative_table(results: Mapping[str, Any], reference: str) -> str:
  """Markdown: one row per (variant, N) that `reference` also ran, with its time, XLA memory and FLOPs per step as
  ratios to `reference` at the same N, and both steps' fraction of the matmul peak measured in the same process (the
  bound): a time ratio above the FLOP ratio is work done further from the bound, not more work."""
  records = [r for r in results["records"] if not r.get("error")]
  ref = {r["seq_len"]: r for r in records if r["variant"] == reference}
  if not ref:
    found = sorted({r["variant"] for r in records})
    raise ValueError(f"reference {reference!r} has no successful record; variants: {', '.join(found)}")

  def ratio(rec: Mapping[str, Any], path: str, scale: float, digits: int) -> str:
    mine, theirs = metric_value(rec, path), metric_value(ref[rec["seq_len"]], path)
    if mine is None:
      return "-"
    return f"{mine / scale:,.{digits}f}" + (f" ({mine / theirs:.2f}x)" if theirs else "")

  def peak(rec: Mapping[str, Any]) -> str:
    mine, theirs = (metric_value(r, "peak_fraction") for r in (rec, ref[rec["seq_len"]]))
    return "-" if mine is None else f"{100 * mine:.1f}%" + ("" if theirs is None else f" ({100 * theirs:.1f}%)")

  order = {name: i for i, name in enumerate(dict.fromkeys(r["variant"] for r in records))}
  rows = [
    [
      rec["variant"],
      str(rec["seq_len"]),
      ratio(rec, "sec_per_1k_steps", 1.0, 0),
      ratio(rec, "xla_memory.total_bytes", MIB, 0),
      ratio(rec, "flops_per_step", 1e9, 2),
      peak(rec),
    ]
    for rec in sorted(records, key=lambda r: (order[r["variant"]], r["seq_len"]))
    if rec["variant"] != reference and rec["seq_len"] in ref
  ]
  header = [
    "variant", "N", f"s / 1k steps (x `{reference}`)", f"XLA MiB (x `{reference}`)",
    f"GFLOP / step (x `{reference}`)", f"% of matmul peak (`{reference}`'s)",
  ]  # fmt: skip
  return markdown.table(header, rows)


def docs_relative_table(arg: str, base: Path) -> str:
  """The docs table `benchmark_vs:<dir>:<variant>`: `relative_table` of benchmarks/results/<dir>/ against <variant>."""
  name, sep, reference = arg.rpartition(":")
  if not sep or not name or not reference:
    raise ValueError(f"benchmark_vs takes <dir>:<reference variant>, got {arg!r}")
  folder = BENCHMARK_RESULTS / name
  results = load_results(folder / "efficiency.json")
  meta, peak = results["meta"], results["matmul_peak"]
  caption = (
    f"Ratios to `{reference}` at the same N, measured in the same process with the variants interleaved; the matmul "
    f"peak of that process: {peak['flops_per_s'] / 1e9:.1f} GFLOP/s ({peak['size']}^3 {peak['dtype']}); "
    f"{meta['device_kind']} ({meta['platform']}), {meta['args']['steps']} timed steps x {meta['args']['repeats']} "
    f"repeats, batch {meta['args']['batch_size']}, {meta['date'][:10]}, {_commit(meta)}; "
    f"{link(folder / 'efficiency.md', base, 'all tables')}."
  )
  return relative_table(results, reference) + "\n\n" + caption
