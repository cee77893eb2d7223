"""Parameter counts of every LRA task x model config (the table LRA's users had to compute themselves).

  python -m experiments.lra_params            # Markdown table on stdout

Counts come from `jax.eval_shape` of each config's model at the task's padded length and the
release's vocabulary sizes, so no data is read and nothing is allocated.
"""

from __future__ import annotations

import sys
import types

import jax
import jax.numpy as jnp
import numpy as np

from primal_jax import markdown
from primal_jax.attention.registry import ATTENTIONS
from primal_jax.attention.softmax import SoftmaxAttention
from primal_jax.cli.config_lookup import load_config
from primal_jax.models.registry import build_model

CONFIG = "lra"  # the packaged config, by name
# Padded lengths of the LRA tasks as the paper reports them (Image: CIFAR-10's 1,024 pixels).
LENGTHS = {"listops": 2000, "text": 4000, "retrieval": 4000, "image": 1024, "pathfinder": 1024}


def models() -> list[str]:
  # Softmax variants with other masking arithmetic (e.g. "gpt2") have softmax's parameters.
  baselines = [name for name, cls in ATTENTIONS.items() if name != "primal" and not issubclass(cls, SoftmaxAttention)]
  return ["softmax", "primalformer", "primal_plus", *baselines]


def count_params(task: str, model: str, seq_len: int | None = None) -> int:
  """Parameters of `model` on `task` at padded length `seq_len` (default: the task's LRA length)."""
  return count_config_params(load_config(f"{CONFIG}:task={task},model={model}"), task, seq_len)


def count_config_params(config, task: str, seq_len: int | None = None) -> int:
  """Parameters of the model `config` builds for `task` (shapes only, nothing is initialised)."""
  info = types.SimpleNamespace(
    seq_len=seq_len or config.data.get("seq_len") or LENGTHS[task],  # the release forms' power-of-two lengths
    vocab_size=0,
    num_classes={"listops": 10, "image": 10}.get(task, 2),
    num_features=1,
  )
  built = build_model(config.model, info)
  example = tuple(
    jnp.zeros((1, info.seq_len), jnp.int32 if key.startswith("inputs") else jnp.bool_) for key in built.input_keys
  )
  shapes = jax.eval_shape(lambda: built.module.init(jax.random.key(0), *example))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes["params"]))


def table() -> str:
  tasks = list(LENGTHS)
  header = ["model", *(f"{t} (N={LENGTHS[t]})" for t in tasks)]
  return markdown.table(header, ([model, *(f"{count_params(t, model):,}" for t in tasks)] for model in models()))


def main(argv: list[str] | None = None) -> int:
  del argv
  sys.stdout.write(table() + "\n")
  return 0


if __name__ == "__main__":
  raise SystemExit(main(sys.argv))
