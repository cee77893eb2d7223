"""The decoding benchmark's records (benchmarks/decoding.py, `decoding.json`) as Markdown: milliseconds per token,
state and temporaries against the KV cache, and where a record has them the roofline, prefill, end-to-end and
batch-scaling sections; also the docs table `decoding:<dir>`.

A decoding result with a roofline has in its meta the bandwidth (`bandwidth_bytes_per_s`, the better of the in-place
triads measured before and after the grid) and the matmul peak; every record its `bytes_per_step`, `bound_ms` (those
bytes at that bandwidth) and `bound_fraction` (bound / measured). Optional lists: `prefill`, `e2e` and `scaling`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from experiments.tables.common import BENCHMARK_RESULTS
from experiments.tables.efficiency import MIB, load_results, ratio_table, scaling_slopes
from primal_jax import markdown


def results_markdown(results: dict) -> str:
  """Every table of a decoding result."""
  meta = results["meta"]
  repeats, steps = meta["config"]["repeats"], meta["config"]["steps"]
  timing = (
    f"the marginal step: (best {steps}-step loop - best 1-step loop) / {steps - 1}, over {repeats} interleaved repeats"
    if all("call_ms" in r for r in results["records"])
    else f"median of {repeats} interleaved repeats of {steps} steps"  # records before the marginal step
  )
  parts = [
    f"Milliseconds per decoded token (ratio to the KV cache), {timing}; {meta['devices']}, {meta['date']}; "
    f"`{meta['command']}`"
  ]
  tables = (
    ("ms_per_token", "Milliseconds per decoded token", 1.0),
    ("state_bytes", "Decoding state (MiB)", MIB),
    ("xla_temp_bytes", "XLA temporaries of the compiled step (MiB)", MIB),
  )
  if all("call_ms" in r for r in results["records"]):  # the marginal step's records: the call it leaves out
    tables += (
      ("call_ms", "Milliseconds of one call of the 1-step loop (the fixed cost the marginal step leaves out)", 1.0),
    )
  for batch in dict.fromkeys(r["batch"] for r in results["records"]):  # tables per batch size, a row per model
    records = [{**r, "variant": r["model"]} for r in results["records"] if r["batch"] == batch]
    for path, title, scale in tables:
      table = ratio_table(records, path, reference="softmax_kv_cache", scale=scale, digits=3)
      parts.append(f"{title}, batch {batch}:\n\n{table}")
  if "bandwidth_bytes_per_s" in meta:  # records with a roofline (older ones have none)
    parts += roofline_sections(results)
  return "\n\n".join(parts) + "\n"


def _per_batch(records):
  batches = dict.fromkeys(r["batch"] for r in records)
  return {b: [r for r in records if r["batch"] == b] for b in batches}


def roofline_table(records, bound: str = "bound_ms") -> str:
  """A row per model, a column per context: % of the bandwidth bound (`bound` ms / measured ms: `bound_ms` at the
  triad's bandwidth, `read_bound_ms` at the best read-only stream's), and the slope of the measured time."""
  lengths = sorted({r["seq_len"] for r in records})
  models = list(dict.fromkeys(r["model"] for r in records))
  cell = {(r["model"], r["seq_len"]): r for r in records}
  slopes = scaling_slopes([{**r, "variant": r["model"]} for r in records], "ms_per_token")
  rows = []
  for model in models:
    row = [model]
    for n in lengths:
      r = cell.get((model, n))
      row.append(
        "-" if r is None else f"{100 * r[bound] / r['ms_per_token']:.0f}% ({r[bound]:.2f} / {r['ms_per_token']:.2f})"
      )
    slope = slopes.get(model)
    row.append("-" if slope is None else markdown.fixed(slope))
    rows.append(row)
  return markdown.table(["model", *(f"N={n}" for n in lengths), "slope of ms"], rows)


def threads_table(records) -> str:
  """A row per model, a column per context: the threads the step kept busy (CPU seconds per wall second of the
  timed loop) and the fraction of the bound at one thread's bandwidth (one-thread bound ms / measured ms)."""
  lengths = sorted({r["seq_len"] for r in records})
  cell = {(r["model"], r["seq_len"]): r for r in records}
  rows = []
  for model in dict.fromkeys(r["model"] for r in records):
    row = [model]
    for n in lengths:
      r = cell.get((model, n))
      fraction = None if r is None else r["one_thread_bound_ms"] / r["ms_per_token"]
      row.append("-" if r is None else f"{r['cpu_per_wall']:.2f} threads, {100 * fraction:.0f}%")
    rows.append(row)
  return markdown.table(["model", *(f"N={n}" for n in lengths)], rows)


def read_table(records) -> str:
  """MiB one step must read (weights + state) per model and context."""
  lengths = sorted({r["seq_len"] for r in records})
  models = list(dict.fromkeys(r["model"] for r in records))
  cell = {(r["model"], r["seq_len"]): r for r in records}
  rows = []
  for model in models:
    values = [cell.get((model, n)) for n in lengths]
    weights = next(r["weight_bytes"] for r in values if r)
    rows.append(
      [model, f"{weights / MIB:.2f}"] + ["-" if r is None else f"{r['bytes_per_step'] / MIB:,.1f}" for r in values]
    )
  return markdown.table(["model", "weights read (MiB)", *(f"N={n}" for n in lengths)], rows)


