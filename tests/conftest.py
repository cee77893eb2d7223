"""Pytest setup that must run before anything imports JAX.

Eight fake CPU devices let the checkpoint tests save from one mesh and restore onto another
(`--xla_force_host_platform_device_count`). XLA reads this flag once, when the CPU backend starts,
so it has to be in the environment before the first `import jax` of the session.
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
