"""The decoding benchmark's models and timed runners (`benchmarks/decoding.py` and `benchmarks/decoding_extras.py`
both use them; see decoding.py's docstring): the three variants' `CausalLM`s, a synthetic filled cache, the compiled
greedy loops timed at 1 and `--steps` steps, and the marginal step time of their difference."""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from benchmarks.harness import measure as harness
from primal_jax.models.config import TransformerConfig
from primal_jax.models.lm import CausalLM, decode_step, greedy_decode, init_cache

VARIANTS = ("softmax_kv_cache", "primal_plus", "primal_state")
SOFTMAX_IMPLS = ("einsum", "dot_product_attention")  # SoftmaxAttention.impl of the softmax layers


def layer_kinds(variant: str, layers: int) -> tuple[str, ...]:
  if variant not in VARIANTS:
    raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
  if variant == "softmax_kv_cache":
    return ("softmax",) * layers
  return ("softmax",) * (layers - 1) + ("primal",) if variant == "primal_plus" else ("primal",) * layers


def weight_bytes(params, batch: int) -> int:
  """Bytes of the weights one decode step reads: every parameter, except that an embedding table is read only at
  the B looked-up rows (the position table alone is max_len rows)."""
  total = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    names = jax.tree_util.keystr(path)
    if "['embed']" in names:
      total += batch * leaf.shape[-1] * leaf.dtype.itemsize
    else:
      total += leaf.size * leaf.dtype.itemsize
  return total


def build(variant: str, context: int, args) -> tuple[CausalLM, dict]:
  """The model of `variant` with a `context`-position cache, and its (random) parameters."""
  config = TransformerConfig(
    layers=layer_kinds(variant, args.layers),
    attention={
      "primal": {"low_rank": args.low_rank, "data_dependent": False},
      "softmax": {"impl": getattr(args, "softmax_impl", "einsum")},
    },
    vocab_size=256, max_len=context, dim=args.dim, hidden_dim=4 * args.dim, num_heads=args.heads, num_classes=256,
    # Decoding is inference: no dropout (and the fused impl refuses a dropout rate it has no hook for).
    dropout_rate=0.0, attention_dropout_rate=0.0,
  )  # fmt: skip
  model = CausalLM(config)
  params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"])
  return model, params


def synthetic_cache(cache: dict, position: int, seed: int = 0) -> dict:
  """`cache` as if `position` tokens had been decoded: random keys, values and running sums, every position
  counter (the model's `position`, each softmax layer's `cache_index`, each Primal layer's `count`) at `position`."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(cache)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  filled = []
  for (path, leaf), key in zip(leaves, keys, strict=True):
    name = jax.tree_util.keystr(path[-1:]).strip("[]'\"")
    if name in ("position", "cache_index", "count"):
      filled.append(jnp.full(leaf.shape, position, leaf.dtype))
    else:
      filled.append(jax.random.normal(key, leaf.shape, leaf.dtype))
  return jax.tree_util.tree_unflatten(treedef, filled)


def prepared_runner(variant: str, context: int, batch: int, args):
  """(runner returning seconds per token, sizes): the model's cache filled to c - steps - 1 positions; sizes holds
  the state's bytes, XLA's temporary bytes of one compiled step and the bytes a step must read."""
  model, params = build(variant, context, args)
  step = jax.jit(lambda p, c, t: decode_step(model, p, c, t))

  @functools.partial(jax.jit, donate_argnums=1)  # the cache updated in place, as `generation.generate` does
  def greedy_step(p, c, t):  # one token in, the greedy next token out: the whole step compiled
    logits, c = decode_step(model, p, c, t)
    return jnp.argmax(logits[:, -1:], axis=-1).astype(jnp.int32), c

  loops = {n: jax.jit(functools.partial(greedy_decode, model, steps=n), donate_argnums=1) for n in (1, args.steps)}
  cache = init_cache(model, batch)
  state_bytes = sum(int(x.nbytes) for x in jax.tree.leaves(cache))
  prefill = context - args.steps - 1
  if args.fill == "synthetic":
    cache = synthetic_cache(cache, prefill)
  else:
    rng = np.random.default_rng(0)
    for begin in range(0, prefill, args.prefill_chunk):
      tokens = rng.integers(0, 256, (batch, min(args.prefill_chunk, prefill - begin)), dtype=np.int32)
      _, cache = step(params, cache, jnp.asarray(tokens))
  token = jnp.zeros((batch, 1), jnp.int32)
  compiled = greedy_step.lower(params, cache, token).compile()
  memory = compiled.memory_analysis()
  sizes = {
    "state_bytes": state_bytes,
    "xla_temp_bytes": None if memory is None else int(memory.temp_size_in_bytes),
    "weight_bytes": weight_bytes(params, batch),
    "flops_per_step": harness.compiled_flops(compiled),  # XLA's count for the whole step (None where unknown)
  }
  sizes["bytes_per_step"] = sizes["weight_bytes"] + state_bytes

  def timed(steps: int) -> tuple[float, float]:
    c = jax.tree.map(jnp.copy, cache)  # a fresh copy each time: the loop consumes (donates) its own
    jax.block_until_ready(c)
    start, cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(loops[steps](params, c, token))
    return time.perf_counter() - start, time.process_time() - cpu

  def run() -> float:
    """Times both loops into `samples` (what `marginal_times` reads); returns the --steps loop's seconds."""
    (one, _), (many, cpu) = timed(1), timed(args.steps)
    samples["one"].append(one)
    samples["many"].append(many)
    samples["cpu_per_wall"].append(cpu / many)  # this process's threads busy during the loop, on average
    return many

  # Seconds of each run's 1-step and --steps loops, and the --steps loop's CPU seconds per wall second.
  samples: dict[str, list[float]] = {"one": [], "many": [], "cpu_per_wall": []}
  run()  # compile and warm up
  for values in samples.values():
    values.clear()
  return run, sizes, samples


EXTRA_ROUNDS = 3  # rounds of repeats added when a loop's difference drowns in the timer's noise, before refusing


def _difference(samples: dict[str, list[float]], steps: int) -> float:
  return (min(samples["many"]) - min(samples["one"])) / (steps - 1)


def marginal_times(runners, samples: dict, args, what: str) -> dict[str, float]:
  """{variant: seconds of one decode step}: (best `steps`-step loop - best 1-step loop) / (steps - 1).

  Runs `args.repeats` interleaved repeats of every runner. The best repeat of each loop (as the bandwidth's best
  triad): a time slice lost to another process lands in one repeat of one loop, and would otherwise land in the
  difference. Where a difference is not positive (a step too small for the timer's noise), up to `EXTRA_ROUNDS`
  more rounds of repeats are added; if it still is not, the variant is refused: no number rather than a wrong one.
  """
  harness.interleaved_timings(runners, args.repeats)
  for _ in range(EXTRA_ROUNDS):
    if all(_difference(samples[v], args.steps) > 0 for v in runners):
      break
    harness.interleaved_timings(runners, args.repeats)
  out = {}
  for variant in runners:
    out[variant] = _difference(samples[variant], args.steps)
    if out[variant] <= 0:
      raise RuntimeError(
        f"{variant} {what}: the {args.steps}-step loop was not slower than the 1-step loop after "
        f"{(EXTRA_ROUNDS + 1) * args.repeats} repeats; raise --steps"
      )
  return out