def sized_read_table(by_size: list[dict]) -> str:
  """GB/s of each read-only stream over a buffer of each step's size (a row per size, the best last)."""
  names = [k for k in by_size[0] if k not in ("bytes", "best")]
  rows = [
    [f"{s['bytes'] / MIB:,.1f}", *(f"{s[n] / 1e9:.1f}" for n in names), f"{s['best'] / 1e9:.1f}"] for s in by_size
  ]
  return markdown.table(["MiB read", *names, "best"], rows)


def roofline_sections(results: Mapping) -> list[str]:
  """The Markdown sections of a result's roofline, prefill, end-to-end and batch-scaling data."""
  meta = results["meta"]
  bandwidth = meta["bandwidth_bytes_per_s"] / 1e9
  peak = meta["matmul_peak"]
  parts = [
    f"Roofline: {meta['device_kind']} ({meta['platform']}), commit {(meta.get('git_commit') or '?')[:12]}; "
    f"memory bandwidth {bandwidth:.1f} GB/s (in-place triad, the better of "
    f"{', '.join(f'{b / 1e9:.1f}' for b in meta['bandwidth_start_end'])} GB/s measured before and after), matmul "
    f"peak {peak['flops_per_s'] / 1e9:.1f} GFLOP/s ({peak['size']}^3 {peak['dtype']}); softmax impl "
    f"`{meta['softmax_impl']}`. A step must read the weights it multiplies by and its whole decoding state (a "
    "softmax layer reads its max_len cache under a mask)."
  ]
  for batch, records in _per_batch(results["records"]).items():
    parts.append(f"MiB one decode step must read, batch {batch}:\n\n{read_table(records)}")
    parts.append(
      f"Fraction of the bandwidth bound reached (bound ms / measured ms per token), batch {batch}:\n\n"
      f"{roofline_table(records)}"
    )
    if "read_bandwidth_bytes_per_s" in meta:  # records since the read-only bound
      read = meta["read_bandwidth_bytes_per_s"]
      rates = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in read.items() if k != "best")
      table = roofline_table(records, "read_bound_ms")
      parts.append(
        f"Fraction of the read-only bound ({read['best'] / 1e9:.1f} GB/s, the best of {rates} GB/s: a decode step "
        f"only reads its cache, where a triad also writes), batch {batch}:\n\n{table}"
      )
    if "read_bandwidth_by_size" in meta:  # records since the bound at each step's own size
      table = roofline_table(records, "sized_read_bound_ms")
      parts.append(
        f"Fraction of the read-only bound at the step's own size (its bytes at the best read-only stream over a "
        f"buffer of that many bytes, the table below), batch {batch}:\n\n{table}"
      )
    if all("cpu_per_wall" in r for r in records):
      parts.append(
        f"Threads the step keeps busy (CPU s / wall s) and fraction of the bound at one thread's bandwidth "
        f"({meta['one_thread_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s), batch {batch}:\n\n{threads_table(records)}"
      )
  if meta.get("read_bandwidth_by_size"):
    parts.append(
      "GB/s of the read-only streams over a buffer of each step's size (the best is that size's bound; "
      f"`benchmarks.harness.measure.read_bandwidth_at`):\n\n{sized_read_table(meta['read_bandwidth_by_size'])}"
    )
  if results.get("prefill"):
    rows = [
      [
        p["model"],
        f"{p['tokens']:,}",
        str(p["chunk"]),
        f"{p['seconds']:.3f}",
        f"{p['tokens'] / p['seconds']:,.0f}",
        f"{p['flops'] / 1e9:.2f}",
        f"{p['flops'] / p['seconds'] / 1e9:.1f}",
        f"{100 * p['flops'] / p['seconds'] / peak['flops_per_s']:.0f}%",
      ]  # fmt: skip
      for p in results["prefill"]
    ]
    header = ["model", "tokens", "chunk", "seconds", "tokens/s", "GFLOP (XLA)", "GFLOP/s", "% of matmul peak"]
    parts.append(f"Chunked prefill, batch 1:\n\n{markdown.table(header, rows)}")
  if results.get("e2e"):
    rows = [
      [
        e["model"],
        f"{e['prompt']:,}",
        str(e["new_tokens"]),
        str(e["batch"]),
        f"{e['seconds']:.2f}",
        f"{e['batch'] * e['new_tokens'] / e['seconds']:,.1f}",
      ]  # fmt: skip
      for e in results["e2e"]
    ]
    header = ["model", "prompt", "new tokens", "batch", "seconds", "new tokens/s"]
    parts.append(f"End-to-end `generation.generate` (greedy; prefill included):\n\n{markdown.table(header, rows)}")
  if results.get("scaling"):
    parts += scaling_sections(results["scaling"])
  return parts


