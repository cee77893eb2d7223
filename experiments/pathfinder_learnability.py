"""Is a generated Pathfinder level learnable at all? A small conv net answers in minutes.

  python -m experiments.pathfinder_learnability --contour_length=4 --num_distractors=0 \
    --steps=600 --out=/tmp/pathfinder_cnn.json

The 2-layer LRA Transformers stay at exactly 50% on our Pathfinder within the
step budgets this CPU allows (results/lra_short/pathfinder_trials/). That is
either the task (a label the pixels do not determine, a broken drawing) or
the models (no spatial inductive bias: 1,024 tokens whose 2-D neighbourhood
must be learned from learned 1-D position embeddings). A conv net, which has
that bias built in, separates the two: if it learns a level, the level's labels
are readable from its pixels and the Transformers' plateau is theirs.

The net: six 3x3 convolutions (32-32-64-64-64-64, ReLU), global max pooling,
an MLP head; Adam at lr 1e-3, batch 64, sampled with replacement. Images are
scaled to [0, 1]. Prints train and test accuracy every `--eval_every` steps
and writes them to `--out` as JSON, with the command that ran; an existing
`--out` file is refused before anything trains, unless `--overwrite`. The loop is a plain optax one, not
`primal_jax.training`: the conv net is a probe of the data, not a model the
library offers, so it stays out of the model registry.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import jax
import numpy as np
import optax
from flax import linen as nn

from experiments.engine.records import existing_record_error, write_record
from primal_jax.tasks.lra.pathfinder import generate_pathfinder


class SmallConvNet(nn.Module):
  """[B, H, W, 1] in [0, 1] -> logits [B, 2]."""

  widths: tuple[int, ...] = (32, 32, 64, 64, 64, 64)

  @nn.compact
  def __call__(self, images: jax.Array) -> jax.Array:
    x = images
    for width in self.widths:
      x = nn.relu(nn.Conv(width, (3, 3))(x))
    x = x.max(axis=(1, 2))  # [B, C]: "is there a pattern anywhere", the conv analogue of LRA's pooling
    return nn.Dense(2)(nn.relu(nn.Dense(64)(x)))


def _images(images: np.ndarray) -> np.ndarray:
  return images[..., None].astype(np.float32) / 255.0  # [n, 32, 32] uint8 -> [n, 32, 32, 1]


def draw_splits(num_train: int, num_test: int, *, seed: int, **geometry):
  """(train_x, train_y, test_x, test_y): train and test from separate streams of `seed`, so never shared."""
  train_x, train_y = generate_pathfinder(num_train, seed=(seed, 0), **geometry)
  test_x, test_y = generate_pathfinder(num_test, seed=(seed, 1), **geometry)
  return train_x, train_y, test_x, test_y


def run(
  *,
  contour_length: int,
  num_distractors: int | None,
  num_train: int,
  num_test: int,
  steps: int,
  batch_size: int = 64,
  learning_rate: float = 1e-3,
  eval_every: int = 100,
  seed: int = 0,
) -> dict:
  """Train the conv net on one generated level; the record of every evaluation."""
  geometry = dict(contour_length=contour_length, num_distractors=num_distractors)
  begin = time.perf_counter()
  train_x, train_y, test_x, test_y = draw_splits(num_train, num_test, seed=seed, **geometry)
  train_x, test_x = _images(train_x), _images(test_x)
  data_s = time.perf_counter() - begin

  model = SmallConvNet()
  params = model.init(jax.random.key(seed), train_x[:1])
  optimizer = optax.adam(learning_rate)
  opt_state = optimizer.init(params)

  def loss_and_accuracy(params, x, y):
    logits = model.apply(params, x)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return loss, (logits.argmax(-1) == y).mean()

  @jax.jit
  def train_step(params, opt_state, x, y):
    (_, accuracy), grads = jax.value_and_grad(loss_and_accuracy, has_aux=True)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, accuracy

  evaluate = jax.jit(loss_and_accuracy)
  rng = np.random.default_rng(seed)
  history, train_accuracy = [], []
  begin = time.perf_counter()
  for step in range(1, steps + 1):
    rows = rng.integers(0, num_train, batch_size)
    params, opt_state, accuracy = train_step(params, opt_state, train_x[rows], train_y[rows])
    train_accuracy.append(float(accuracy))
    if step % eval_every == 0 or step == steps:
      correct = sum(
        float(evaluate(params, test_x[i : i + 256], test_y[i : i + 256])[1]) * len(test_y[i : i + 256])
        for i in range(0, num_test, 256)
      )
      row = {
        "step": step,
        "train_accuracy": float(np.mean(train_accuracy[-eval_every:])),
        "test_accuracy": correct / num_test,
      }
      history.append(row)
      print(
        f"step {step}: train {row['train_accuracy']:.3f} test {row['test_accuracy']:.3f} "
        f"({time.perf_counter() - begin:.0f} s)",
        flush=True,
      )
  return {
    "geometry": geometry,
    "num_train": num_train,
    "num_test": num_test,
    "steps": steps,
    "batch_size": batch_size,
    "learning_rate": learning_rate,
    "seed": seed,
    "data_s": round(data_s, 1),
    "train_s": round(time.perf_counter() - begin, 1),
    "history": history,
  }


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--contour_length", type=int, default=6, help="dashes per target path (easy 6, hard 14)")
  parser.add_argument("--num_distractors", type=int, default=-1, help="-1: the level's default (LRA's)")
  parser.add_argument("--num_train", type=int, default=8192)
  parser.add_argument("--num_test", type=int, default=1024)
  parser.add_argument("--steps", type=int, default=600)
  parser.add_argument("--eval_every", type=int, default=100)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", type=Path, default=None, help="JSON record (optional)")
  parser.add_argument("--overwrite", action="store_true", help="replace an existing --out record")
  argv = sys.argv[1:] if argv is None else list(argv)
  args = parser.parse_args(argv)
  if refused := existing_record_error(args.out, args.overwrite):
    parser.error(refused)
  for name in ("num_train", "num_test", "steps", "eval_every"):
    if getattr(args, name) < 1:
      parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
  if args.num_distractors < -1:
    parser.error(f"--num_distractors must be >= 0, or -1 for the default; got {args.num_distractors}")
  record = run(
    contour_length=args.contour_length,
    num_distractors=None if args.num_distractors == -1 else args.num_distractors,
    num_train=args.num_train,
    num_test=args.num_test,
    steps=args.steps,
    eval_every=args.eval_every,
    seed=args.seed,
  )
  record["command"] = shlex.join(["python", "-m", "experiments.pathfinder_learnability", *argv])
  if args.out is not None:
    write_record(args.out, record)


if __name__ == "__main__":
  main(sys.argv[1:])
