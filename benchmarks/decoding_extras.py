"""The decoding benchmark's other measurements: chunked prefill, end-to-end generation, tokens/s against the batch
size (`benchmarks/decoding.py` runs them; see its docstring; their tables: `experiments.tables.decoding`).

A decoding result (`decoding.json`) with a roofline has in its meta the bandwidth (`bandwidth_bytes_per_s`, the
better of the in-place triads measured before and after the grid) and the matmul peak; every record its
`bytes_per_step`, `bound_ms` (those bytes at that bandwidth) and `bound_fraction` (bound / measured). Optional
lists: `prefill`, `e2e` and `scaling`.
"""

from __future__ import annotations

import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.decoding_runners import VARIANTS, build, marginal_times, prepared_runner
from benchmarks.harness import measure as harness
from primal_jax.models import generation
from primal_jax.models.lm import decode_step, init_cache

# ---------------------------------------------------------------------------------------------------------------------
# Measurements.


def prefill_runner(variant: str, args):
  """(runner returning seconds, XLA FLOPs) of prefilling `--prefill_context` tokens in `--prefill_chunk` chunks."""
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
  out = []
  for batch in args.scaling_batches:
    prepared = {v: prepared_runner(v, args.scaling_context, batch, args) for v in variants}
    runners, samples = ({v: p[i] for v, p in prepared.items()} for i in (0, 2))
    marginal = marginal_times(runners, samples, args, f"scaling B={batch} context {args.scaling_context}")
    for variant in variants:
      ms = 1e3 * marginal[variant]  # the main table's marginal step
      sizes = {k: prepared[variant][1][k] for k in ("bytes_per_step", "flops_per_step")}
      out.append({"model": variant, "batch": batch, "seq_len": args.scaling_context, "ms_per_token": ms, **sizes})
      print(f"scaling B={batch:<3} context {args.scaling_context}  {variant:<17} {ms:8.3f} ms/step", flush=True)
  return out


def measure_extras(results: dict, args) -> None:
  """Adds the prefill, end-to-end and batch-scaling lists their arguments ask for to `results`."""
  if args.prefill_context:
    results["prefill"] = measure_prefill(args, VARIANTS)
  if args.e2e_prompt:
    results["e2e"] = measure_e2e(args, VARIANTS)
  if args.scaling_batches:
    results["scaling"] = scaling_bounds(measure_scaling(args, VARIANTS), results["meta"])


def scaling_bounds(records: list[dict], meta: dict) -> list[dict]:
  """Each batch-scaling record with its roofline: `bound_ms`, the larger of its bytes at the bandwidth and XLA's
  FLOPs at the matmul peak (a bigger batch reads the weights once for more tokens, until the arithmetic binds),
  and `bound_fraction` = bound / measured. Where XLA reports no FLOP count (`flops_per_step` None, kept so in the
  record) the bound is the bytes' alone: still a lower bound on the step's time, a looser one."""
  bandwidth, peak = meta["bandwidth_bytes_per_s"], meta["matmul_peak"]["flops_per_s"]
  for r in records:
    r["bound_ms"] = 1e3 * max(r["bytes_per_step"] / bandwidth, (r["flops_per_step"] or 0.0) / peak)
    r["bound_fraction"] = r["bound_ms"] / r["ms_per_token"]
  return records
