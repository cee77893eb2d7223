"""Where a compiled train step's time goes on CPU, against the roofline measured in the same process.

  python -m benchmarks.step_profile --models=primalformer --lengths=1024,4096 --out=benchmarks/results/step_profile

For each (model, N) of the LRA ListOps configuration the efficiency benchmark uses: compile the train step,
trace `--steps` steps with `jax.profiler`, and join every traced XLA op with its instruction in the optimised
HLO. Each op is put in one class by what it computes (a matmul: a dot or a fusion around one; a copy or
transpose; a reduction; the remaining elementwise work) and gets its FLOPs (2 m n k per dot) and the bytes it
reads and writes (operand and result shapes). The same process measures the matmul peak (a large square
float32 matmul), the memory bandwidth (an elementwise triad over 64 MiB arrays) and XLA's rate on the
model's own GEMM shapes ([B*N, 64] x [64, 64], [64, 128] and [128, 64]) alone, so
each class's achieved GFLOP/s and GB/s sit beside what this CPU can do, and the `roofline` column is the time
the class would take if every op ran at max(FLOPs / peak, bytes / bandwidth). That column answers whether a
target such as "40% of the matmul peak" is reachable for a model: it is not when even the roofline time of
the step's memory-bound work leaves the matmul FLOPs below that share.

Reading the trace needs `xprof` (`pip install xprof`); nothing else of it is used. Op times are summed over
the threads XLA:CPU runs independent ops on, so their total can exceed the step's wall time; Eigen dots
(the `dot` ops outside YNNPACK fusions) run asynchronously and show only their dispatch time.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import math
import re
import statistics
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from experiments.tables.step_profile import CLASSES, GEMMS, record_markdown

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4}
DTYPE_BYTES |= {"f64": 8, "s64": 8, "u64": 8}
_SHAPE = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\([^=]*?\)|\S+) ([\w\-]+)\((.*)$", re.M)
_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) .*?\{\n(.*?)^\}", re.M | re.S)


@dataclasses.dataclass(frozen=True)
class Op:
  """One instruction of the optimised HLO: its class, FLOPs and bytes moved per call."""

  name: str
  kind: str  # one of CLASSES
  flops: float
  bytes: float
  source: str  # the JAX op it came from (metadata op_name), for the top-ops table


def shape_bytes(shape: str) -> int:
  """Bytes of an HLO shape string (`f32[8,64]{1,0}` or a tuple of them)."""
  return sum(
    DTYPE_BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d) for dtype, dims in _SHAPE.findall(shape)
  )


def _dims(shape: str) -> list[int]:
  match = _SHAPE.search(shape)
  return [int(d) for d in match.group(2).split(",") if d] if match else []


def _dot_flops(body: str, shapes: Mapping[str, str]) -> float:
  """2 m n k summed over the dots of `body` (k: the product of the lhs contracting dimensions)."""
  flops = 0.0
  for match in _INSTRUCTION.finditer(body):
    _, shape, opcode, rest = match.groups()
    if opcode != "dot":
      continue
    lhs = re.match(r"%([\w.\-]+)", rest)
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
    if not lhs or not contracting or lhs.group(1) not in shapes:
      continue
    lhs_dims = _dims(shapes[lhs.group(1)])
    k = math.prod(lhs_dims[int(i)] for i in contracting.group(1).split(",") if i)
    flops += 2.0 * math.prod(_dims(shape)) * k
  return flops


def _classify(opcode: str, body: str) -> str:
  opcodes = {m.group(3) for m in _INSTRUCTION.finditer(body)} if body else {opcode}
  if opcodes & {"dot", "convolution"}:
    return "matmul"
  if opcodes & {"reduce", "reduce-window"}:
    return "reduction"
  if opcodes & {"copy", "transpose"}:
    return "copy/transpose"
  return "elementwise"


def hlo_ops(hlo_text: str) -> dict[str, Op]:
  """Every instruction outside fused computations of an optimised HLO module (`compiled.as_text()`), by name."""
  computations = {m.group(1): m.group(2) for m in _COMPUTATION.finditer(hlo_text)}
  shapes = {m.group(1): m.group(2) for m in _INSTRUCTION.finditer(hlo_text)}  # names are unique in a module
  fused = set(re.findall(r"\bfusion\(.*?calls=%([\w.\-]+)", hlo_text))
  ops = {}
  outer = (_INSTRUCTION.finditer(body) for name, body in computations.items() if name not in fused)
  for match in (m for matches in outer for m in matches):  # the ops a trace can name: none inside a fusion
    name, shape, opcode, rest = match.groups()
    called = re.search(r"calls=%([\w.\-]+)", rest)
    body = computations.get(called.group(1), "") if called and opcode == "fusion" else ""
    operands = re.findall(r"%([\w.\-]+)", rest.split("),")[0])
    moved = shape_bytes(shape) + sum(shape_bytes(shapes[o]) for o in operands if o in shapes)
    flops = _dot_flops(body or match.group(0), shapes)
    source = re.search(r'op_name="([^"]*)"', rest)
    ops[name] = Op(name, _classify(opcode, body), flops, float(moved), source.group(1) if source else "")
  return ops


def op_times(events: Iterable[Mapping], ops: Mapping[str, Op], steps: int) -> dict[str, float]:
  """Seconds per step of each HLO op in a trace (`traceEvents` of xprof's trace viewer), summed over threads."""
  seconds: dict[str, float] = {}
  for event in events:
    name = event.get("name", "")
    if event.get("ph") == "X" and name in ops:
      seconds[name] = seconds.get(name, 0.0) + float(event.get("dur", 0.0)) * 1e-6 / steps
  return seconds


def summarise(ops: Mapping[str, Op], seconds: Mapping[str, float], peak: float, bandwidth: float) -> list[dict]:
  """One row per class: time, its share, FLOPs, bytes, achieved rates and the roofline time."""
  total = sum(seconds.values()) or 1.0
  rows = []
  for kind in CLASSES:
    names = [n for n in seconds if ops[n].kind == kind]
    t = sum(seconds[n] for n in names)
    flops, moved = sum(ops[n].flops for n in names), sum(ops[n].bytes for n in names)
    roofline = sum(max(ops[n].flops / peak, ops[n].bytes / bandwidth) for n in names)
    rows.append({
      "class": kind, "ops": len(names), "seconds": t, "share": t / total, "flops": flops, "bytes": moved,
      "flops_per_s": flops / t if t else 0.0, "bytes_per_s": moved / t if t else 0.0, "roofline_seconds": roofline,
    })  # fmt: skip
  return rows


def triad_bandwidth(elements: int, repeats: int = 20) -> float:
  """`benchmarks.harness.measure.triad_bandwidth` (imported when called: this module starts without JAX)."""
  from benchmarks.harness.measure import triad_bandwidth as measure

  return measure(elements, repeats)


def gemm_rates(rows: int, widths=((64, 64), (64, 128), (128, 64)), repeats: int = 10) -> dict[str, float]:
  """Median FLOP/s XLA:CPU reaches on the model's own matmuls alone (jitted, float32), each of the three forms."""
  import jax
  import jax.numpy as jnp

  from benchmarks.harness.measure import call_seconds

  rates = {}
  for k, n in widths:
    arrays = {"x": jnp.ones((rows, k)), "w": jnp.ones((k, n)), "dy": jnp.ones((rows, n))}  # float32
    for label, (spec, lhs, rhs) in GEMMS.items():
      product = jax.jit(lambda a, b, spec=spec: jnp.einsum(spec, a, b))
      seconds = call_seconds(product, arrays[lhs], arrays[rhs], repeats=repeats)
      rates[f"{label}, k={k}, n={n}"] = 2.0 * rows * k * n / statistics.median(seconds)
  return rates


def read_trace(trace_dir: str) -> list[dict]:
  """The trace viewer events of the `.xplane.pb` that `jax.profiler` wrote under `trace_dir` (needs xprof)."""
  try:
    from xprof.convert import raw_to_tool_data
  except ImportError as err:
    raise SystemExit("benchmarks.step_profile reads the trace with xprof: pip install xprof") from err
  (path,) = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)
  data, _ = raw_to_tool_data.xspace_to_tool_data([path], "trace_viewer", {})
  return json.loads(data)["traceEvents"]


