r"""The decoding and training-efficiency benchmarks on whatever device JAX sees, in one command.

  python -m benchmarks.accelerator --quick                   # a few minutes on a GPU (minutes more on a CPU)
  python -m benchmarks.accelerator --out=benchmarks/results/accelerator_h200

Writes, under `--out` (default benchmarks/results/accelerator/<platform>_<device kind>_<UTC date>; an existing
non-empty folder is refused, records are never overwritten):

- `device.json`: the device (platform, device kind, count), jax's version, the commit, the memory bandwidth
  (in-place triad over `--triad_elements` float32 elements, on a GPU its HBM) and the matmul peak measured in
  this process in float32 and bfloat16 (the roofline references of both benchmarks);
- `decoding/`: `benchmarks.decoding` (Primal state vs the softmax KV cache per token, the roofline, prefill,
  end-to-end generation, batch scaling); on an accelerator also `decoding_dpa/`, the same with the softmax
  layers through `jax.nn.dot_product_attention` (cuDNN where it applies);
- `efficiency_float32/`, `efficiency_bfloat16/`: `benchmarks.efficiency`'s training step for `softmax_dpa`
  (softmax with `impl="dot_product_attention"`) against `primalformer`, in each dtype.

Each benchmark runs in its own process, one after the other, so each gets the whole device (JAX preallocates
most of a GPU's memory per process) and nothing here assumes a CPU (no host allocator is preloaded). A variant
that fails at a length (out of memory) is recorded as failed and the grid goes on.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# (decoding arguments, efficiency arguments) of a quick and of a full run.
SIZES = {
  "quick": (
    ["--contexts=1024,4096,16384", "--batch=1,8", "--steps=8", "--repeats=3", "--scaling_batches=1,8,32",
     "--prefill_context=1024", "--e2e_prompt=1024", "--e2e_new=64"],
    ["--lengths=1024,4096", "--long_lengths=16384", "--steps=5", "--repeats=3"],
  ),
  "full": (
    ["--contexts=1024,2048,4096,8192,16384,32768,65536", "--batch=1,8", "--steps=16", "--repeats=5",
     "--scaling_batches=1,8,32", "--prefill_context=4096", "--e2e_prompt=1024", "--e2e_new=256"],
    ["--lengths=1024,2048,4096,8192,16384,32768,65536", "--long_lengths=", "--quadratic=", "--steps=20",
     "--repeats=3"],
  ),
}  # fmt: skip
DTYPES = ("float32", "bfloat16")


def device_summary(triad_elements: int, peak_size: int) -> dict:
  """The device and the roofline references measured in this process."""
  import jax
  import jax.numpy as jnp

  from benchmarks.harness import measure as harness
  from primal_jax.provenance import checkout, provenance

  device = jax.devices()[0]
  size = peak_size or (4096 if device.platform != "cpu" else 1024)
  return {
    "platform": device.platform,
    "device_kind": device.device_kind,
    "device_count": jax.device_count(),
    "jax": jax.__version__,
    "git_commit": checkout()[0],  # the commit provenance names (read once per process)
    "provenance": provenance(),
    "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "bandwidth_bytes_per_s": harness.triad_bandwidth(triad_elements, in_place=True),
    "matmul_peak": {
      jnp.dtype(dtype).name: harness.measure_matmul_peak(size, dtype=dtype, device=device)
      for dtype in (jnp.float32, jnp.bfloat16)
    },
  }


def default_out(summary: dict) -> Path:
  kind = re.sub(r"[^A-Za-z0-9]+", "_", summary["device_kind"]).strip("_").lower() or "device"
  return RESULTS / "accelerator" / f"{summary['platform']}_{kind}_{summary['date'][:10]}"


def commands(
  out: Path, size: str, extra_decoding: list[str], extra_efficiency: list[str], platform: str = "cpu"
) -> list[list[str]]:
  """The benchmark processes to run, in order: the decoding benchmark (on an accelerator a second time with the
  softmax layers through jax.nn.dot_product_attention, into decoding_dpa/), then the efficiency one per dtype."""
  decoding_args, efficiency_args = SIZES[size]
  decoding = [sys.executable, "-m", "benchmarks.decoding", *decoding_args, *extra_decoding]
  runs = [[*decoding, f"--out={out / 'decoding'}"]]
  if platform != "cpu":
    runs.append([*decoding, "--softmax_impl=dot_product_attention", f"--out={out / 'decoding_dpa'}"])
  for dtype in DTYPES:
    runs.append([
      sys.executable, "-m", "benchmarks.efficiency", "--variants=softmax_dpa,primalformer", *efficiency_args,
      "--no-rss", f"--set=model.dtype={dtype}", *extra_efficiency, f"--out={out / f'efficiency_{dtype}'}",
    ])  # fmt: skip
  return runs


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument("--quick", action="store_true", help="fewer lengths, steps and repeats (minutes on a GPU)")
  parser.add_argument("--out", type=Path, default=None, help="folder for the records (default: named by the device)")
  parser.add_argument("--triad_elements", type=int, default=2**26, help="float32 elements per triad array")
  parser.add_argument("--peak_size", type=int, default=0, help="matmul peak size (0: 4096 on GPU/TPU, 1024 on CPU)")
  parser.add_argument("--decoding", action="append", default=[], metavar="ARG", help="extra benchmarks.decoding flag")
  parser.add_argument(
    "--efficiency", action="append", default=[], metavar="ARG", help="extra benchmarks.efficiency flag"
  )
  parser.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
  args = parser.parse_args(argv)
  if args.out is not None and args.out.exists() and any(args.out.iterdir()):
    parser.error(f"--out {args.out} already holds files; records are never overwritten: pick a new folder")
  return args


def main(argv=None) -> int:
  args = parse_args(argv)
  # This process measures the device and then only waits: it must not keep JAX's preallocated share of a GPU's
  # memory while each benchmark runs (their allocators then backed off to smaller pools on an H200). The
  # benchmarks themselves start with the caller's environment.
  child_env = dict(os.environ)
  os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  summary = device_summary(args.triad_elements, args.peak_size)
  out = args.out or default_out(summary)
  if out.exists() and any(out.iterdir()):
    print(f"error: {out} already holds files; records are never overwritten: pass --out", file=sys.stderr)
    return 2
  runs = commands(out, "quick" if args.quick else "full", args.decoding, args.efficiency, summary["platform"])
  peaks = ", ".join(f"{k} {v['flops_per_s'] / 1e12:.2f} TFLOP/s" for k, v in summary["matmul_peak"].items())
  print(f"{summary['device_kind']} ({summary['platform']}): triad {summary['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, "
        f"matmul peak {peaks}", flush=True)  # fmt: skip
  if args.dry_run:
    print("\n".join(" ".join(run) for run in runs))
    return 0
  out.mkdir(parents=True, exist_ok=True)
  summary["runs"] = []
  for run in runs:
    start = time.perf_counter()
    print("running: " + " ".join(run[1:]), flush=True)
    code = subprocess.run(run, cwd=ROOT, env=child_env, check=False).returncode
    summary["runs"].append({"argv": run[1:], "returncode": code, "seconds": time.perf_counter() - start})
    (out / "device.json").write_text(json.dumps(summary, indent=1) + "\n")  # after each run: a crash keeps the rest
  failed = [r for r in summary["runs"] if r["returncode"]]
  print(f"wrote {out}" + (f"; {len(failed)} run(s) failed" if failed else ""), flush=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
