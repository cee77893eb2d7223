"""The records of benchmarks/vs_release.py (`vs_release.json`) as Markdown: per (allocator, N, model) both sides'
median step, their ratio, the other processes' load and memory; also the docs table `vs_release:<dir>` and its
one-paragraph summary `vs_release_summary:<dir>`."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from experiments.tables.common import BENCHMARK_RESULTS, link
from primal_jax import markdown

SIDES = ("release", "ours")


def summary_line(record: dict) -> str:
  head = f"{record['allocator']} N={record['seq_len']} {record['model']} {record['side']}"
  if record.get("error"):
    return f"{head}: FAILED {record['error']}"
  seconds = [s["seconds"] for s in record["steps"]]
  other = [s["other_cores"] for s in record["steps"] if s["other_cores"] is not None]
  load = f", others {statistics.median(other):.2f} cores" if other else ""
  return f"{head}: median {statistics.median(seconds):.3f} s/step{load}"


def _cell(records: list[dict]) -> dict | None:
  """Pooled numbers of one (allocator, N, model, side): median over all timed steps, and per process."""
  ok = [r for r in records if not r.get("error")]
  if not ok:
    return None
  steps = [s for r in ok for s in r["steps"]]
  other = [s["other_cores"] for s in steps if s["other_cores"] is not None]
  per_process = [statistics.median(s["seconds"] for s in r["steps"]) for r in ok]
  peaks = [r["matmul_peak"]["flops_per_s"] for r in ok if r.get("matmul_peak")]
  flops = next((r.get("flops_per_step") for r in ok if r.get("flops_per_step")), None)
  median = statistics.median(s["seconds"] for s in steps)
  return {
    "median": median,
    "per_process": per_process,
    "other_median": statistics.median(other) if other else None,
    "other_max": max(other) if other else None,
    "rss_mib": max(r["peak_rss_bytes"] or 0 for r in ok) / 2**20,
    "peak_fraction": flops / median / statistics.median(peaks) if flops and peaks else None,
  }


def results_markdown(results: dict) -> str:
  """The comparison table: per (allocator, N, model) both sides' median step, the ratio, the load, memory."""
  meta, records = results["meta"], results["records"]
  args = meta["args"]
  keys = list(dict.fromkeys((r["allocator"], r["seq_len"], r["model"]) for r in records))
  rows = []
  for allocator, n, model in keys:
    mine = [r for r in records if (r["allocator"], r["seq_len"], r["model"]) == (allocator, n, model)]
    cells = {side: _cell([r for r in mine if r["side"] == side]) for side in SIDES}
    rel, ours = cells["release"], cells["ours"]

    def seconds(cell):
      if cell is None:
        return "-"
      return f"{cell['median']:.3f} ({' / '.join(f'{v:.3f}' for v in cell['per_process'])})"

    others = [c for c in (rel, ours) if c and c["other_median"] is not None]
    load = (
      " / ".join(f"{c['other_median']:.2f} ({c['other_max']:.2f})" for c in others) if others else "-"
    )  # fmt: skip
    rows.append([
      allocator, str(n), model, seconds(rel), seconds(ours),
      f"{rel['median'] / ours['median']:.2f}" if rel and ours else "-",
      load,
      " / ".join("-" if c is None else f"{c['rss_mib']:,.0f}" for c in (rel, ours)),
      "-" if ours is None or ours["peak_fraction"] is None else f"{100 * ours['peak_fraction']:.0f}%",
    ])  # fmt: skip
  header = [
    "allocator", "N", "model", "release s/step (per process)", "primal_jax s/step (per process)",
    "release / primal_jax", "other processes, cores: median (max)", "peak RSS MiB", "primal_jax % matmul peak",
  ]  # fmt: skip
  table = markdown.table(header, rows, aligns=["l", "r", "l", *"r" * (len(header) - 3)])
  failed = [r for r in records if r.get("error")]
  versions = {k: v for r in records if not r.get("error") for k, v in r.get("versions", {}).items()}
  caption = (
    f"Median seconds per training step over {args['steps']} timed steps (after {args['warmup_steps']} warm-up "
    f"steps) of every process, in parentheses each process's median; {args['rounds']} process(es) per cell, "
    f"sides interleaved. LRA `{args['task']}` model, batch {args['batch_size']}, float32, {args['threads']} "
    f"threads on both sides (cores pinned), {meta['cpu_count']} CPUs ({meta['machine']}), "
    f"{', '.join(f'{k} {v}' for k, v in sorted(versions.items()))}, {meta['date'][:10]}, commit "
    f"{(meta['git_commit'] or '?')[:9]}. Other processes: cores they kept busy during the timed steps "
    f"(release / primal_jax; 0 on a quiet machine); load average {meta['load_average_start'][0]:.1f} at the start, "
    f"{meta['load_average_end'][0]:.1f} at the end. Peak RSS: release / primal_jax (ours includes compiling)."
  )
  if args.get("xla_flags"):
    caption += f" Extra XLA flags: `{args['xla_flags']}`."
  if failed:
    caption += " Failed: " + "; ".join(summary_line(r) for r in failed) + "."
  return table + "\n\n" + caption


