"""Build a PrimalFormer, run it on a real batch and print its KSVD terms.

    python -m experiments.demo [--seed 0] [--sampling release|padding_aware]

The batch is real text that ships with every CPython (the 19 lines of the Zen
of Python, `this.s`), byte-tokenised and padded, so it needs no download. The
model is the release's LRA PrimalFormer (2 layers, dim 64, 2 heads, s = 20,
n = 200) with the release initialisation. Prints, per Primal layer, the
terms of the KSVD objective J in the release and paper conventions, then the
regulariser eta * loss_ksvd and one gradient step's effect on it.
"""

from __future__ import annotations

import argparse
import ast
import codecs
import importlib.util
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

from primal_jax.ksvd import PAPER, RELEASE_LRA, collect_terms, ksvd_loss, ksvd_objective
from primal_jax.models import SequenceClassifier, make_config

ETA = 0.1  # the release's LRA listops eta for PrimalFormer


def zen_batch(max_len: int = 128) -> tuple[np.ndarray, np.ndarray, list[str]]:
  """Byte tokens [19, max_len] (0 = padding), mask [19, max_len], and the lines."""
  # Read `this.s` from the module's source: importing `this` would print it.
  with open(importlib.util.find_spec("this").origin) as f:
    tree = ast.parse(f.read())
  encoded = next(node.value.value for node in tree.body if isinstance(node, ast.Assign) and node.targets[0].id == "s")
  lines = [line for line in codecs.decode(encoded, "rot13").splitlines() if line.strip()]
  tokens = np.zeros((len(lines), max_len), np.int32)
  for i, line in enumerate(lines):
    data = np.frombuffer(line.encode()[:max_len], np.uint8)
    tokens[i, : len(data)] = data
  return tokens, (tokens > 0).astype(np.float32), lines


def print_terms(terms_per_layer) -> None:
  print(f"{'layer':>5} {'J release':>12} {'J paper':>12} {'sum e^T L e':>12} {'mean |L e|^2':>13} {'Tr(We^T Wr)':>12}")
  for i, t in enumerate(terms_per_layer):
    j_release = float(ksvd_objective(t, RELEASE_LRA))
    j_paper = float(jnp.mean(ksvd_objective(t, PAPER)))
    energy = float(jnp.mean(t.energy_e))
    energy_sq = float(jnp.mean(t.energy_e_sq / t.count[:, None]))
    trace = float(jnp.mean(t.trace_params))
    print(f"{i:>5} {j_release:>12.5f} {j_paper:>12.4f} {energy:>12.4f} {energy_sq:>13.6f} {trace:>12.6f}")


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--sampling", choices=("release", "padding_aware"), default="release")
  args = parser.parse_args(argv)

  tokens, mask, lines = zen_batch()
  labels = np.arange(len(lines)) % 10  # a fixed target per line, for the gradient step
  config = make_config(
    "primalformer",
    2,
    vocab_size=256,
    max_len=tokens.shape[1],
    attention={"primal": {"sampling": args.sampling}},
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
  )
  model = SequenceClassifier(config)
  params = model.init(jax.random.key(args.seed), tokens, mask)["params"]
  n_params = sum(x.size for x in jax.tree.leaves(params))
  platform = jax.devices()[0].platform
  print(f"jax {jax.__version__} on {platform}; PrimalFormer {config.layer_names}, {n_params:,} parameters")
  print(
    f"batch: {len(lines)} lines of the Zen of Python, lengths {int(mask.sum(1).min())}-{int(mask.sum(1).max())} "
    f"bytes, padded to {tokens.shape[1]}; sampling={args.sampling}"
  )

  def loss_fn(p):
    logits, state = model.apply({"params": p}, tokens, mask, mutable=["ksvd"])
    ce = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))
    reg = ksvd_loss(state["ksvd"], RELEASE_LRA)
    return ce + ETA * reg, (ce, reg, collect_terms(state["ksvd"]))

  (total, (ce, reg, terms)), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
  print("\nKSVD terms per Primal layer (batch means):")
  print_terms(terms)
  print(
    f"\ncross-entropy {float(ce):.4f}  loss_ksvd {float(reg):.6f}  total = CE + {ETA} * loss_ksvd = {float(total):.4f}"
  )

  updates, _ = optax.radam(1e-3).update(grads, optax.radam(1e-3).init(params), params)
  _, (ce2, reg2, _) = jax.jit(loss_fn)(optax.apply_updates(params, updates))
  print(f"after one RAdam step (lr 1e-3): cross-entropy {float(ce2):.4f}  loss_ksvd {float(reg2):.6f}")
  finite = bool(jnp.isfinite(total)) and all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
  if not finite:
    print("error: non-finite loss or gradient", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
