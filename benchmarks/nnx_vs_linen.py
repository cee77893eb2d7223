r"""NNX vs Linen: forward + backward of one attention layer under jit, on the LRA shapes.

The NNX layers of `primal_jax.nnx` apply the Linen layers to NNX Variables, so the same XLA program is
expected and NNX should cost nothing. For every mechanism and length N this times, interleaved:

  linen     jax.jit(jax.value_and_grad(loss of module.apply(params, x)))           (the Linen idiom)
  nnx.jit   nnx.jit(nnx.value_and_grad(loss of layer(x)))                          (the NNX idiom)
  nnx.split jax.jit of the same loss on (graphdef, state) with nnx.merge inside    (NNX without nnx.jit's
            per-call graph traversal)

and prints the median seconds per call, the ratios to Linen, and whether the optimised HLO of the NNX
program (nnx.split form, the one nnx.jit compiles) equals the Linen one once names and metadata are
removed. The loss is sum(out^2) plus, for Primal layers, the KSVD loss, so the gradient flows through
everything the layer computes.

  python -m benchmarks.nnx_vs_linen                                   # LRA: B=32, N=1024,2048,4096, D=64, H=2
  python -m benchmarks.nnx_vs_linen --lengths=256 --batch=4 --repeats=5  # seconds
"""

from __future__ import annotations

import argparse
import re
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import primal_jax.nnx as pnnx
from benchmarks.harness.measure import call_seconds, interleaved_timings
from primal_jax import markdown
from primal_jax.ksvd import ksvd_loss

# The LRA models' attention (primal_jax/tasks/lra/config.py): dim 64, 2 heads of 32; PrimalFormer's s = 20 (ListOps
# uses 20..40 by task), n = 10 s sampled rows.
LRA_OPTIONS = {"primal": dict(low_rank=20, rank_multi=10), "linformer": dict(max_len=4096)}


def programs(name: str, batch: int, length: int, dim: int, heads: int):
  """{variant: (compiled-or-callable, args)} and the two HLO texts."""

  def build():
    return pnnx.get_attention(name)(num_heads=heads, in_features=dim, rngs=nnx.Rngs(0), **LRA_OPTIONS.get(name, {}))

  # Two equal layers: nnx.jit's calls fill its layer's KSVD terms in place, which would change the pytree of a
  # state split from the same layer (the nnx.split runner compiled on the fresh one).
  layer, jit_layer = build(), build()
  module, variables = pnnx.to_linen(layer)
  x = jnp.asarray(np.random.default_rng(0).standard_normal((batch, length, dim)), jnp.float32)

  def linen_loss(params, x):
    out, state = module.apply({"params": params}, x, mutable=["ksvd"])
    return jnp.sum(out**2) + (ksvd_loss(state["ksvd"]) if state.get("ksvd") else 0.0)

  def nnx_loss(layer, x):
    return jnp.sum(layer(x) ** 2) + pnnx.ksvd_loss(layer, allow_empty=True)

  graphdef, state = nnx.split(layer)

  def split_loss(state, x):
    return nnx_loss(nnx.merge(graphdef, state), x)

  linen = jax.jit(jax.value_and_grad(linen_loss)).lower(variables["params"], x).compile()
  split = jax.jit(jax.value_and_grad(split_loss)).lower(state, x).compile()
  nnx_jit = nnx.jit(nnx.value_and_grad(nnx_loss))
  runners = {
    "linen": (linen, (variables["params"], x)),
    "nnx.jit": (nnx_jit, (jit_layer, x)),
    "nnx.split": (split, (state, x)),
  }
  return runners, linen.as_text(), split.as_text()


SOURCE_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def normalised_hlo(text: str) -> list[str]:
  """The optimised HLO's instructions, without metadata, the module's name and the source-location tables
  (Python file and function names, which differ between the two front ends by construction)."""
  text = re.sub(r",?\s*metadata=\{[^}]*\}", "", text)
  text = re.sub(r",?\s*stack_frame_id=\d+", "", text)
  text = re.sub(r"HloModule \S+", "HloModule m", text)
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  cut = next((i for i, line in enumerate(lines) if line in SOURCE_TABLES), len(lines))
  return lines[:cut]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--names", default="primal,softmax", help="registered attentions, comma-separated")
  parser.add_argument("--lengths", default="1024,2048,4096")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--dim", type=int, default=64)
  parser.add_argument("--heads", type=int, default=2)
  parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds (median)")
  parser.add_argument("--calls", type=int, default=3, help="calls per round")
  args = parser.parse_args(argv)
  rows = []
  for name in args.names.split(","):
    for length in (int(n) for n in args.lengths.split(",")):
      runners, linen_hlo, nnx_hlo = programs(name, args.batch, length, args.dim, args.heads)

      def timer(fn, fn_args):
        return lambda: statistics.median(call_seconds(fn, *fn_args, repeats=args.calls))

      times = interleaved_timings({k: timer(*v) for k, v in runners.items()}, args.repeats)
      med = {k: statistics.median(v) for k, v in times.items()}
      same = normalised_hlo(linen_hlo) == normalised_hlo(nnx_hlo)
      rows.append((name, length, med, same, len(normalised_hlo(linen_hlo)), len(normalised_hlo(nnx_hlo))))
  print(
    f"backend {jax.default_backend()}, batch {args.batch}, dim {args.dim}, heads {args.heads}, "
    f"median of {args.repeats} rounds of {args.calls} calls"
  )
  header = ["attention", "N", "linen ms", "nnx.jit ms", "nnx.split ms", "nnx.jit / linen", "nnx.split / linen"]
  body = []
  for name, length, med, same, n_linen, n_nnx in rows:
    hlo = "yes" if same else f"no ({n_linen} vs {n_nnx} lines)"
    times = [f"{1e3 * med[k]:.2f}" for k in ("linen", "nnx.jit", "nnx.split")]
    body.append(
      [name, length, *times, f"{med['nnx.jit'] / med['linen']:.3f}", f"{med['nnx.split'] / med['linen']:.3f}", hlo]
    )
  print(markdown.table([*header, "same HLO"], body, aligns="l" * 8))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
