"""The benchmarked models (`Variant`s: the LRA config's models and every registered attention) and one compiled
training step of each on synthetic full-length batches (`prepare_step`), as the efficiency benchmark, the step
profile and the comparison with the release time it."""

from __future__ import annotations

import ast
import dataclasses
import time
from typing import Any

import jax
import numpy as np

from benchmarks.harness import measure as bm
from primal_jax.attention.registry import ATTENTIONS
from primal_jax.attention.softmax import SoftmaxAttention
from primal_jax.cli.config_lookup import load_config
from primal_jax.dotted import set_dotted
from primal_jax.models.registry import build_model
from primal_jax.training.objectives import get_objective
from primal_jax.training.optimizers import make_optimizer
from primal_jax.training.sharding import batch_sharding, make_mesh, replicated
from primal_jax.training.state import abstract_state, init_state, make_init_fn
from primal_jax.training.steps import ksvd_spec, make_train_step


@dataclasses.dataclass(frozen=True)
class Variant:
  """A benchmarked model: the LRA config's `model=...`, plus config overrides (e.g. an attention option)."""

  name: str
  model: str
  overrides: tuple[tuple[str, Any], ...] = ()
  # The attention whose options take Primal's s (`low_rank`) and `rank_multi` from the config (after `--set`), so a
  # mechanism built on Primal's KSVD (KEP-SVGP) is timed at the rank PrimalFormer is timed at.
  rank_of_primal: str | None = None


# The fused softmax: SoftmaxAttention's impl option; that function has no hook for weight dropout.
FUSED_SOFTMAX = (("model.attention.softmax", {"impl": "dot_product_attention", "dropout_rate": 0.0}),)


def kep_overrides(form: str) -> tuple[tuple[str, Any], ...]:
  """KEP-SVGP trained as its authors train it: task "kep_svgp" (CE + KSVD + the unscaled KL, whose terms the step
  computes), the release's KSVD term at eta 1 and the layer in `form` (`low_rank` and `rank_multi`: Primal's)."""
  return (
    ("task", "kep_svgp"),
    ("ksvd", {"eta": 1.0, "spec": "release_kep"}),
    ("model.attention.kep_svgp", {"dropout_rate": 0.0, "form": form}),
  )


def available_variants() -> dict[str, Variant]:
  """The fixed variants, then every other registered attention (read at run time); softmax variants with other
  masking arithmetic (e.g. "gpt2") cost what softmax costs and are left out."""
  variants = {
    "softmax": Variant("softmax", "softmax"),
    "softmax_dpa": Variant("softmax_dpa", "softmax", FUSED_SOFTMAX),
    "primalformer": Variant("primalformer", "primalformer"),
    "primal_plus": Variant("primal_plus", "primal_plus"),
  }
  for name, cls in ATTENTIONS.items():
    if name != "primal" and not issubclass(cls, SoftmaxAttention):
      variants[name] = Variant(name, name)
  if "kep_svgp" in ATTENTIONS:  # both forms: the paper's (default) and the authors' code's
    variants["kep_svgp"] = Variant("kep_svgp", "kep_svgp", kep_overrides("paper"), rank_of_primal="kep_svgp")
    variants["kep_svgp_release"] = Variant(
      "kep_svgp_release", "kep_svgp", kep_overrides("release"), rank_of_primal="kep_svgp"
    )
  return variants


@dataclasses.dataclass(frozen=True)
class SyntheticInfo:
  """The fields of `DatasetInfo` the LRA model builders read."""

  seq_len: int
  vocab_size: int
  num_classes: int


def parse_override(text: str) -> tuple[str, Any]:
  """Parse `model.dim=32` into ("model.dim", 32); values are Python literals, else strings."""
  key, sep, value = text.partition("=")
  if not sep or not key.strip():
    raise ValueError(f"--set expects key=value, got {text!r}")
  try:
    return key.strip(), ast.literal_eval(value)
  except (ValueError, SyntaxError):
    return key.strip(), value


def make_config(variant: Variant, seq_len: int, args):
  """The LRA config of `variant` at length `seq_len`, with `--set` overrides (locked: typos raise)."""
  config = load_config(f"{args.config}:task={args.task},model={variant.model}")
  config.data.seq_len = seq_len
  with config.unlocked():  # a variant may add options the config file does not list
    for key, value in variant.overrides:
      set_dotted(config, key, value, new_leaf=True)
  for key, value in args.set:
    set_dotted(config, key, value)
  if variant.rank_of_primal:
    primal = config.model.attention.primal
    with config.unlocked():
      config.model.attention[variant.rank_of_primal].update(low_rank=primal.low_rank, rank_multi=primal.rank_multi)
  return config


