"""Moved into the package as `primal_jax/configs/d4rl.py`: name it `--config=d4rl` from any directory.

This file stays so that the commands recorded under experiments/results/ (`--config=experiments/configs/d4rl.py:...`)
still run.
"""

from primal_jax.configs.d4rl import *  # noqa: F403
