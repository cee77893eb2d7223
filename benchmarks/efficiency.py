r"""Training efficiency of the LRA models against sequence length (the paper's Table 3).

For every variant and length N: seconds per 1,000 training steps (forward + backward + Adam update,
state donated), memory (XLA's buffer assignment of the step, the peak RSS of a fresh process, the
device allocator's peak on GPU/TPU) and FLOPs (XLA cost analysis, achieved FLOP/s, fraction of a
measured matmul peak), with ratios against the softmax Transformer at the same N and log-log slopes.

  python -m benchmarks.efficiency                       # the full grid (long: run on an idle machine)
  python -m benchmarks.efficiency --lengths=256 --long_lengths= --steps=2 --repeats=1 \
    --variants=softmax,primalformer --set=model.attention.primal.rank_multi=2 --out=/tmp/bench  # seconds

Variants: `softmax` (the Transformer with our einsum `SoftmaxAttention`, the reference), `softmax_dpa`
(the same model with the softmax option `impl="dot_product_attention"`, i.e.
`jax.nn.dot_product_attention`, and no attention-weight dropout, which that function cannot apply),
`primalformer`, `primal_plus` (Primal.+Trans.) and every baseline in
`primal_jax.attention.registry.ATTENTIONS` at run time (the whole stack uses it). Models: the LRA config
(the packaged `lra` config, 2 layers, dim 64, hidden 128, 2 heads x 32) with max length N, on synthetic
full-length token batches (no data pipeline; its cost is not part of a step).

Protocol: every variant at one N is compiled and warmed up (`--warmup_steps`), then repeat r times
`--steps` steps of every variant in turn (starting with a different variant each repeat), so drift of
a shared machine hits all variants alike; the median over `--repeats` is extrapolated to 1,000 steps.
Process memory is measured first, in a separate process per (variant, N) (`--single`, this script
again), so one variant's allocations cannot inflate another's peak.

Host allocator (`--allocator`, CPU): XLA's CPU runtime allocates a step's temporaries afresh, and with
glibc malloc the large ones are mapped and unmapped every step, so page faults dominate the small LRA
models' steps. `--allocator=tcmalloc` re-executes the run with tcmalloc preloaded (every variant and every
memory process alike); the allocator is recorded in the outputs. See `primal_jax.launch.host_allocator`.

Budgets (`--memory_budget_gib`, `--step_budget`): a (variant, N) whose compiled step needs more memory than the
budget (XLA's buffer assignment, before anything runs) or whose warm-up step takes longer is recorded as not run
(`"not_run": "memory"|"time"`, with the reason) and the variant is not run at larger N, so a table says so instead of
leaving the cell out, and a step too large for the machine never starts.

Outputs in `--out`: efficiency.json (everything, `benchmarks.harness` result format),
efficiency.md (the tables), efficiency.png (log-log time and memory vs N, slopes in the legend).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import jax

from benchmarks.harness import measure as bm
from benchmarks.harness import process
from benchmarks.train_step import NotRun, PreparedStep, Variant, available_variants, parse_override, prepare_step
from experiments.tables import efficiency as tables
from primal_jax.launch import host_allocator
from primal_jax.provenance import checkout, provenance

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = "lra"  # primal_jax/tasks/lra/config.py, by name (or pass a config file)
DEFAULT_OUT = ROOT / "benchmarks" / "results"
REFERENCE = "softmax"
SINGLE_MARKER = "EFFICIENCY_SINGLE_JSON "
# Variants whose time grows as N^2 (a softmax layer; YOSO-E's exact expectation, whose memory is linear: it forms
# its N x N kernel one block of queries at a time); they stop at --lengths by default (`--quadratic=` runs all).
QUADRATIC = ("softmax", "softmax_dpa", "primal_plus", "yoso_e")


# ---------------------------------------------------------------------------------------------------------------------
# Process memory of one (variant, N), in a fresh process.


def run_single(args) -> dict:
  """`--single=VARIANT:N`: peak memory of one variant in this (fresh) process; prints a JSON line."""
  name, _, n = args.single.partition(":")
  variant, seq_len = available_variants()[name], int(n)
  device = jax.devices()[0]  # starts the backend, so its memory is part of the baseline
  baseline = process.peak_rss_bytes()
  prepared = prepare_step(variant, seq_len, args, device, warmup_steps=1)  # compile + first step
  compile_peak = process.peak_rss_bytes()
  reset = process.reset_rss_high_water()
  before = process.current_rss_bytes()
  prepared.run(args.memory_steps)
  if prepared.error:
    raise RuntimeError(prepared.error)
  steps_peak = process.peak_rss_bytes()  # since the reset, if there was one
  peak = max(compile_peak, steps_peak)
  out = {
    "variant": name,
    "seq_len": seq_len,
    "rss": {
      "baseline_bytes": baseline,
      "peak_bytes": peak,
      "peak_delta_bytes": peak - baseline,
      "step_delta_bytes": steps_peak - before if reset and before else None,
      "ru_maxrss_bytes": process.ru_maxrss_bytes(),
    },
    "device_memory": bm.device_memory(device),
  }
  print(SINGLE_MARKER + json.dumps(out), flush=True)
  return out


def single_argv(args, variant: str, seq_len: int) -> list[str]:
  argv = [sys.executable, "-m", "benchmarks.efficiency", f"--single={variant}:{seq_len}"]
  argv += [f"--config={args.config}", f"--task={args.task}", f"--batch_size={args.batch_size}"]
  argv += [f"--num_classes={args.num_classes}", f"--seed={args.seed}", f"--memory_steps={args.memory_steps}"]
  argv += [f"--memory_budget_gib={args.memory_budget_gib}", f"--step_budget={args.step_budget}"]
  argv += [f"--set={k}={v!r}" for k, v in args.set]
  return argv


def measure_in_subprocess(args, variant: str, seq_len: int) -> dict:
  """{"rss": ..., "device_memory": ...} of a fresh process running the variant, or {"memory_error": ...}."""
  try:
    proc = subprocess.run(
      single_argv(args, variant, seq_len), capture_output=True, text=True, timeout=args.single_timeout, check=False
    )
  except subprocess.TimeoutExpired:
    return {"memory_error": f"timed out after {args.single_timeout} s"}
  for line in reversed(proc.stdout.splitlines()):
    if line.startswith(SINGLE_MARKER):
      out = json.loads(line[len(SINGLE_MARKER) :])
      return {"rss": out["rss"], "device_memory": out["device_memory"]}
  tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
  return {"memory_error": f"exit {proc.returncode}: {tail[0][:300]}"}


# ---------------------------------------------------------------------------------------------------------------------
# The grid.


def _csv(text: str) -> list[str]:
  return [t.strip() for t in text.split(",") if t.strip()]


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument("--variants", default="all", help="comma list, or 'all': " + ", ".join(available_variants()))
  parser.add_argument("--lengths", default="1024,2048,4096", help="N for every variant")
  parser.add_argument("--long_lengths", default="8192,16384", help="extra N for variants not in --quadratic")
  parser.add_argument("--quadratic", default=",".join(QUADRATIC), help="variants that skip --long_lengths")
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--steps", type=int, default=100, help="timed steps per repeat (extrapolated to 1,000)")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--warmup_steps", type=int, default=2, help="steps after compiling, before timing")
  parser.add_argument("--task", default="listops", help="LRA task of the config (vocabulary, KSVD settings)")
  parser.add_argument("--config", default=DEFAULT_CONFIG)
  parser.add_argument("--num_classes", type=int, default=10)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
    "--set", action="append", default=[], type=parse_override, metavar="KEY=VALUE",
    help="config override, repeatable (e.g. model.attention.primal.rank_multi=2 for N < 200)",
  )  # fmt: skip
  parser.add_argument("--rss", action=argparse.BooleanOptionalAction, default=True, help="process memory per run")
  parser.add_argument("--memory_steps", type=int, default=2, help="steps run by each memory process")
  parser.add_argument("--single_timeout", type=float, default=1800.0)
  parser.add_argument("--peak_size", type=int, default=0, help="matmul peak size (0: 4096 on GPU/TPU, 2048 on CPU)")
  parser.add_argument("--peak_repeats", type=int, default=5)
  parser.add_argument(
    "--allocator", default="system", choices=host_allocator.ALLOCATORS,
    help="host malloc of the whole run (re-executes with it preloaded); tcmalloc speeds up CPU steps",
  )  # fmt: skip
  parser.add_argument(
    "--memory_budget_gib", type=float, default=0.0,
    help="skip (and record) a (variant, N) whose compiled step needs more (XLA's figure); 0: no limit",
  )  # fmt: skip
  parser.add_argument(
    "--step_budget", type=float, default=0.0,
    help="seconds: a variant whose warm-up step takes longer is recorded as not timed, and skipped at larger N",
  )  # fmt: skip
  parser.add_argument("--out", default=str(DEFAULT_OUT))
  parser.add_argument("--single", default="", help=argparse.SUPPRESS)  # VARIANT:N, internal
  args = parser.parse_args(argv)
  for name in ("batch_size", "steps", "repeats", "memory_steps", "peak_repeats"):
    if getattr(args, name) < 1:
      parser.error(f"--{name} must be >= 1")
  return args


def plan_grid(args) -> list[tuple[int, list[Variant]]]:
  """[(N, variants run at N)] in increasing N."""
  variants = available_variants()
  names = list(variants) if args.variants == "all" else _csv(args.variants)
  unknown = [n for n in names if n not in variants]
  if unknown:
    raise ValueError(f"unknown variants {unknown}; available: {', '.join(variants)}")
  quadratic = set(_csv(args.quadratic))
  lengths = [int(n) for n in _csv(args.lengths)]
  long_lengths = [int(n) for n in _csv(args.long_lengths) if int(n) not in lengths]
  grid = [(n, [variants[v] for v in names]) for n in lengths]
  grid += [(n, [variants[v] for v in names if v not in quadratic]) for n in long_lengths]
  return sorted((g for g in grid if g[1]), key=lambda g: g[0])


def _log(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def _meta(args, device: jax.Device) -> dict:
  return {
    "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "git_commit": checkout()[0],  # the commit provenance names (read once per process)
    "provenance": provenance(),
    "jax": jax.__version__,
    "python": platform.python_version(),
    "platform": device.platform,
    "device_kind": device.device_kind,
    "cpu_count": os.cpu_count(),
    "allocator": host_allocator.loaded_allocator(),
    "load_average_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    "reference": REFERENCE,
    "args": {k: v for k, v in vars(args).items() if k != "single"},
  }


def measure_memory(args, grid) -> dict[tuple[str, int], dict]:
  """{(variant, N): process memory} from one fresh process each, run one at a time.

  Runs before this process touches the accelerator: on a GPU, JAX's default preallocation in this
  process would otherwise leave the measuring process short of device memory.
  """
  memory = {}
  for seq_len, variants in grid:
    for variant in variants:
      memory[variant.name, seq_len] = out = measure_in_subprocess(args, variant.name, seq_len)
      rss = (out.get("rss") or {}).get("peak_delta_bytes")
      _log(
        f"[N={seq_len}] {variant.name}: "
        + (f"peak RSS +{rss / bm.MIB:.1f} MiB" if rss is not None else out.get("memory_error", "?"))
      )
  return memory


def run_grid(args) -> dict:
  grid = plan_grid(args)
  memory = measure_memory(args, grid) if args.rss else {}
  device = jax.devices()[0]
  meta = _meta(args, device)
  accelerator = device.platform != "cpu"
  peak_size = args.peak_size or (4096 if accelerator else 2048)
  peak = bm.measure_matmul_peak(peak_size, args.peak_repeats, device=device)
  _log(f"matmul peak: {peak['flops_per_s'] / 1e9:.1f} GFLOP/s ({peak_size}^3 float32 on {device.device_kind})")
  records, over_budget = [], {}  # variant -> (kind, N) of the first budget it exceeded
  for seq_len, variants in grid:
    prepared: dict[str, PreparedStep] = {}
    for variant in variants:
      if variant.name in over_budget:  # a larger N costs more: not run, and said so
        kind, n = over_budget[variant.name]
        error = f"not run: over the {kind} budget at N={n}"
        records.append({"variant": variant.name, "seq_len": seq_len, "error": error, "not_run": kind})
        _log(f"[N={seq_len}] {variant.name}: {error}")
        continue
      try:
        prepared[variant.name] = prepare_step(variant, seq_len, args, device, args.warmup_steps)
      except NotRun as err:
        over_budget[variant.name] = (err.kind, seq_len)
        records.append({"variant": variant.name, "seq_len": seq_len, "error": str(err), "not_run": err.kind})
        _log(f"[N={seq_len}] {variant.name}: {err}")
        continue
      except Exception as err:  # a variant that cannot run at this N (config, memory) must not stop the grid
        records.append({"variant": variant.name, "seq_len": seq_len, "error": f"{type(err).__name__}: {err}"[:500]})
        _log(f"[N={seq_len}] {variant.name}: FAILED {records[-1]['error']}")
        continue
      p = prepared[variant.name]
      _log(
        f"[N={seq_len}] {variant.name}: compiled in {p.compile_seconds:.1f} s, "
        f"{(p.flops or 0) / 1e9:.3f} GFLOP/step, XLA {p.memory.get('total_bytes', 0) / bm.MIB:.1f} MiB"
      )
    times = bm.interleaved_timings({name: p.run for name, p in prepared.items()}, args.repeats)
    for name, p in prepared.items():
      samples = [t for t in times[name] if t == t]  # drop NaN (failed repeats)
      record = {"variant": name, "seq_len": seq_len, "num_params": p.num_params, "batch_size": args.batch_size}
      if p.error or not samples:
        record["error"] = p.error or "no successful repeat"
      else:
        sec_per_step = statistics.median(samples) / args.steps
        record.update(
          steps_per_repeat=args.steps,
          repeat_seconds=times[name],
          sec_per_1k_steps=1000.0 * sec_per_step,
          compile_seconds=p.compile_seconds,
          flops_per_step=p.flops,
          xla_memory=p.memory,
          final_loss=p.loss(),
          **bm.roofline(p.flops, sec_per_step, peak["flops_per_s"]),
        )
        _log(f"[N={seq_len}] {name}: {record['sec_per_1k_steps']:.2f} s / 1k steps")
      records.append(record)
    del prepared  # free this N's states before compiling the next
  for record in records:
    record.update(memory.get((record["variant"], record["seq_len"]), {}))
  meta["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
  return {"meta": meta, "matmul_peak": peak, "records": records}


def write_outputs(results: dict, out_dir: str | Path) -> dict[str, Path]:
  out_dir = Path(out_dir)
  meta, peak = results["meta"], results["matmul_peak"]
  args = meta["args"]
  header = (
    f"# Training efficiency vs sequence length\n\n"
    f"{meta['device_kind']} ({meta['platform']}), jax {meta['jax']}, commit {meta['git_commit'] or '?'}, "
    f"{meta['date']}. LRA `{args['task']}` models (config `{Path(args['config']).name}`, overrides "
    f"{args['set'] or 'none'}), batch {args['batch_size']}, {args['steps']} timed steps x {args['repeats']} "
    f"interleaved repeats (median, extrapolated to 1,000 steps). Matmul peak "
    f"{peak['flops_per_s'] / 1e9:.1f} GFLOP/s. Host allocator {meta.get('allocator', 'system')}. "
    f"Load average at start {meta['load_average_start']}.\n\n"
    "`softmax_dpa` applies no dropout to the attention weights (`jax.nn.dot_product_attention` cannot); "
    "`softmax` and `primal_plus` do (rate 0.1). Process peak RSS includes compiling the step; the "
    "steps-only row resets the high-water mark after compiling.\n\n"
  )
  paths = {
    "json": bm.save_results(out_dir / "efficiency.json", results),
    "markdown": out_dir / "efficiency.md",
    "png": bm.plot_scaling(
      results, out_dir / "efficiency.png", title=f"{meta['device_kind']}, batch {args['batch_size']}"
    ),
  }
  paths["markdown"].write_text(header + tables.results_markdown(results, reference=meta["reference"]) + "\n")
  return paths


def main(argv=None) -> dict:
  """Run the grid (or one `--single` memory measurement); returns the result dict."""
  args = parse_args(argv)
  if args.single:
    return run_single(args)
  host_allocator.ensure_allocator(args.allocator)  # memory subprocesses inherit its LD_PRELOAD
  results = run_grid(args)
  paths = write_outputs(results, args.out)
  print(tables.results_markdown(results, reference=REFERENCE))
  _log("wrote " + ", ".join(str(p) for p in paths.values()))
  return results


if __name__ == "__main__":
  main()
