"""Train and evaluate one config: the binary behind every experiment.

  python -m experiments.main --config=experiments/configs/uea.py --workdir=/tmp/run

Also installed as `primal-train`. The work is in `primal_jax.training`.
"""

from primal_jax.training.cli import run

if __name__ == "__main__":
  run()
