"""Two processes on one machine (jax.distributed over CPU collectives, gloo) train like one process.

Both setups see the same 2-device mesh: one process with 2 CPU devices, or two
processes with 1 device each, each feeding only its half of every global batch
and writing one shared orbax checkpoint.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from primal_jax.cli.config_lookup import load_config
from primal_jax.training.loop import load_state

REPO = Path(__file__).resolve().parents[1]
CONFIG = "uea"


@pytest.fixture(scope="module")
def data_dir(jv_tfds_dir):
  return jv_tfds_dir


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def launch(workdir, data_dir, devices: int, env_extra: dict | None = None) -> subprocess.Popen:
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  env.update(env_extra or {})
  args = [
    sys.executable, "-m", "experiments.main", f"--config={CONFIG}:smoke", f"--workdir={workdir}",
    f"--config.data.data_dir={data_dir}", "--config.total_steps=4", "--config.log_every_steps=1",
  ]  # fmt: skip
  return subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> str:
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == 0, out[-3000:]
  return out


def test_two_processes_match_one(data_dir, tmp_path):
  single = tmp_path / "single"
  finish(launch(single, data_dir, devices=2))

  multi = tmp_path / "multi"
  port = free_port()
  procs = [
    launch(
      multi,
      data_dir,
      devices=1,
      env_extra={
        "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
        "JAX_NUM_PROCESSES": "2",
        "JAX_PROCESS_ID": str(i),
      },
    )
    for i in range(2)
  ]
  outputs = [finish(p) for p in procs]
  assert "2 process(es)" in outputs[0] and "mesh {'data': 2, 'model': 1}" in outputs[0]
  assert outputs[1].strip() == "" or "step" not in outputs[1]  # only process 0 prints progress

  ref = json.loads((single / "summary.json").read_text())
  got = json.loads((multi / "summary.json").read_text())
  assert got["steps"] == ref["steps"] == 4
  for key, value in ref["final"].items():
    np.testing.assert_allclose(got["final"][key], value, rtol=1e-5, err_msg=key)

  config = load_config(f"{CONFIG}:smoke", lock=False)
  config.data.data_dir = data_dir
  config.total_steps = 4
  a = jax.device_get(load_state(config, single)[1].params)
  b = jax.device_get(load_state(config, multi)[1].params)
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg=jax.tree_util.keystr(path))
  # Process 1 wrote no metrics of its own: one line per logged step.
  train_lines = [json.loads(x) for x in (multi / "metrics.jsonl").read_text().splitlines()]
  assert [m["step"] for m in train_lines if m["prefix"] == "train"] == [1, 2, 3, 4]