def _batch_grid(scaling: list[dict], batches: list[int], cell_text) -> list[list[str]]:
  """A row per model, a column per batch: `cell_text(record, batch, first-batch record)`, "-" where a record is
  missing."""
  cell = {(s["model"], s["batch"]): s for s in scaling}
  rows = []
  for model in dict.fromkeys(s["model"] for s in scaling):
    base = cell.get((model, batches[0]))
    row = [model]
    for b in batches:
      s = cell.get((model, b))
      row.append("-" if s is None or base is None else cell_text(s, b, base))
    rows.append(row)
  return rows


def scaling_sections(scaling: list[dict]) -> list[str]:
  """Tokens/s against the batch size and, for records since the batch-scaling roofline, its bound table."""
  batches = sorted({s["batch"] for s in scaling})

  def tokens_per_s(s, b, base):
    rate = b / (s["ms_per_token"] / 1e3)
    return f"{rate:,.0f} ({rate / (batches[0] / (base['ms_per_token'] / 1e3)):.1f}x)"

  rows = _batch_grid(scaling, batches, tokens_per_s)
  parts = [
    f"Tokens/s against the batch size at context {scaling[0]['seq_len']:,} (ratio to batch {batches[0]}):\n\n"
    + markdown.table(["model", *(f"B={b}" for b in batches)], rows)
  ]
  if all("bound_ms" in s for s in scaling):  # records since the batch-scaling roofline
    parts.append(scaling_bound_table(scaling, batches))
  return parts


def scaling_bound_table(scaling: list[dict], batches: list[int]) -> str:
  """Per model and batch: the step's bound (the larger of its bytes at the bandwidth and XLA's FLOPs at the matmul
  peak), the fraction of it reached, and the tokens/s ratio to the first batch that the bound allows."""

  def bound(s, b, base):
    allowed = (b / s["bound_ms"]) / (batches[0] / base["bound_ms"])
    return f"{s['bound_ms']:.2f} ms, {100 * s['bound_fraction']:.0f}% ({allowed:.1f}x)"

  return (
    "The batch-scaling roofline: bound per step (max of bytes / bandwidth and XLA FLOPs / matmul peak), the "
    f"fraction of it reached and, in brackets, the tokens/s ratio to batch {batches[0]} the bound allows:\n\n"
    + markdown.table(["model", *(f"B={b}" for b in batches)], _batch_grid(scaling, batches, bound))
  )


def docs_scaling_table(name: str, base: Path) -> str:
  """The docs table `decoding_scaling:<dir>`: only the batch-scaling sections of benchmarks/results/<dir>/decoding.json,
  with the bandwidth and matmul peak they were bounded by."""
  del base
  results = load_results(BENCHMARK_RESULTS / name / "decoding.json")
  if not results.get("scaling"):
    raise ValueError(f"{name}/decoding.json has no batch-scaling records (--scaling_batches)")
  meta = results["meta"]
  rates = (
    f"Bandwidth {meta['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s (in-place triad, the better of "
    f"{', '.join(f'{b / 1e9:.1f}' for b in meta['bandwidth_start_end'])} GB/s before and after the grid), matmul peak "
    f"{meta['matmul_peak']['flops_per_s'] / 1e9:.1f} GFLOP/s, both measured in the run; commit "
    f"{(meta.get('git_commit') or '?')[:12]}, {meta['date']}."
  )
  return "\n\n".join([*scaling_sections(results["scaling"]), rates])


def docs_sized_table(name: str, base: Path) -> str:
  """The docs table `decoding_sized:<dir>`: per batch, the fraction of the read-only bound at each step's own size
  and the threads the step keeps busy, then the streams' rates by size, of benchmarks/results/<dir>/decoding.json."""
  del base
  results = load_results(BENCHMARK_RESULTS / name / "decoding.json")
  meta = results["meta"]
  if not meta.get("read_bandwidth_by_size"):
    raise ValueError(f"{name}/decoding.json has no read bound at each step's size (records since that bound)")
  parts = [f"{meta['devices']}, {meta['date']}, commit {(meta.get('git_commit') or '?')[:12]}; `{meta['command']}`"]
  for batch, records in _per_batch(results["records"]).items():
    table = roofline_table(records, "sized_read_bound_ms")
    parts.append(f"Fraction of the read-only bound at the step's own size (bound ms / measured ms), batch {batch}:")
    parts.append(table)
    parts.append(
      f"Threads the step keeps busy (CPU s / wall s) and fraction of the bound at one thread's bandwidth "
      f"({meta['one_thread_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s), batch {batch}:\n\n{threads_table(records)}"
    )
  parts.append(
    f"GB/s of the read-only streams over a buffer of each step's size (the best is its bound):\n\n"
    f"{sized_read_table(meta['read_bandwidth_by_size'])}"
  )
  return "\n\n".join(parts)


def docs_table(name: str, base: Path) -> str:
  """The docs table `decoding:<dir>`: the tables of benchmarks/results/<dir>/decoding.json."""
  del base  # no links to place
  return results_markdown(load_results(BENCHMARK_RESULTS / name / "decoding.json")).strip()
