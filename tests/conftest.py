"""Pytest setup that must run before anything imports JAX, and the fixtures tests share.

Eight fake CPU devices let the checkpoint tests save from one mesh and restore onto another
(`--xla_force_host_platform_device_count`). XLA reads this flag once, when the CPU backend starts,
so it has to be in the environment before the first `import jax` of the session.

A persistent JAX compilation cache (`JAX_COMPILATION_CACHE_DIR`, every compilation written, however short) is
shared by the session's xdist workers, the subprocesses tests start (the training binaries) and later sessions:
most of a test's time on a CPU is XLA compiling its small programs, the same ones in both workers and in every
run. `JAX_COMPILATION_CACHE_DIR` set in the environment wins (CI sets it); otherwise the cache is
`${XDG_CACHE_HOME:-~/.cache}/primal_jax/jax_compilation_cache`; `PRIMAL_JAX_TEST_JAX_CACHE=off` turns it off.
A hit loads the executable XLA wrote (same program, same flags, same jaxlib: the key covers them), so a test's
numbers do not depend on it.
"""

import dataclasses
import os
from collections.abc import Callable
from typing import Any

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()


def _compilation_cache_dir() -> str | None:
  if os.environ.get("PRIMAL_JAX_TEST_JAX_CACHE", "").lower() in ("off", "0", "false", "no"):
    return None
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return os.environ["JAX_COMPILATION_CACHE_DIR"]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "primal_jax", "jax_compilation_cache")


_CACHE_DIR = _compilation_cache_dir()
if _CACHE_DIR:  # in the environment, so the workers and the subprocesses of tests inherit it
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE_DIR
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")  # no size floor either

import pytest  # noqa: E402  (after the XLA flag, which must precede any JAX import)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """With PRIMAL_JAX_TEST_TIMES=FILE, appends each test's wall and CPU seconds (setup, call and teardown) to FILE
  as JSON lines. CPU seconds count every thread of the process (XLA's too) and its finished subprocesses; unlike
  wall time they do not grow with the machine's load, so they rank tests, and sum to a stage's cost, on a
  shared machine (`tools/test_times.py` summarises such a file)."""
  path = os.environ.get("PRIMAL_JAX_TEST_TIMES")
  if not path:
    yield
    return
  import json
  import resource
  import time

  def cpu():
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime  # children: subprocess tests

  wall, start = time.perf_counter(), cpu()
  yield
  record = {"test": item.nodeid, "wall": time.perf_counter() - wall, "cpu": cpu() - start}
  with open(path, "a") as f:
    f.write(json.dumps(record) + "\n")


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


@dataclasses.dataclass(frozen=True)
class AttentionCase:
  """One attention layer of the session (`attention_cases`): the Linen `module`, random `params`, inputs `x`
  [B, length, D] and a padding `mask` [B, length], and two functions of (params, x, mask), each jitted once:
  `apply` -> the output [B, length, D]; `loss_and_grad` -> (sum of the squared real outputs, (d/dparams, d/dx))."""

  name: str
  module: Any
  params: Any
  x: Any
  mask: Any
  apply: Callable
  loss_and_grad: Callable


class AttentionCases:
  """A session's attention layers, each built once per worker and reused by every test that asks for it.

  `cases(name, causal=False, length=8, seed=0, **options)` returns the `AttentionCase` of the registered attention
  `name`: 2 heads, width 16 (`nnx_cases.B, N, D, H`), the small options of `nnx_cases.options` updated by
  `options` (max_len = length where the mechanism has it), random parameters with random biases
  (`attention_utils.random_params`), x drawn from `seed`, row 1's last 3 positions padded. The same call returns
  the same case, so tests parametrised over mechanisms compile each function once per mechanism and shape, not
  once per test; a different x or mask of the same shape and dtype reuses the compilation.
  """

  def __init__(self):
    self._cases = {}

  def __call__(self, name: str, *, causal: bool = False, length: int = 8, seed: int = 0, **options) -> AttentionCase:
    key = (name, causal, length, seed, repr(sorted(options.items())))
    if key not in self._cases:
      self._cases[key] = _attention_case(name, causal, length, seed, options)
    return self._cases[key]


def _attention_case(name, causal, length, seed, options) -> AttentionCase:
  import jax
  import jax.numpy as jnp
  import numpy as np
  from attention_utils import random_params
  from nnx_cases import B, D, H, padding
  from nnx_cases import options as small_options

  from primal_jax.attention import get_attention

  settings = small_options(name, causal)
  if "max_len" in settings:
    settings["max_len"] = length
  module = get_attention(name)(num_heads=H, causal=causal, **{**settings, **options})
  x = jnp.asarray(np.random.default_rng(seed).standard_normal((B, length, D)), jnp.float32)
  mask = padding(length)
  params = random_params(module, x, seed=seed, mask=mask)

  def apply(params, x, mask):
    return module.apply({"params": params}, x, mask=mask, mutable=["ksvd"])[0]

  def loss(params, x, mask):
    return jnp.sum(jnp.where(mask[..., None], apply(params, x, mask), 0.0) ** 2)

  grad = jax.value_and_grad(loss, argnums=(0, 1))
  return AttentionCase(name, module, params, x, mask, jax.jit(apply), jax.jit(grad))


@pytest.fixture(scope="session")
def attention_cases():
  """The session's `AttentionCases` (see there): `attention_cases("performer", causal=True).apply(...)`."""
  return AttentionCases()
