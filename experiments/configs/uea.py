"""Moved into the package as `primal_jax/configs/uea.py`: name it `--config=uea` from any directory.

This file stays so that the commands recorded under experiments/results/ (`--config=experiments/configs/uea.py:...`)
still run.
"""

from primal_jax.configs.uea import *  # noqa: F403