def synthetic_batch(input_keys, batch_size: int, seq_len: int, vocab_size: int, num_classes: int, seed: int):
  """Full-length random token batch (no padding: every position costs what a real one does)."""
  rng = np.random.default_rng(seed)
  batch = {"label": rng.integers(0, num_classes, batch_size, dtype=np.int32), "weight": np.ones(batch_size, np.float32)}
  for key in input_keys:
    if key.startswith("inputs"):
      batch[key] = rng.integers(1, vocab_size, (batch_size, seq_len), dtype=np.int32)
    elif key.startswith("mask"):
      batch[key] = np.ones((batch_size, seq_len), bool)
    else:
      raise ValueError(f"no synthetic data for model input {key!r}")
  return batch


@dataclasses.dataclass
class PreparedStep:
  """A compiled, warmed-up train step and the state it advances (mutable: the state is donated)."""

  compiled: Any
  state: Any
  batch: dict
  steps: int
  num_params: int
  compile_seconds: float
  flops: float | None
  memory: dict
  last_out: Any = None
  error: str | None = None

  def run(self, steps: int | None = None) -> float:
    """Seconds for `steps` (default `self.steps`) steps; NaN once a step has failed (recorded in `error`)."""
    if self.error:
      return float("nan")
    try:
      self.state, self.last_out, seconds = bm.timed_steps(self.compiled, self.state, self.batch, steps or self.steps)
    except Exception as err:  # e.g. out of device memory at run time: keep the other variants going
      self.error = f"{type(err).__name__}: {err}"[:500]
      return float("nan")
    return seconds

  def loss(self) -> float | None:
    return None if self.last_out is None else float(jax.device_get(self.last_out["loss"]))


def prepare_step(variant: Variant, seq_len: int, args, device: jax.Device, warmup_steps: int) -> PreparedStep:
  """Build the model at `seq_len`, compile its train step on `device` alone, run `warmup_steps` steps."""
  config = make_config(variant, seq_len, args)
  info = SyntheticInfo(seq_len=seq_len, vocab_size=config.model.vocab_size, num_classes=args.num_classes)
  built = build_model(config.model, info)
  tx, schedule = make_optimizer(config.optimizer, config.total_steps)
  # The config's task when set (as `build_experiment` reads it), else the model's; no split sizes (no data).
  objective = get_objective(config.get("task") or built.task).configured(config, {})
  mesh = make_mesh((1, 1), devices=[device])
  host_batch = synthetic_batch(built.input_keys, args.batch_size, seq_len, info.vocab_size, info.num_classes, args.seed)
  batch = jax.device_put(host_batch, batch_sharding(mesh))
  example = tuple(host_batch[k][:1] for k in built.input_keys)
  rng = jax.random.PRNGKey(args.seed)
  start = time.perf_counter()
  init_fn = make_init_fn(built.module, tx, example)
  abstract, shardings = abstract_state(init_fn, rng, mesh)
  state = init_state(init_fn, rng, shardings)
  step = jax.jit(
    make_train_step(built, tx, schedule, eta=config.ksvd.eta, spec=ksvd_spec(config.ksvd.spec), objective=objective),
    in_shardings=(shardings, batch_sharding(mesh)),
    out_shardings=(shardings, replicated(mesh)),
    donate_argnums=0,
  )
  compiled = step.lower(abstract, batch).compile()
  compile_seconds = time.perf_counter() - start
  num_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract.params))
  prepared = PreparedStep(
    compiled, state, batch, args.steps, num_params, compile_seconds, bm.compiled_flops(compiled),
    bm.compiled_memory(compiled),
  )  # fmt: skip
  need, budget = prepared.memory.get("total_bytes"), getattr(args, "memory_budget_gib", 0.0)
  if budget and need and need > budget * 2**30:
    raise NotRun("memory", f"not run: the step needs {need / 2**30:.1f} GiB (XLA) > the {budget:g} GiB budget")
  if warmup_steps:
    seconds = prepared.run(warmup_steps) / warmup_steps
    if prepared.error:
      raise RuntimeError(prepared.error)
    limit = getattr(args, "step_budget", 0.0)
    if limit and seconds > limit:
      raise NotRun("time", f"not timed: a warm-up step took {seconds:.0f} s > the {limit:g} s step budget")
  return prepared


class NotRun(RuntimeError):
  """A (variant, N) left out by `--memory_budget_gib` / `--step_budget`; `kind` ("memory", "time") is recorded."""

  def __init__(self, kind: str, message: str):
    super().__init__(message)
    self.kind = kind