def profile(model: str, seq_len: int, args) -> dict:
  """Compile, warm up, time and trace one (model, N); returns its record."""
  import jax

  from benchmarks import train_step
  from benchmarks.harness import measure as bm

  variant = train_step.available_variants()[model]
  step_args = argparse.Namespace(
    config="lra", task="listops", set=args.set, batch_size=args.batch_size, num_classes=10, seed=0, steps=1
  )
  prepared = train_step.prepare_step(variant, seq_len, step_args, jax.devices()[0], warmup_steps=args.warmup_steps)
  start = time.perf_counter()
  prepared.run(args.steps)
  wall = (time.perf_counter() - start) / args.steps
  with tempfile.TemporaryDirectory() as trace_dir:
    jax.profiler.start_trace(trace_dir)
    prepared.run(args.steps)
    jax.profiler.stop_trace()
    events = read_trace(trace_dir)
  ops = hlo_ops(prepared.compiled.as_text())
  seconds = op_times(events, ops, args.steps)
  measured = bm.measure_matmul_peak(args.peak_size)
  peak = measured["flops"] / min(measured["seconds"])  # the best repeat: a peak, not a typical rate
  bandwidth = triad_bandwidth(args.triad_elements)
  gemms = gemm_rates(args.batch_size * seq_len)
  top = sorted(seconds, key=seconds.get, reverse=True)[: args.top]
  return {
    "model": model, "seq_len": seq_len, "batch_size": args.batch_size, "wall_seconds": wall,
    "op_seconds": sum(seconds.values()),
    "step_flops": prepared.flops, "matmul_peak": peak, "bandwidth": bandwidth, "gemm_rates": gemms,
    "classes": summarise(ops, seconds, peak, bandwidth), "loss": prepared.loss(),
    "top": [{**dataclasses.asdict(ops[n]), "seconds": seconds[n]} for n in top],
  }  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument("--models", default="primalformer", help="comma-separated efficiency variants")
  parser.add_argument("--lengths", default="4096", help="comma-separated N")
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--steps", type=int, default=3, help="traced steps (and as many timed before)")
  parser.add_argument("--warmup_steps", type=int, default=2)
  parser.add_argument("--peak_size", type=int, default=2048, help="side of the square matmul that measures the peak")
  parser.add_argument("--triad_elements", type=int, default=2**24, help="float32 elements per triad array (DRAM-sized)")
  parser.add_argument("--top", type=int, default=15, help="ops listed one by one")
  parser.add_argument("--allocator", default="auto", help="host malloc: auto, system, tcmalloc, jemalloc")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
  parser.add_argument("--out", default="", help="directory for step_profile.json and step_profile.md")
  return parser.parse_args(argv)


def main(argv=None) -> list[dict]:
  args = parse_args(argv)
  from primal_jax.launch import host_allocator

  host_allocator.ensure_allocator(args.allocator)  # before JAX starts: re-executes with the library preloaded
  records = [
    profile(model, int(n), args) for model in args.models.split(",") for n in args.lengths.split(",") if n.strip()
  ]
  text = "\n\n".join(record_markdown(r) for r in records)
  print(text)
  if args.out:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"allocator": host_allocator.loaded_allocator(), "argv": argv, "date": time.strftime("%Y-%m-%d")}
    (out / "step_profile.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))
    (out / "step_profile.md").write_text(text + "\n")
  return records


if __name__ == "__main__":
  main()
