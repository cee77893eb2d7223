r"""Per-token decoding time and decoding-state size against the context length: Primal's O(1) state vs a KV cache.

  python -m benchmarks.decoding --contexts=256,512,1024,2048,4096 --out=benchmarks/results/decoding

Two `CausalLM`s of the same size (`--layers` layers, `--dim`, `--heads`, byte vocabulary) differ only in their
attention: `softmax_kv_cache` (every layer softmax, decoding from a key/value cache) and `primal_state`
(every layer causal Primal-Attention with data-independent weights, decoding from the running sums of q and
k). For each context length c, each model gets a cache sized for c (`max_len = c`, what a KV cache must hold
to reach that context), is prefilled to position c - steps - 1, and then `--steps` single-token decode steps
are timed (the last one at position c - 2); repeats are interleaved across the two models and the median is
reported, as seconds per token and its ratio to the KV cache, with the state's size in bytes. The machine is
shared and noisy: compare the two rows of one run, not runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from benchmarks import harness
from primal_jax.models.config import TransformerConfig
from primal_jax.models.lm import CausalLM, decode_step, init_cache

VARIANTS = {"softmax_kv_cache": "softmax", "primal_state": "primal"}
PLOT_METRICS = (
  ("ms_per_token", "ms per decoded token", 1.0),
  ("state_bytes", "decoding state (MiB)", harness.MIB),
)


def build(variant: str, context: int, args) -> tuple[CausalLM, dict]:
  """The model of `variant` with a `context`-position cache, and its (random) parameters."""
  config = TransformerConfig(
    layers=(VARIANTS[variant],) * args.layers,
    attention={"primal": {"low_rank": args.low_rank, "data_dependent": False}},
    vocab_size=256, max_len=context, dim=args.dim, hidden_dim=4 * args.dim, num_heads=args.heads, num_classes=256,
  )  # fmt: skip
  model = CausalLM(config)
  params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"])
  return model, params


def prepared_runner(variant: str, context: int, args):
  """(runner returning seconds per token, state bytes): the model prefilled to c - steps - 1 positions."""
  model, params = build(variant, context, args)
  step = jax.jit(lambda p, c, t: decode_step(model, p, c, t))

  @jax.jit
  def greedy_step(p, c, t):  # one token in, the greedy next token out: the whole step compiled
    logits, c = decode_step(model, p, c, t)
    return jnp.argmax(logits[:, -1:], axis=-1).astype(jnp.int32), c

  cache = init_cache(model, args.batch)
  state_bytes = sum(int(x.nbytes) for x in jax.tree.leaves(cache))
  rng = np.random.default_rng(0)
  prefill = context - args.steps - 1
  for begin in range(0, prefill, args.prefill_chunk):
    tokens = rng.integers(0, 256, (args.batch, min(args.prefill_chunk, prefill - begin)), dtype=np.int32)
    _, cache = step(params, cache, jnp.asarray(tokens))
  token = jnp.zeros((args.batch, 1), jnp.int32)

  def run() -> float:
    c, tok = cache, token
    start = time.perf_counter()
    for _ in range(args.steps):
      tok, c = greedy_step(params, c, tok)
    jax.block_until_ready(tok)
    return (time.perf_counter() - start) / args.steps

  run()  # compile and warm up
  return run, state_bytes


def _flag(value) -> str:
  return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def measure(args) -> dict:
  records = []
  for context in args.contexts:
    runners, sizes = {}, {}
    for variant in VARIANTS:
      runners[variant], sizes[variant] = prepared_runner(variant, context, args)
    times = harness.interleaved_timings(runners, args.repeats)
    for variant in VARIANTS:
      seconds = statistics.median(times[variant])
      records.append(
        {"variant": variant, "seq_len": context, "ms_per_token": 1e3 * seconds, "state_bytes": sizes[variant]}
      )
      print(f"context {context:>6}  {variant:<17} {1e3 * seconds:8.3f} ms/token  state {sizes[variant]:>12,} bytes")
  meta = {
    "devices": str(jax.devices()),
    "config": {k: v for k, v in vars(args).items() if k != "out"},
    "date": time.strftime("%Y-%m-%d"),
    "command": "python -m benchmarks.decoding "
    + " ".join(f"--{k}={_flag(v)}" for k, v in vars(args).items() if k != "out"),
  }
  return {"meta": meta, "records": records}


def markdown(results: dict) -> str:
  records = results["records"]
  time_table = harness.ratio_table(records, "ms_per_token", reference="softmax_kv_cache", digits=3)
  size_table = harness.ratio_table(records, "state_bytes", reference="softmax_kv_cache", scale=harness.MIB, digits=3)
  return (
    f"Milliseconds per decoded token (ratio to the KV cache), median of {results['meta']['config']['repeats']} "
    f"interleaved repeats of {results['meta']['config']['steps']} steps; {results['meta']['devices']}, "
    f"{results['meta']['date']}; `{results['meta']['command']}`\n\n{time_table}\n\n"
    f"Decoding state (MiB) per batch of {results['meta']['config']['batch']}:\n\n{size_table}\n"
  )


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=[256, 512, 1024, 2048])
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--dim", type=int, default=256)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--low_rank", type=int, default=20)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--steps", type=int, default=16)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--prefill_chunk", type=int, default=256)
  parser.add_argument("--out", type=Path, default=None)
  args = parser.parse_args(argv)
  if min(args.contexts) <= args.steps + 1:
    parser.error(f"--contexts must all exceed --steps + 1 = {args.steps + 1}")
  results = measure(args)
  text = markdown(results)
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
