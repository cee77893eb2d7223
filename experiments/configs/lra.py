"""Moved into the package as `primal_jax/configs/lra.py`: name it `--config=lra` from any directory.

This file stays so that the commands recorded under experiments/results/ (`--config=experiments/configs/lra.py:...`)
still run.
"""

from primal_jax.configs.lra import *  # noqa: F403
