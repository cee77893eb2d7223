r"""Per-token decoding time and decoding-state size against the context length: Primal's O(1) state vs a KV cache.

  python -m benchmarks.decoding --contexts=256,512,1024,2048,4096 --out=benchmarks/results/decoding

Three `CausalLM`s of the same size (`--layers` layers, `--dim`, `--heads`, byte vocabulary) differ only in
their attention: `softmax_kv_cache` (every layer softmax, decoding from a key/value cache), `primal_plus`
(Primal.+Trans.: softmax KV caches below, the last layer causal Primal) and `primal_state` (PrimalFormer: every
layer causal Primal-Attention with data-independent weights, decoding from the running sums of q and k). For
each context length c and batch size, each model gets a cache sized for c (`max_len = c`, what a KV cache must
hold to reach that context) filled to position c - steps - 1, and then `--steps` single-token decode steps are
timed (the last one at position c - 2); repeats are interleaved across the models and the median is reported,
as seconds per token and its ratio to the KV cache, with the state's size in bytes and XLA's temporary memory
of the compiled step (`memory_analysis`). The machine is shared and noisy: compare the rows of one run.

Each timed run is one compiled loop of greedy steps (`lm.greedy_decode`, cache donated), timed at `--steps` steps
and at 1 step on the same filled cache: the time per token is the difference of their best repeats over
`--steps` - 1, the step itself in steady state, without the call's fixed cost (dispatching the loop with its
parameters and donated cache) or the first step's cold caches. The records keep that 1-step call's time
(`call_ms`, a table of its own) and the CPU seconds per wall second of the loop (`cpu_per_wall`: how many threads
the step keeps busy). The same process measures the memory bandwidth (an in-place
triad, `benchmarks.harness.measure.triad_bandwidth`) and the matmul peak, and each record gets its roofline: the
bytes one step must read (the weights it multiplies by, plus the whole decoding state: a softmax layer reads its
`max_len` cache under a mask), the time that takes at the measured bandwidth, and the fraction of that bound the
step reaches. After the grid it also times read-only streams over a buffer of each step's own size
(`sized_read_bound_ms`): a step reads the same state at every token, which stays in whatever cache level holds
it, so a bound measured on smaller arrays (the triad's) can measure a faster level than the step's. Separate
measurements (`benchmarks.decoding_extras`; the models and timed runners both use: `benchmarks.decoding_runners`;
every table: `experiments.tables.decoding`): the chunked prefill's FLOP rate against the matmul peak, end-to-end
`generate` tokens/s (a `--e2e_prompt` prompt and `--e2e_new` new tokens) and tokens/s against the batch size
(`--scaling_batches` at `--scaling_context`).

`--fill=synthetic` (the default) writes random keys, values and running sums and sets the positions, instead of
running the model over c random tokens (`--fill=prefill`, in chunks of `--prefill_chunk`): a decode step's work
does not depend on what the state holds (softmax attends over the whole `max_len` cache under a mask), and the
prefill of a 64K softmax context costs minutes of quadratic attention on a CPU without changing what is timed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax

from benchmarks import decoding_extras
from benchmarks.decoding_runners import (  # noqa: F401 (build, layer_kinds, synthetic_cache, weight_bytes: the API)
  SOFTMAX_IMPLS,
  VARIANTS,
  build,
  layer_kinds,
  marginal_times,
  prepared_runner,
  synthetic_cache,
  weight_bytes,
)
from benchmarks.harness import measure as harness
from experiments.tables.decoding import results_markdown
from primal_jax.provenance import checkout, provenance

PLOT_METRICS = (
  ("ms_per_token", "ms per decoded token", 1.0),
  ("state_bytes", "decoding state (MiB)", harness.MIB),
  ("xla_temp_bytes", "XLA temporaries of the step (MiB)", harness.MIB),
)


def measure_rates(args) -> dict:
  """The roofline's references, measured in this process: in-place triad bandwidth and the matmul peak."""
  device = jax.devices()[0]
  peak_size = args.peak_size or (4096 if device.platform != "cpu" else 2048)
  return {
    "bandwidth_bytes_per_s": harness.triad_bandwidth(args.triad_elements, in_place=True),
    "matmul_peak": harness.measure_matmul_peak(peak_size, device=device),
  }


