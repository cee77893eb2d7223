"""Devices for the multi-device tests, on whatever machine runs the suite.

tests/conftest.py asks XLA for 8 fake CPU devices. On a CPU machine they are the default backend's devices; on
a machine with one accelerator the default backend has 1 device, but the CPU backend still has the 8 fake ones,
so the sharding tests run there on the CPU devices instead of failing (the sharding logic under test is the
same). Where neither has enough, the test is skipped with the reason.
"""

from __future__ import annotations

import jax
import pytest


def devices_for(count: int) -> list[jax.Device]:
  """`count` devices of the default backend if it has them, else of the CPU backend, else the test is skipped."""
  default = jax.devices()
  if len(default) >= count:
    return default[:count]
  try:
    cpu = jax.devices("cpu")
  except RuntimeError:
    cpu = []
  if len(cpu) >= count:
    return cpu[:count]
  pytest.skip(
    f"needs {count} devices: the {default[0].platform} backend has {len(default)} and the CPU backend {len(cpu)} "
    f"(set XLA_FLAGS=--xla_force_host_platform_device_count={count} before JAX starts)"
  )
