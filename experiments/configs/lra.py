"""Moved into the package as `primal_jax/tasks/lra/config.py`: name it `--config=lra` from any directory.

This file stays so that the commands recorded under experiments/results/ (`--config=experiments/configs/lra.py:...`)
still run.
"""

from primal_jax.tasks.lra.config import *  # noqa: F403
