"""Pytest setup that must run before anything imports JAX.

Eight fake CPU devices let the checkpoint tests save from one mesh and restore onto another
(`--xla_force_host_platform_device_count`). XLA reads this flag once, when the CPU backend starts,
so it has to be in the environment before the first `import jax` of the session.
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import pytest  # noqa: E402  (after the XLA flag, which must precede any JAX import)


@pytest.fixture(scope="session")
def jv_tfds_dir(tmp_path_factory):
  """One prepared TFDS copy of JapaneseVowels for the session (skips if the aeon wheel is unreachable)."""
  from primal_jax.data.aeon_wheel import DatasetFetchError
  from primal_jax.data.uea_tfds import prepare_uea

  path = tmp_path_factory.mktemp("tfds")
  try:
    prepare_uea("JapaneseVowels", "aeon", path)
  except DatasetFetchError as err:
    pytest.skip(f"JapaneseVowels unavailable: {err}")
  return str(path)