def sized_read_bounds(records: list[dict], args) -> list[dict]:
  """Each record's bound at its own working set: `sized_read_bound_ms` is its `bytes_per_step` at the best
  read-only stream over a buffer of that many bytes (`harness.read_bandwidth_at`, measured once per size, every
  size after the grid, in this process). A step reads the same state at every token, so that state stays in
  whatever cache level holds it: a bound measured on a smaller stream (the triad's) can sit in a faster level
  than the step's data. Returns the rates by size, [{"bytes", each stream's rate, "best"}]."""
  by_size = {}
  for nbytes in sorted({r["bytes_per_step"] for r in records}):
    by_size[nbytes] = harness.read_bandwidth_at(nbytes, repeats=args.sized_repeats)
  for record in records:
    record["sized_read_bound_ms"] = 1e3 * record["bytes_per_step"] / by_size[record["bytes_per_step"]]["best"]
  return [{"bytes": nbytes, **rates} for nbytes, rates in by_size.items()]


def _ints(text: str) -> list[int]:
  return [int(x) for x in text.split(",") if x.strip()]


def _flag(value) -> str:
  return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def measure(args) -> dict:
  rates = measure_rates(args)
  records = []
  for batch in args.batch:
    for context in args.contexts:
      runners, sizes, samples = {}, {}, {}
      for variant in VARIANTS:
        runners[variant], sizes[variant], samples[variant] = prepared_runner(variant, context, batch, args)
      marginal = marginal_times(runners, samples, args, f"B={batch} context {context}")
      for variant in VARIANTS:
        seconds, one = marginal[variant], min(samples[variant]["one"])
        records.append({
          "variant": f"{variant} B={batch}", "model": variant, "batch": batch, "seq_len": context,
          "ms_per_token": 1e3 * seconds, "call_ms": 1e3 * one,
          "cpu_per_wall": statistics.median(samples[variant]["cpu_per_wall"]), **sizes[variant],
        })  # fmt: skip
        print(f"B={batch} context {context:>6}  {variant:<17} {1e3 * seconds:9.3f} ms/token  "
              f"state {sizes[variant]['state_bytes']:>14,} bytes", flush=True)  # fmt: skip
  del runners, samples  # the last grid point's models and caches: the streams below allocate up to a step's size
  end_bandwidth = harness.triad_bandwidth(args.triad_elements, in_place=True)
  bandwidth = max(rates["bandwidth_bytes_per_s"], end_bandwidth)  # the better of the two: a bound, not a typical rate
  one_thread = harness.one_thread_bandwidth(args.triad_elements)
  read = harness.read_bandwidth(args.triad_elements)  # the step only reads: the best read-only stream, a 2nd bound
  for record in records:
    record["read_bound_ms"] = 1e3 * record["bytes_per_step"] / read["best"]
    bound = record["bytes_per_step"] / bandwidth
    record["bound_ms"] = 1e3 * bound
    record["bound_fraction"] = record["bound_ms"] / record["ms_per_token"]
    record["one_thread_bound_ms"] = 1e3 * record["bytes_per_step"] / one_thread
  by_size = sized_read_bounds(records, args)
  device = jax.devices()[0]
  meta = {
    "devices": str(jax.devices()),
    "platform": device.platform,
    "device_kind": device.device_kind,
    "git_commit": checkout()[0],  # the commit provenance names (read once per process)
    "provenance": provenance(),
    "config": {k: v for k, v in vars(args).items() if k != "out"},
    "softmax_impl": args.softmax_impl,
    "date": time.strftime("%Y-%m-%d"),
    "command": "python -m benchmarks.decoding "
    + " ".join(f"--{k}={_flag(v)}" for k, v in vars(args).items() if k != "out"),
    "bandwidth_bytes_per_s": bandwidth,
    "bandwidth_start_end": [rates["bandwidth_bytes_per_s"], end_bandwidth],
    "one_thread_bandwidth_bytes_per_s": one_thread,  # NumPy's a <- b + c: one thread's memory bandwidth
    "read_bandwidth_bytes_per_s": read,  # each read-only stream's rate and the best (`harness.read_bandwidth`)
    "read_bandwidth_by_size": by_size,  # the same streams over each step's own bytes (`sized_read_bounds`)
    "matmul_peak": rates["matmul_peak"],
  }
  results = {"meta": meta, "records": records}
  decoding_extras.measure_extras(results, args)
  return results


