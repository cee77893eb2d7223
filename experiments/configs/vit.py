"""Moved into the package as `primal_jax/tasks/vision/config.py`: name it `--config=vit` from any directory.

This file stays so that the commands recorded under experiments/results/ (`--config=experiments/configs/vit.py:...`)
and the sweep file that names it still run.
"""

from primal_jax.tasks.vision.config import *  # noqa: F403
