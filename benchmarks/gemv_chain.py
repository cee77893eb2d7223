r"""The PrimalFormer decode step's weight products alone, chained: what batch-1 matrix-vector products reach here.

  python -m benchmarks.gemv_chain --out=benchmarks/results/gemv_chain

At batch 1 a decode step of the decoding benchmark's PrimalFormer (`benchmarks.decoding`, variant `primal_state`)
spends most of its time in its weight products, each a [1, K] x [K, N] matrix-vector product (the
query, key and output projections and the two feed-forward layers of every block, then the LM head; Primal's
[p, s] head weights and its combine layer are a few KiB and left out). This benchmark times those products alone,
in the step's order, each output (through a tanh) the next one's input, compiled as one loop of `--steps` chains,
in several formulations:

- `xla`: `x @ W`, as the model computes it;
- `xla_split2`: each W stored as two column halves, two independent products (XLA:CPU may run independent
  ops on two threads) whose outputs are joined;
- `xla_transposed`: `W^T x` as a [N, 1] column (the operands swapped, which changes Eigen's split of the work);
- `xla_tp2`: tensor parallel over two host devices (`shard_map`; W split by columns, then by rows, a `psum`
  after each pair), each device's part on its own thread;
- `step`: the whole decode step itself, for comparison (`benchmarks.decoding`'s runner: `primal_state` at
  context 1,024, batch 1, the difference of a `--steps` and a 1-step greedy loop per token; its bytes are every
  weight it reads and its state);
- `numpy`: the same chain with NumPy (its BLAS decides the threads; each product and tanh is a Python call, so
  this row also shows what dispatching the step op by op from the host would cost).

On all cores it also chains square [K, K] products alone (K = `--widths`), over distinct weights of about the
chain's bytes (so they are read from the same cache level), to show from which size a product shares its work
between the cores (CPU seconds per wall second above 1).

Each configuration runs in a process of its own on the host CPU (`JAX_PLATFORMS=cpu`), started with its cores
(`--cores`: every core this process may use, then 1, pinned before JAX starts; `xla_tp2` with two host devices),
which also measures the read-only bound at the chain's bytes (`harness.read_bandwidth_at`, the best of four
streams) on the same cores. So the table shows what each formulation reaches on all cores and on one against the
bound of that many cores, and the CPU seconds per wall second of its loop (how many threads it keeps busy).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

FORMULATIONS = ("xla", "xla_split2", "xla_transposed", "numpy", "step")
TP = "xla_tp2"
SIZES = "sizes"  # the square products by width (all cores only)


def configurations(cores: int) -> list[tuple[int, int, tuple[str, ...]]]:
  """(cores, host devices, formulations) of each worker process: all `cores`, then one, then the two-device split."""
  if cores < 2:
    return [(1, 1, (*FORMULATIONS, SIZES))]
  return [(cores, 1, (*FORMULATIONS, SIZES)), (1, 1, FORMULATIONS), (cores, 2, (TP,))]


def weight_matrices(layers: int, dim: int, heads: int, low_rank: int) -> list:
  """The decode step's [K, N] weight products in the step's order (float32 NumPy, the model's initialisation, each
  scaled to unit gain, W / (std(W) sqrt(K)): the chain's values then stay of order 1 instead of decaying into
  subnormals, which NumPy would not flush to zero as XLA:CPU does)."""
  import numpy as np

  from benchmarks.decoding import build

  model_args = argparse.Namespace(layers=layers, dim=dim, heads=heads, low_rank=low_rank, softmax_impl="einsum")
  _, params = build("primal_state", 1024, model_args)
  mats = []
  for i in range(layers):
    block = params["decoder"][f"block_{i}"]
    attention, mlp = block["attention"], block["mlp"]
    for kernel in (attention["query"]["kernel"], attention["key"]["kernel"]):
      mats.append(np.asarray(kernel).reshape(dim, -1))  # [D, H, p] -> [D, H p]
    mats.append(np.asarray(attention["out"]["kernel"]).reshape(-1, dim))  # [H, p, D] -> [H p, D]
    mats += [np.asarray(mlp["fc_in"]["kernel"]), np.asarray(mlp["fc_out"]["kernel"])]
  mats.append(np.asarray(params["lm_head"]["kernel"]))
  return [(w / (w.std() * np.sqrt(w.shape[0]))).astype(np.float32) for w in mats]


def _chain(product):
  """x -> tanh(product(x, W)) over every W in order: each product needs the last one's output. The next
  chain's input is 1 + the last output's mean in every entry (the LM head's width is the vocabulary)."""
  import jax.numpy as jnp

  def run(x, mats):
    y = x
    for w in mats:
      y = jnp.tanh(product(y, w))
    return jnp.broadcast_to(1.0 + jnp.mean(y), x.shape)

  return run


def xla_runner(formulation: str, mats: list, steps: int):
  """(jitted loop of `steps` chains, its arguments) for an XLA formulation."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  x = jnp.ones((1, mats[0].shape[0]), jnp.float32)
  if formulation == "xla":
    chain, weights = _chain(jnp.matmul), [jnp.asarray(w) for w in mats]
  elif formulation == "xla_split2":
    halves = [tuple(jnp.asarray(h.copy()) for h in np.split(w, 2, axis=1)) for w in mats]
    chain, weights = _chain(lambda x, w: jnp.concatenate([x @ w[0], x @ w[1]], axis=-1)), halves
  elif formulation == "xla_transposed":
    x = x.T  # a [K, 1] column; each product contracts W's rows with it: [N, 1]
    chain = _chain(lambda x, w: jax.lax.dot_general(w, x, (((0,), (0,)), ((), ()))))
    weights = [jnp.asarray(w) for w in mats]
  elif formulation == TP:
    chain, weights = tensor_parallel(mats)
  else:
    raise ValueError(f"formulation must be one of {', '.join((*FORMULATIONS, TP))}, got {formulation!r}")
  loop = jax.jit(lambda x, ws: jax.lax.fori_loop(0, steps, lambda _, x: chain(x, ws), x))
  return loop, (x, weights)


def tensor_parallel(mats: list):
  """Megatron's split over two host devices: W of even index by columns, the next by rows, a psum after it."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  if len(jax.devices()) < 2 or len(mats) % 2 != 1:
    raise ValueError(f"{TP} needs 2 devices and an odd number of products, got {len(jax.devices())}, {len(mats)}")
  mesh = Mesh(np.array(jax.devices()[:2]), ("m",))
  specs = [P(None, "m") if i % 2 == 0 else P("m", None) for i in range(len(mats) - 1)] + [P()]
  weights = [jax.device_put(jnp.asarray(w), NamedSharding(mesh, s)) for w, s in zip(mats, specs, strict=True)]

  def local(x, ws):
    y = x
    for i, w in enumerate(ws):
      y = y @ w
      if i % 2 == 1:  # the row-split product's partial sums; after a column split each device holds its half
        y = jax.lax.psum(y, "m")
      y = jnp.tanh(y)
    return jnp.broadcast_to(1.0 + jnp.mean(y), x.shape)

  chain = jax.shard_map(local, mesh=mesh, in_specs=(P(), specs), out_specs=P(), check_vma=False)
  return chain, weights


def numpy_runner(mats: list, steps: int):
  import numpy as np

  def loop(x, ws):
    for _ in range(steps):
      y = x
      for w in ws:
        y = np.tanh(y @ w)
      x = np.full_like(x, 1.0 + y.mean())
    return x

  return loop, (np.ones((1, mats[0].shape[0]), np.float32), mats)


def timed(loop, args, repeats: int) -> tuple[float, float]:
  """(best wall seconds of a call, median CPU seconds per wall second), after one untimed warm-up call."""
  import statistics

  import jax

  jax.block_until_ready(loop(*args))
  walls, busy = [], []
  for _ in range(repeats):
    start, cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(loop(*args))
    wall = time.perf_counter() - start
    walls.append(wall)
    busy.append((time.process_time() - cpu) / wall)
  return min(walls), statistics.median(busy)


def decode_step_row(args) -> dict:
  """The whole PrimalFormer decode step at context 1,024, batch 1: ms per token (`benchmarks.decoding`'s runner)."""
  import statistics

  from benchmarks.decoding import marginal_times, prepared_runner

  step_args = argparse.Namespace(
    layers=args.layers, dim=args.dim, heads=args.heads, low_rank=args.low_rank, steps=args.steps, fill="synthetic",
    prefill_chunk=256, softmax_impl="einsum",
  )  # fmt: skip
  step_args.repeats = args.repeats
  run, sizes, samples = prepared_runner("primal_state", 1024, 1, step_args)
  seconds = marginal_times({"step": run}, {"step": samples}, step_args, "context 1024")["step"]
  busy = statistics.median(samples["cpu_per_wall"])
  return {"formulation": "step", "ms_per_chain": 1e3 * seconds, "cpu_per_wall": busy, "bytes": sizes["bytes_per_step"]}


def size_rows(widths: list[int], nbytes: int, args) -> list[dict]:
  """Square products by width: ms and GB/s per product, and the threads they keep busy."""
  import numpy as np

  rows = []
  rng = np.random.default_rng(0)
  for k in widths:
    count = max(1, nbytes // (4 * k * k))
    mats = [(rng.standard_normal((k, k)) / np.sqrt(k)).astype(np.float32) for _ in range(count)]
    loop, loop_args = xla_runner("xla", mats, args.steps)
    seconds, busy = timed(loop, loop_args, args.repeats)
    per_product = seconds / args.steps / count
    rows.append({
      "width": k, "products": count, "mib_each": 4 * k * k / 2**20, "us_per_product": 1e6 * per_product,
      "bytes_per_s": 4 * k * k / per_product, "cpu_per_wall": busy,
    })  # fmt: skip
    del mats, loop_args
  return rows


def worker(args) -> dict:
  """One configuration's measurements: each formulation's chain and the read bound at its bytes."""
  import jax

  from benchmarks.harness import measure as harness

  mats = weight_matrices(args.layers, args.dim, args.heads, args.low_rank)
  nbytes = sum(w.nbytes for w in mats)
  rows, sizes = [], []
  for formulation in args.formulations.split(","):
    if formulation == SIZES:
      sizes = size_rows([int(k) for k in args.widths.split(",")], nbytes, args)
      continue
    if formulation == "step":
      rows.append(decode_step_row(args))
      continue
    if formulation == "numpy":
      loop, loop_args = numpy_runner(mats, args.steps)
    else:
      loop, loop_args = xla_runner(formulation, mats, args.steps)
    seconds, busy = timed(loop, loop_args, args.repeats)
    rows.append({"formulation": formulation, "ms_per_chain": 1e3 * seconds / args.steps, "cpu_per_wall": busy})
  # The chain's bytes always (the configuration's bandwidth), then each other size a row reads.
  rates = {nbytes: harness.read_bandwidth_at(nbytes, repeats=args.sized_repeats)}
  for row in rows:
    row.setdefault("bytes", nbytes)
    if row["bytes"] not in rates:
      rates[row["bytes"]] = harness.read_bandwidth_at(row["bytes"], repeats=args.sized_repeats)
    row["bound_ms"] = 1e3 * row["bytes"] / rates[row["bytes"]]["best"]
    row["bound_fraction"] = row["bound_ms"] / row["ms_per_chain"]
  return {
    "cores": len(os.sched_getaffinity(0)), "host_devices": len(jax.devices()), "bytes": nbytes,
    "products": len(mats), "read_bandwidth": rates[nbytes],
    "rows": rows, "sizes": sizes,
  }  # fmt: skip


def run_configuration(cores: int, devices: int, formulations, args) -> dict:
  """`worker` in a fresh process pinned to `cores` cores with `devices` host devices."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")  # the host's cores are what this measures, wherever JAX could run
  if devices > 1:
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
  command = [sys.executable, "-m", "benchmarks.gemv_chain", "--worker", f"--cores={cores}"]
  command += [f"--formulations={','.join(formulations)}", *(f"--{k}={getattr(args, k)}" for k in MODEL_FLAGS)]
  done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
  if done.returncode != 0:
    raise SystemExit(f"the {cores}-core worker failed:\n{done.stderr[-3000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


MODEL_FLAGS = ("layers", "dim", "heads", "low_rank", "steps", "repeats", "sized_repeats", "widths")


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--dim", type=int, default=256)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--low_rank", type=int, default=20)
  parser.add_argument("--steps", type=int, default=64, help="chains per timed call")
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--sized_repeats", type=int, default=5)
  parser.add_argument("--widths", default="256,512,1024,2048", help="K of the square [K, K] products alone")
  parser.add_argument("--out", default="", help="folder for gemv_chain.json and gemv_chain.md")
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--cores", type=int, default=0, help=argparse.SUPPRESS)
  parser.add_argument("--formulations", default=",".join(FORMULATIONS), help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  for name in ("layers", "dim", "heads", "repeats", "sized_repeats"):
    if getattr(args, name) < 1:
      parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
  try:
    widths = [int(k) for k in args.widths.split(",")]
  except ValueError:
    widths = []
  if not widths or min(widths) < 1:
    parser.error(f"--widths must be positive integers separated by commas, got {args.widths!r}")
  if args.steps < 2:
    parser.error(f"--steps must be >= 2 (the step's time per token is a difference of two loops), got {args.steps}")
  return args


def main(argv=None) -> dict:
  args = parse_args(argv)
  if args.worker:
    from benchmarks.harness.process import pin_threads

    pin_threads(args.cores)  # before JAX starts: XLA sizes its thread pool from the affinity mask
    print(json.dumps(worker(args)))
    return {}
  from experiments.tables.gemv_chain import record_markdown
  from primal_jax.provenance import checkout, provenance

  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
  measured = [run_configuration(c, d, f, args) for c, d, f in configurations(cores)]
  meta = {
    "git_commit": checkout()[0], "provenance": provenance(), "date": time.strftime("%Y-%m-%d"),
    "command": "python -m benchmarks.gemv_chain " + " ".join(f"--{k}={getattr(args, k)}" for k in MODEL_FLAGS),
    "config": {k: getattr(args, k) for k in MODEL_FLAGS},
  }  # fmt: skip
  results = {"meta": meta, "configurations": measured}
  text = record_markdown(results)
  print(text)
  if args.out:
    from benchmarks.harness.measure import save_results

    out = Path(args.out)
    save_results(out / "gemv_chain.json", results)
    (out / "gemv_chain.md").write_text(text + "\n")
  return results


if __name__ == "__main__":
  main()
