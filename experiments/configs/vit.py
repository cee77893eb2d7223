"""Moved into the package as `primal_jax/configs/vit.py`: name it `--config=vit` from any directory.

This file stays so that the commands recorded under experiments/results/ (`--config=experiments/configs/vit.py:...`)
and the sweep file that names it still run.
"""

from primal_jax.configs.vit import *  # noqa: F403
