"""Moved into the package as `primal_jax/tasks/uea/config.py`: name it `--config=uea` from any directory.

This file stays so that the commands recorded under experiments/results/ (`--config=experiments/configs/uea.py:...`)
still run.
"""

from primal_jax.tasks.uea.config import *  # noqa: F403
