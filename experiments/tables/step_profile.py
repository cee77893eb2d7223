"""The records of benchmarks/step_profile.py (`step_profile.json`) as Markdown: op time by class against the
roofline, the step's GEMM rates, the top ops; also the docs table `step_profile:<dir>`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from experiments.tables.common import BENCHMARK_RESULTS
from primal_jax import markdown

CLASSES = ("matmul", "copy/transpose", "reduction", "elementwise")
# The three products of a Dense layer's forward and backward: label -> (einsum spec, its two operands).
GEMMS = {
  "Y = X W": ("mk,kn->mn", "x", "w"),
  "dX = dY W^T": ("mn,kn->mk", "dy", "w"),
  "dW = X^T dY": ("mk,mn->kn", "x", "dy"),
}


def _rate(flops_per_s: float, peak: float) -> str:
  return f"{flops_per_s / 1e9:.0f} ({100 * flops_per_s / peak:.0f}%)"


def record_markdown(record: Mapping) -> str:
  """The class table, the GEMM rates and the top ops of one record."""
  peak, bandwidth, wall = record["matmul_peak"], record["bandwidth"], record["wall_seconds"]
  matmul_flops = next(r for r in record["classes"] if r["class"] == "matmul")["flops"]
  roofline = sum(r["roofline_seconds"] for r in record["classes"])
  lines = [
    f"### {record['model']}, N = {record['seq_len']}",
    "",
    f"Step {wall * 1e3:.0f} ms wall ({record['op_seconds'] * 1e3:.0f} ms of op time summed over threads); matmul "
    f"peak {peak / 1e9:.0f} GFLOP/s, triad bandwidth {bandwidth / 1e9:.1f} GB/s. The step's {matmul_flops / 1e9:.2f} "
    f"GFLOP of matmuls are {100 * matmul_flops / wall / peak:.0f}% of the peak over its wall time; with every op "
    f"at its roofline ({roofline * 1e3:.1f} ms) they would be {100 * matmul_flops / roofline / peak:.0f}%.",
    "",
  ]
  body = []
  for r in record["classes"]:
    rate = _rate(r["flops_per_s"], peak) if r["flops"] else "-"
    body.append([
      r["class"], r["ops"], f"{r['seconds'] * 1e3:.1f}", f"{100 * r['share']:.0f}%", rate,
      f"{r['bytes_per_s'] / 1e9:.1f} ({100 * r['bytes_per_s'] / bandwidth:.0f}%)", f"{r['roofline_seconds'] * 1e3:.1f}",
    ])  # fmt: skip
  header = ["class", "ops", "ms/step", "share", "GFLOP/s (% peak)", "GB/s (% triad)", "roofline ms"]
  lines.append(markdown.table(header, body))
  rows = record["seq_len"] * record["batch_size"]
  lines += ["", f"The step's matmul shapes alone (rows = B N = {rows:,}), GFLOP/s (% peak):", ""]
  body = []
  for k, n in sorted({tuple(int(v[2:]) for v in key.split(", ")[1:]) for key in record["gemm_rates"]}):
    body.append(
      [f"k = {k}, n = {n}", *(_rate(record["gemm_rates"][f"{label}, k={k}, n={n}"], peak) for label in GEMMS)]
    )
  lines += [markdown.table(["product", *GEMMS], body), ""]
  body = []
  for op in record["top"]:
    t = op["seconds"] or 1e-12
    rate = f"{op['flops'] / t / 1e9:.0f}" if op["flops"] else "-"
    source = op["source"].replace("jit(train_step)/", "").replace("transpose(jvp(", "bwd(").replace("jvp(", "fwd(")
    body.append(
      [f"`{op['name']}`", op["kind"], f"{t * 1e3:.2f}", rate, f"{op['bytes'] / t / 1e9:.1f}", f"`{source[-60:]}`"]
    )
  header = ["op", "class", "ms/step", "GFLOP/s", "GB/s", "from"]
  lines.append(markdown.table(header, body, aligns=["l", "l", "r", "r", "r", "l"]))
  return "\n".join(lines)


def summary_table(records: Iterable[Mapping]) -> str:
  """One row per (model, N): the step, its matmul share of the peak, and each class against its roofline."""
  header = ["model", "N", "step ms", "matmul % of peak", "roofline ms", "% of peak at the roofline"]
  header += [f"{kind} ms (x roofline)" for kind in CLASSES]
  body = []
  for r in records:
    flops = next(c for c in r["classes"] if c["class"] == "matmul")["flops"]
    roofline = sum(c["roofline_seconds"] for c in r["classes"])
    peak, wall = r["matmul_peak"], r["wall_seconds"]
    cells = [
      r["model"], f"{r['seq_len']:,}", f"{wall * 1e3:.0f}", f"{100 * flops / wall / peak:.0f}%",
      f"{roofline * 1e3:.0f}", f"{100 * flops / roofline / peak:.0f}%",
    ]  # fmt: skip
    cells += [f"{c['seconds'] * 1e3:.0f} ({c['seconds'] / c['roofline_seconds']:.1f}x)" for c in r["classes"]]
    body.append(cells)
  return markdown.table(header, body)


def gemm_spans(records: Iterable[Mapping]) -> str:
  """Per product of `GEMMS`, the range over the records' shapes of its rate as a % of that record's peak."""
  spans = []
  for label in GEMMS:
    shares = [
      100 * rate / r["matmul_peak"] for r in records for key, rate in r["gemm_rates"].items() if key.startswith(label)
    ]
    spans.append(f"{label} {min(shares):.0f}-{max(shares):.0f}%")
  return ", ".join(spans)


def docs_table(name: str, base: Path) -> str:
  """The docs table `step_profile:<name>`: the summary of benchmarks/results/<name>/step_profile.json."""
  folder = BENCHMARK_RESULTS / name
  results = json.loads((folder / "step_profile.json").read_text())
  meta, records = results["meta"], results["records"]
  peaks = sorted(r["matmul_peak"] / 1e9 for r in records)
  triads = sorted(r["bandwidth"] / 1e9 for r in records)
  link = Path(os.path.relpath(folder / "step_profile.md", base)).as_posix()
  return (
    summary_table(records)
    + f"\n\nThe Dense layers' matmul shapes alone, % of the peak measured in the same process: {gemm_spans(records)}."
    + f"\n\nOp time per step summed over XLA's threads, by class; roofline: every op at max(FLOPs / matmul peak, "
    f"bytes / triad bandwidth), measured in the same process (peak {peaks[0]:.0f}-{peaks[-1]:.0f} GFLOP/s, "
    f"bandwidth {triads[0]:.0f}-{triads[-1]:.0f} GB/s). Batch 8, LRA ListOps model, host allocator "
    f"{meta['allocator']}, {meta['date']}{'' if meta.get('argv') else ', no command line recorded'}; "
    f"[per-op tables]({link})."
  )