def parse_args(argv=None) -> argparse.Namespace:
  """The benchmark's settings from command-line style arguments (what `measure` takes; notebooks use it too)."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--contexts", type=_ints, default=[1024, 4096, 16384, 65536])
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--dim", type=int, default=256)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--low_rank", type=int, default=20)
  parser.add_argument("--batch", type=_ints, default=[1, 8], help="e.g. 1,8")
  parser.add_argument("--fill", choices=["synthetic", "prefill"], default="synthetic")
  parser.add_argument("--steps", type=int, default=16)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--prefill_chunk", type=int, default=256)
  parser.add_argument(
    "--softmax_impl", choices=SOFTMAX_IMPLS, default="einsum",
    help="the softmax layers' impl: einsum (matrix-vector products on the cache's own layout) or "
    "dot_product_attention (jax.nn.dot_product_attention on a transposed view of it: cuDNN on a GPU where it applies)",
  )  # fmt: skip
  parser.add_argument("--triad_elements", type=int, default=2**24, help="float32 elements per triad array")
  parser.add_argument(
    "--sized_repeats", type=int, default=5, help="repeats of each read-only stream at a step's own size"
  )
  parser.add_argument("--peak_size", type=int, default=0, help="matmul peak size (0: 4096 on GPU/TPU, 2048 on CPU)")
  parser.add_argument("--prefill_context", type=int, default=1024, help="tokens prefilled (0: no prefill table)")
  parser.add_argument("--e2e_prompt", type=int, default=1024, help="generate(): prompt length (0: no such table)")
  parser.add_argument("--e2e_new", type=int, default=256, help="generate(): new tokens")
  parser.add_argument("--scaling_batches", type=_ints, default=[1, 8, 32], help="tokens/s vs batch ('' : none)")
  parser.add_argument("--scaling_context", type=int, default=1024)
  parser.add_argument("--out", type=Path, default=None)
  args = parser.parse_args(argv)
  for name in ("contexts", "batch"):
    if not getattr(args, name):
      parser.error(f"--{name} must name at least one value, got none")
  if args.steps < 2:
    parser.error(
      f"--steps must be >= 2 (the time per token is the difference of a --steps and a 1-step loop), got {args.steps}"
    )
  if min(args.contexts) <= args.steps + 1:
    parser.error(f"--contexts must all exceed --steps + 1 = {args.steps + 1}")
  if args.scaling_batches and args.scaling_context <= args.steps + 1:
    parser.error(f"--scaling_context must exceed --steps + 1 = {args.steps + 1}")
  return args


def main(argv=None) -> None:
  args = parse_args(argv)
  if args.out is not None and (args.out / "decoding.json").exists():  # before minutes of measuring
    raise SystemExit(
      f"--out {args.out} already holds a decoding record; records are never overwritten: pick a new --out"
    )
  results = measure(args)
  text = results_markdown(results)
  print(text)
  if args.out:
    args.out.mkdir(parents=True, exist_ok=True)
    harness.save_results(args.out / "decoding.json", results)
    (args.out / "decoding.md").write_text(text)
    harness.plot_scaling(
      results, args.out / "decoding.png", title="per-token decoding: Primal state vs KV cache",
      metrics=PLOT_METRICS, xlabel="context length",
    )  # fmt: skip


if __name__ == "__main__":
  main()
