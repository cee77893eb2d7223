"""Moved into the package as `primal_jax/tasks/offline_rl/config.py`: name it `--config=d4rl` from any directory.

This file stays so that the commands recorded under experiments/results/ (`--config=experiments/configs/d4rl.py:...`)
still run.
"""

from primal_jax.tasks.offline_rl.config import *  # noqa: F403
