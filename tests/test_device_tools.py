"""tools/prepare_data.py and tools/device_sweep.sh: what they refuse (their real runs need a device or minutes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_prepare_data_refuses_an_unknown_name_in_one_line():
  proc = subprocess.run(
    [sys.executable, "tools/prepare_data.py", "listops", "imagenet"], cwd=ROOT, capture_output=True, text=True
  )
  assert proc.returncode == 2 and proc.stdout == ""
  accepted = "listops, image, pathfinder, hopper, uea"
  assert proc.stderr.strip() == f"prepare_data: unknown name(s) imagenet; accepted: {accepted}"


def test_device_sweep_prints_its_usage_without_arguments_and_needs_out():
  usage = subprocess.run(["bash", "tools/device_sweep.sh"], cwd=ROOT, capture_output=True, text=True)
  assert usage.returncode == 2 and "GROUP    TABLES:N[:after]" in usage.stdout and "set -u" not in usage.stdout
  env = {"PATH": "/usr/bin:/bin", "PRIMAL_JAX_COMMIT": "0" * 40}
  no_out = subprocess.run(
    ["bash", "tools/device_sweep.sh", "1", "experiments/sweeps/uea.py", "-", "table1_all:1"],
    cwd=ROOT, capture_output=True, text=True, env=env,
  )  # fmt: skip
  assert no_out.returncode != 0 and "OUT must name the folder the records go to" in no_out.stderr
