r"""Side by side with the authors' PyTorch release: the LRA ListOps training step, same allocator, same threads.

  python -m benchmarks.vs_release --release_dir=/tmp/release --torch_python=/work/torch_venv/bin/python \
    --allocators=system,tcmalloc --out=benchmarks/results/vs_release      # the full comparison (quiet machine)
  python -m benchmarks.vs_release --sides=ours --lengths=256 --steps=2 --warmup_steps=1 --out=/tmp/vs  # seconds

Why this script: a speed ratio between two implementations means something only when both ran on the same
machine at the same time under the same conditions. The README's earlier ratio compared our tcmalloc runs
with the release's glibc-malloc figures; tcmalloc speeds the release up too. So here:

- the release's own model code (`PrimalAttention_LRA/PrimalFormer/model_wrapper.py` from `--release_dir`, an
  extraction of the authors' repository that is never committed) runs unmodified (`benchmarks.release_step`,
  in `--torch_python`, an interpreter with torch), and ours is the packaged `lra` config (`task=listops`);
- both are the ListOps model (2 layers, dim 64, hidden 128, 2 heads x 32, dropout 0.1, PrimalFormer s = 20,
  rank_multi 10, eta 0.1; softmax with dropout on the attention weights) at batch `--batch_size`, float32,
  on full-length synthetic batches (no data loading on either side);
- every (allocator, N, model, side) runs in a fresh process of its own, the sides alternating first in each
  configuration and round, so neither side inherits the other's heap or caches and drift hits both;
- both sides get the same host allocator (LD_PRELOAD of tcmalloc / jemalloc, or glibc for `system`; each
  process checks what is mapped) and the same threads: the process pinned to `--threads` cores (XLA:CPU
  sizes its intra-op pool from that mask; `--xla_cpu_multi_thread_eigen=true` is passed explicitly),
  torch.set_num_threads(threads) with one inter-op thread, and OMP/MKL_NUM_THREADS = threads;
- each timed step records its seconds and the cores other processes kept busy meanwhile
  (`benchmarks.harness.process`), so a contended run is visible in the table instead of silently slow.

Outputs in `--out`: vs_release.json (every process's record) and vs_release.md (the table, also printed);
the docs table is `<!-- table:vs_release:<dir> begin -->` (`python -m experiments.docs_tables`).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

from benchmarks.harness import process
from benchmarks.release_step import MARKER as RELEASE_MARKER

ROOT = Path(__file__).resolve().parents[1]
OURS_MARKER = "OURS_STEP_JSON "
MODELS = ("primalformer", "softmax")
SIDES = ("release", "ours")
BASE_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=true"


# ---------------------------------------------------------------------------------------------------------------------
# Our side: one process per configuration (`--worker=MODEL:N`).


def run_ours(args) -> dict:
  """Compile our train step for `args.worker` ("MODEL:N"), time it step by step; prints one JSON line."""
  model, _, n = args.worker.partition(":")
  cores = process.pin_threads(args.threads)  # before JAX starts its CPU client
  os.environ["XLA_FLAGS"] = " ".join(f for f in (os.environ.get("XLA_FLAGS", ""), BASE_XLA_FLAGS, args.xla_flags) if f)
  import jax

  from benchmarks import train_step
  from benchmarks.harness import measure as bm
  from primal_jax.provenance import device_summary

  device = jax.devices()[0]
  variant = train_step.available_variants()[model]
  step_args = argparse.Namespace(
    config="lra", task=args.task, set=args.set, batch_size=args.batch_size, num_classes=10, seed=args.seed, steps=1
  )
  prepared = train_step.prepare_step(variant, int(n), step_args, device, warmup_steps=args.warmup_steps)
  samples, losses = [], []
  for _ in range(args.steps):
    samples.append(process.timed_with_load(lambda: prepared.run(1)))
    losses.append(prepared.loss())
  if prepared.error:
    raise RuntimeError(prepared.error)
  peak = bm.measure_matmul_peak(args.peak_size, device=device) if args.peak_size else None
  out = {
    "side": "ours",
    "model": model,
    "seq_len": int(n),
    "batch_size": args.batch_size,
    "num_params": prepared.num_params,
    "steps": samples,
    "losses": losses,
    "peak_rss_bytes": process.peak_rss_bytes(),
    "allocator": process.mapped_allocator(),
    "threads": {"cores": cores, "xla_flags": os.environ["XLA_FLAGS"], "process_threads": process.thread_count()},
    "flops_per_step": prepared.flops,
    "compile_seconds": prepared.compile_seconds,
    "matmul_peak": None if peak is None else {k: peak[k] for k in ("size", "flops_per_s", "seconds")},
    "versions": {"jax": jax.__version__, "python": platform.python_version()},
    "devices": device_summary(),
  }
  print(OURS_MARKER + json.dumps(out), flush=True)
  return out


# ---------------------------------------------------------------------------------------------------------------------
# The parent: plan, run the processes interleaved, summarise.


def _csv(text: str) -> list[str]:
  return [t.strip() for t in text.split(",") if t.strip()]


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument("--release_dir", default="", help="the authors' repository, extracted")
  parser.add_argument("--torch_python", default="", help="python with torch for the release's side")
  parser.add_argument("--sides", default="release,ours", help="comma list of: release, ours")
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--lengths", default="1024,2048,4096")
  parser.add_argument("--allocators", default="system,tcmalloc", help="comma list of: system, tcmalloc, jemalloc")
  parser.add_argument("--threads", type=int, default=2, help="cores pinned and threads on both sides")
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--warmup_steps", type=int, default=3)
  parser.add_argument("--steps", type=int, default=10, help="timed steps per process")
  parser.add_argument("--rounds", type=int, default=2, help="processes per (allocator, N, model, side)")
  parser.add_argument("--task", default="listops")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--peak_size", type=int, default=2048, help="matmul peak measured in every process (0: skip)")
  parser.add_argument("--xla_flags", default="", help="extra XLA_FLAGS for our side (recorded)")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override, ours only")
  parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per process")
  parser.add_argument("--out", default="")
  parser.add_argument("--worker", default="", help=argparse.SUPPRESS)  # MODEL:N, internal
  args = parser.parse_args(argv)
  if not args.worker:
    args.sides = _csv(args.sides)
    if "release" in args.sides and not (args.release_dir and args.torch_python):
      parser.error("the release's side needs --release_dir and --torch_python (or pass --sides=ours)")
  args.set = [_override(s) for s in args.set]
  return args


def _override(text: str) -> tuple[str, object]:
  """`model.x=2` -> ("model.x", 2), as `benchmarks.train_step.parse_override` (not imported: it loads JAX, and
  the worker must pin its cores before JAX starts)."""
  key, sep, value = text.partition("=")
  if not sep:
    raise ValueError(f"--set expects key=value, got {text!r}")
  try:
    return key.strip(), ast.literal_eval(value)
  except (ValueError, SyntaxError):
    return key.strip(), value


def plan(args) -> list[dict]:
  """Every process to run, in order: rounds x allocators x lengths x models x sides (first side alternating)."""
  jobs, flip = [], 0
  for round_index in range(args.rounds):
    for allocator in _csv(args.allocators):
      for n in (int(v) for v in _csv(args.lengths)):
        for model in _csv(args.models):
          sides = args.sides if flip % 2 == 0 else list(reversed(args.sides))
          flip += 1
          jobs += [dict(round=round_index, allocator=allocator, seq_len=n, model=model, side=s) for s in sides]
  return jobs


def job_argv(args, job: dict) -> list[str]:
  common = [f"--batch_size={args.batch_size}", f"--warmup_steps={args.warmup_steps}", f"--steps={args.steps}"]
  common += [f"--threads={args.threads}", f"--seed={args.seed}", f"--peak_size={args.peak_size}", f"--task={args.task}"]
  if job["side"] == "release":
    return [
      args.torch_python, "-m", "benchmarks.release_step", f"--release_dir={args.release_dir}",
      f"--model={job['model']}", f"--seq_len={job['seq_len']}", *common,
    ]  # fmt: skip
  argv = [sys.executable, "-m", "benchmarks.vs_release", f"--worker={job['model']}:{job['seq_len']}", *common]
  argv += [f"--xla_flags={args.xla_flags}"] if args.xla_flags else []
  return argv + [f"--set={k}={v!r}" for k, v in args.set]


def job_environment(allocator: str) -> dict[str, str]:
  """The environment of one process: `allocator` preloaded (nothing for "system"), no inherited preload."""
  from primal_jax.launch import host_allocator

  env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", host_allocator.REEXEC_MARKER)}
  if allocator == "system":
    return env
  library = host_allocator.find_library(allocator)
  if library is None:
    raise ValueError(f"allocator {allocator!r} is not installed (apt-get install {host_allocator.PACKAGES[allocator]})")
  return host_allocator.preload_environment(library, env)


def run_job(args, job: dict) -> dict:
  """The process's record (its JSON line) with the job's fields, or the job with an "error"."""
  marker = RELEASE_MARKER if job["side"] == "release" else OURS_MARKER
  try:
    proc = subprocess.run(
      job_argv(args, job), cwd=ROOT, env=job_environment(job["allocator"]), capture_output=True, text=True,
      timeout=args.timeout, check=False,
    )  # fmt: skip
  except subprocess.TimeoutExpired:
    return {**job, "error": f"timed out after {args.timeout} s"}
  for line in reversed(proc.stdout.splitlines()):
    if line.startswith(marker):
      record = {**job, **json.loads(line[len(marker) :])}
      if record["allocator"] != job["allocator"]:
        record["error"] = f"asked for {job['allocator']}, the process ran with {record['allocator']}"
      return record
  tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:] or ["no output"]
  return {**job, "error": f"exit {proc.returncode}: {' | '.join(tail)[:600]}"}


def run(args) -> dict:
  from experiments.tables import vs_release as tables  # imports JAX: never at module level (see run_ours)
  from primal_jax.provenance import checkout, provenance

  meta = {
    "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "git_commit": checkout()[0],  # the commit provenance names (read once per process)
    "provenance": provenance(devices=False),
    "machine": platform.machine(),
    "cpu_count": os.cpu_count(),
    "load_average_start": list(os.getloadavg()),
    "args": {k: v for k, v in vars(args).items() if k != "worker"},
  }
  records = []
  jobs = plan(args)
  for allocator in dict.fromkeys(job["allocator"] for job in jobs):
    job_environment(allocator)  # an allocator that is not installed fails here, before hours of runs
  for i, job in enumerate(jobs):
    records.append(run_job(args, job))
    print(f"[{i + 1}/{len(jobs)}] {tables.summary_line(records[-1])}", file=sys.stderr, flush=True)
  meta["load_average_end"] = list(os.getloadavg())
  ours = next((r["devices"] for r in records if r.get("devices")), None)  # the torch side runs on the CPU
  if ours:
    meta["platform"], meta["device_kind"] = ours["platform"], ours["kind"]
  return {"meta": meta, "records": records}


def save(results: dict, out_dir: str | Path) -> list[Path]:
  from experiments.tables import vs_release as tables  # imports JAX: never at module level (see run_ours)

  def clean(value):
    if isinstance(value, float) and not math.isfinite(value):
      return None
    if isinstance(value, dict):
      return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
      return [clean(v) for v in value]
    return value

  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  paths = [out / "vs_release.json", out / "vs_release.md"]
  paths[0].write_text(json.dumps(clean(results), indent=1) + "\n")
  paths[1].write_text("# primal_jax vs the PyTorch release\n\n" + tables.results_markdown(results) + "\n")
  return paths


def main(argv=None) -> dict:
  args = parse_args(argv)
  if args.worker:
    return run_ours(args)
  from experiments.tables import vs_release as tables  # imports JAX: never before run_ours pins the cores

  results = run(args)
  print(tables.results_markdown(results))
  if args.out:
    print("wrote " + ", ".join(str(p) for p in save(results, args.out)), file=sys.stderr)
  return results


if __name__ == "__main__":
  main()