def docs_table(name: str, base: Path) -> str:
  """The docs table `vs_release:<name>`: the table of benchmarks/results/<name>/vs_release.json."""
  del base  # no links to place
  return results_markdown(json.loads((BENCHMARK_RESULTS / name / "vs_release.json").read_text())).strip()


ALLOCATOR_NAMES = {"system": "glibc malloc", "tcmalloc": "tcmalloc", "jemalloc": "jemalloc"}
# A side timed while other processes kept more than this many cores busy (the median over its timed steps) is
# contended: its cell's ratio is left out of the summary's ranges, and the summary names it.
BUSY_CORES = 0.2


def _span(values: list[float]) -> str:
  low, high = min(values), max(values)
  return f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}x"


def summary_markdown(results: dict) -> str:
  """The record's ratios in one paragraph: release / primal_jax per model and allocator (the range over N),
  and our own step under glibc malloc over tcmalloc, with the run's date and commit."""
  meta, records = results["meta"], results["records"]
  cells = {}
  for allocator, n, model in dict.fromkeys((r["allocator"], r["seq_len"], r["model"]) for r in records):
    mine = [r for r in records if (r["allocator"], r["seq_len"], r["model"]) == (allocator, n, model)]
    cells[allocator, n, model] = {side: _cell([r for r in mine if r["side"] == side]) for side in SIDES}
  lengths = sorted({n for _, n, _ in cells})
  busy = {
    key: [f"{side} {c['other_median']:.2f}" for side, c in sides.items() if c and (c["other_median"] or 0) > BUSY_CORES]
    for key, sides in cells.items()
  }
  cells = {key: sides for key, sides in cells.items() if not busy[key]}
  parts = []
  for model in dict.fromkeys(m for _, _, m in cells):
    spans = []
    for allocator in dict.fromkeys(a for a, _, _ in cells):
      ratios = [
        c["release"]["median"] / c["ours"]["median"]
        for (a, _, m), c in cells.items()
        if (a, m) == (allocator, model) and c["release"] and c["ours"]
      ]
      if ratios:
        spans.append(f"{_span(ratios)} with {ALLOCATOR_NAMES.get(allocator, allocator)}")
    if spans:
      parts.append(f"{model} {', '.join(spans)}")
  text = (
    f"Release / primal_jax seconds per step, {meta['args']['threads']} threads on both sides, N = "
    f"{lengths[0]}-{lengths[-1]}: {'; '.join(parts)}."
  )
  allocator_ratios = [
    c["ours"]["median"] / cells["tcmalloc", n, m]["ours"]["median"]
    for (a, n, m), c in cells.items()
    if a == "system" and c["ours"] and cells.get(("tcmalloc", n, m), {}).get("ours")
  ]
  if allocator_ratios:
    text += f" Our step with glibc malloc over tcmalloc: {_span(allocator_ratios)}."
  left_out = [
    f"{ALLOCATOR_NAMES.get(a, a)} N={n} {m} ({', '.join(sides)})" for (a, n, m), sides in busy.items() if sides
  ]
  if left_out:
    text += (
      f" Left out, timed while other processes kept over {BUSY_CORES} cores busy (median, cores): "
      f"{'; '.join(left_out)}."
    )
  return text + f" Run of {meta['date'][:10]}, commit {(meta['git_commit'] or '?')[:9]}"


def docs_summary(name: str, base: Path) -> str:
  """The docs paragraph `vs_release_summary:<name>`: `summary_markdown` of benchmarks/results/<name>/."""
  path = BENCHMARK_RESULTS / name / "vs_release.json"
  return summary_markdown(json.loads(path.read_text())) + f" ({link(path, base)})."
