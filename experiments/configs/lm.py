"""Moved into the package as `primal_jax/tasks/lm/config.py`: name it `--config=lm` from any directory.

This file stays so that the commands recorded under experiments/results/ (`--config=experiments/configs/lm.py:...`)
still run.
"""

from primal_jax.tasks.lm.config import *  # noqa: F403
