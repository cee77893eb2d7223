"""The decoding benchmark's roofline tables and its other measurements: chunked prefill, end-to-end generation,
tokens/s against the batch size (`benchmarks/decoding.py` runs them; see its docstring).

A decoding result (`decoding.json`) with a roofline has in its meta the bandwidth (`bandwidth_bytes_per_s`, the
better of the in-place triads measured before and after the grid) and the matmul peak; every record its
`bytes_per_step`, `bound_ms` (those bytes at that bandwidth) and `bound_fraction` (bound / measured). Optional
lists: `prefill`, `e2e` and `scaling`.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import harness
from primal_jax.models import generation
from primal_jax.models.lm import decode_step, init_cache


def _markdown(header, rows) -> str:
  return harness._markdown(header, rows)


def _per_batch(records):
  batches = dict.fromkeys(r["batch"] for r in records)
  return {b: [r for r in records if r["batch"] == b] for b in batches}


def roofline_table(records) -> str:
  """A row per model, a column per context: % of the bandwidth bound (bound ms / measured ms), and the slope of the
  measured time."""
  lengths = sorted({r["seq_len"] for r in records})
  models = list(dict.fromkeys(r["model"] for r in records))
  cell = {(r["model"], r["seq_len"]): r for r in records}
  slopes = harness.scaling_slopes([{**r, "variant": r["model"]} for r in records], "ms_per_token")
  rows = []
  for model in models:
    row = [model]
    for n in lengths:
      r = cell.get((model, n))
      row.append(
        "-" if r is None else f"{100 * r['bound_fraction']:.0f}% ({r['bound_ms']:.2f} / {r['ms_per_token']:.2f})"
      )
    slope = slopes.get(model)
    row.append("-" if slope is None else f"{slope:.2f}")
    rows.append(row)
  return _markdown(["model", *(f"N={n}" for n in lengths), "slope of ms"], rows)


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
      [model, f"{weights / harness.MIB:.2f}"]
      + ["-" if r is None else f"{r['bytes_per_step'] / harness.MIB:,.1f}" for r in values]
    )
  return _markdown(["model", "weights read (MiB)", *(f"N={n}" for n in lengths)], rows)


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
    parts.append(f"Chunked prefill, batch 1:\n\n{_markdown(header, rows)}")
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
    parts.append(f"End-to-end `generation.generate` (greedy; prefill included):\n\n{_markdown(header, rows)}")
  if results.get("scaling"):
    batches = sorted({s["batch"] for s in results["scaling"]})
    cell = {(s["model"], s["batch"]): s for s in results["scaling"]}
    rows = []
    for model in dict.fromkeys(s["model"] for s in results["scaling"]):
      base = cell.get((model, batches[0]))
      row = [model]
      for b in batches:
        s = cell.get((model, b))
        if s is None:
          row.append("-")
          continue
        rate = b / (s["ms_per_token"] / 1e3)
        ratio = f" ({rate / (batches[0] / (base['ms_per_token'] / 1e3)):.1f}x)" if base else ""
        row.append(f"{rate:,.0f}{ratio}")
      rows.append(row)
    context = results["scaling"][0]["seq_len"]
    parts.append(
      f"Tokens/s against the batch size at context {context:,} (ratio to batch {batches[0]}):\n\n"
      + _markdown(["model", *(f"B={b}" for b in batches)], rows)
    )
  return parts


# ---------------------------------------------------------------------------------------------------------------------
# Measurements.


def prefill_runner(variant: str, args):
  """(runner returning seconds, XLA FLOPs) of prefilling `--prefill_context` tokens in `--prefill_chunk` chunks."""
  from benchmarks.decoding import build

  context, chunk = args.prefill_context, args.prefill_chunk
  model, params = build(variant, context, args)
  step = jax.jit(lambda p, c, t: decode_step(model, p, c, t)[1], donate_argnums=1)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (1, context), dtype=np.int32))
  bounds = [(b, min(b + chunk, context)) for b in range(0, context, chunk)]
  cache = init_cache(model, 1)
  flops = 0.0
  for begin, end in bounds:
    flops += harness.compiled_flops(step.lower(params, cache, tokens[:, begin:end]).compile()) or 0.0

  def run() -> float:
    c = jax.block_until_ready(init_cache(model, 1))
    start = time.perf_counter()
    for begin, end in bounds:
      c = step(params, c, tokens[:, begin:end])
    jax.block_until_ready(c)
    return time.perf_counter() - start

  run()
  return run, flops


def measure_prefill(args, variants) -> list[dict]:
  runners, flops = {}, {}
  for variant in variants:
    runners[variant], flops[variant] = prefill_runner(variant, args)
  times = harness.interleaved_timings(runners, args.repeats)
  out = []
  for variant in variants:
    seconds = statistics.median(times[variant])
    out.append({"model": variant, "tokens": args.prefill_context, "chunk": args.prefill_chunk, "seconds": seconds,
                "flops": flops[variant]})  # fmt: skip
    print(f"prefill {args.prefill_context} tokens  {variant:<17} {seconds:8.3f} s", flush=True)
  return out


def measure_e2e(args, variants) -> list[dict]:
  """`generate` (greedy) after an `--e2e_prompt`-token prompt, `--e2e_new` new tokens, batch 1: the second call."""
  from benchmarks.decoding import build

  out = []
  prompt = np.random.default_rng(1).integers(0, 256, args.e2e_prompt).tolist()
  greedy = generation.SamplingOptions(temperature=0.0)
  for variant in variants:
    model, params = build(variant, args.e2e_prompt + args.e2e_new, args)
    call = functools.partial(
      generation.generate, model, params, [prompt], max_new_tokens=args.e2e_new, options=greedy,
      prefill_chunk=args.prefill_chunk,
    )  # fmt: skip
    call()  # compile
    seconds = []
    for _ in range(max(1, min(args.repeats, 3))):
      start = time.perf_counter()
      call()
      seconds.append(time.perf_counter() - start)
    out.append({"model": variant, "prompt": args.e2e_prompt, "new_tokens": args.e2e_new, "batch": 1,
                "seconds": statistics.median(seconds)})  # fmt: skip
    print(f"generate {args.e2e_prompt}+{args.e2e_new}  {variant:<17} {out[-1]['seconds']:8.3f} s", flush=True)
  return out


def measure_scaling(args, variants) -> list[dict]:
  """ms per decode step at `--scaling_context` for every `--scaling_batches` size."""
  from benchmarks.decoding import prepared_runner

  out = []
  for batch in args.scaling_batches:
    runners = {v: prepared_runner(v, args.scaling_context, batch, args)[0] for v in variants}
    times = harness.interleaved_timings(runners, args.repeats)
    for variant in variants:
      ms = 1e3 * statistics.median(times[variant])
      out.append({"model": variant, "batch": batch, "seq_len": args.scaling_context, "ms_per_token": ms})
      print(f"scaling B={batch:<3} context {args.scaling_context}  {variant:<17} {ms:8.3f} ms/step", flush=True)
  return out


def measure_extras(results: dict, args) -> None:
  """Adds the prefill, end-to-end and batch-scaling lists their arguments ask for to `results`."""
  from benchmarks.decoding import VARIANTS

  if args.prefill_context:
    results["prefill"] = measure_prefill(args, VARIANTS)
  if args.e2e_prompt:
    results["e2e"] = measure_e2e(args, VARIANTS)
  if args.scaling_batches:
    results["scaling"] = measure_scaling(args, VARIANTS)
