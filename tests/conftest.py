"""Pytest setup that must run before anything imports JAX.

Eight fake CPU devices let the checkpoint tests save from one mesh and restore onto another
(`--xla_force_host_platform_device_count`). XLA reads this flag once, when the CPU backend starts,
so it has to be in the environment before the first `import jax` of the session.
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import pytest  # noqa: E402  (after the XLA flag, which must precede any JAX import)


def pytest_report_header(config):
  """The platform the suite runs on, so a log says whether it is the CPU's or an accelerator's numbers."""
  import jax

  devices = jax.devices()
  precision = jax.config.jax_default_matmul_precision or "default"
  return (
    f"jax {jax.__version__}: backend {jax.default_backend()}, {len(devices)} x {devices[0].device_kind}; "
    f"default matmul precision {precision} (tests marked matmul_precision set their own)"
  )


@pytest.fixture(autouse=True)
def _matmul_precision(request):
  """Runs a test marked `@pytest.mark.matmul_precision("highest")` at that precision.

  A test that compares with float64 NumPy or golden numbers at float32 tolerances needs full float32 matmuls;
  on an accelerator the default is lower (TF32 on NVIDIA GPUs, bf16 passes on TPUs), which misses such
  tolerances by ~1e-3. Every other test runs at the platform's default precision.
  """
  marker = request.node.get_closest_marker("matmul_precision")
  if marker is None:
    yield
    return
  import jax

  with jax.default_matmul_precision(marker.args[0]):
    yield


@pytest.fixture(scope="session")
def jv_tfds_dir(tmp_path_factory):
  """One prepared TFDS copy of JapaneseVowels for the session (skips if the aeon wheel is unreachable)."""
  from primal_jax.tasks.uea.aeon_wheel import DatasetFetchError
  from primal_jax.tasks.uea.tfds_dataset import prepare_uea

  path = tmp_path_factory.mktemp("tfds")
  try:
    prepare_uea("JapaneseVowels", "aeon", path)
  except DatasetFetchError as err:
    pytest.skip(f"JapaneseVowels unavailable: {err}")
  return str(path)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, jv_tfds_dir):
  """A 2-step Primal.+Trans. smoke run on real JapaneseVowels (layer 0 softmax, layer 1 Primal): the spectrum
  tests' trained workdir (config.json and checkpoints)."""
  from primal_jax.cli.config_lookup import load_config
  from primal_jax.training.loop import train_and_evaluate

  config = load_config("uea:smoke,model=primal_plus", lock=False)
  config.total_steps = 2
  config.data.data_dir = jv_tfds_dir
  workdir = tmp_path_factory.mktemp("run")
  train_and_evaluate(config, workdir, print_fn=lambda _: None)
  return workdir
