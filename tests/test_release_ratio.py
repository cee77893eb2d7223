"""experiments.release_ratio: the release's inputs, the docs table of its record, the refusal to rewrite one, and
(where torch and the release are named, as for tests/test_vs_release.py) one epoch of the release's own run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments.release_ratio import release_arrays

ROOT = Path(__file__).resolve().parents[1]


def test_release_arrays_standardise_over_every_training_step_then_pad():
  """The release's `Normalizer` ("standardization"): per channel over all time steps of the training split,
  pandas' std (ddof 1) plus float64 eps; series zero-padded at the end. By hand on two series of 3 and 1 steps."""
  a = np.array([[1.0, 10.0], [2.0, 10.0], [3.0, 13.0]], dtype=np.float32)
  b = np.array([[6.0, 7.0]], dtype=np.float32)
  out = release_arrays([a, b], [1, 0])
  # channel 0: 1, 2, 3, 6 -> mean 3, sample var (4 + 1 + 0 + 9) / 3; channel 1: 10, 10, 13, 7 -> mean 10, var 18 / 3
  mean, std = np.array([3.0, 10.0]), np.sqrt([14 / 3, 6.0]) + np.finfo(float).eps
  np.testing.assert_allclose(out["values"][0], (a - mean) / std, rtol=1e-6)
  np.testing.assert_allclose(out["values"][1, 0], (b[0] - mean) / std, rtol=1e-6)
  assert out["values"].shape == (2, 3, 2) and not out["values"][1, 1:].any()
  assert out["mask"].tolist() == [[True, True, True], [True, False, False]]
  assert out["labels"].tolist() == [1, 0] and out["labels"].dtype == np.int64


def _record(tmp_path: Path, ratios_by_seed: dict[int, list[float]]) -> Path:
  runs = [
    {"seed": seed, "torch": "2.13.0+cpu", "steps": [{"ratio": r, "eta": 0.5, "task_loss": 1.0, "ksvd_loss": 2 * r}
                                                    for r in ratios]}
    for seed, ratios in ratios_by_seed.items()
  ]  # fmt: skip
  meta = {"dataset": "JapaneseVowels", "epochs": 2, "release_commit": "084d122abc", "platform": "cpu"}
  path = tmp_path / "release_ratio" / "jv" / "ratio.json"
  path.parent.mkdir(parents=True)
  path.write_text(json.dumps({"meta": meta, "runs": runs}))
  return path


def test_the_docs_table_shows_each_seeds_ratio_at_the_first_middle_and_last_steps_and_their_mean(tmp_path, monkeypatch):
  from experiments.tables import common
  from experiments.tables.ksvd_ratio import release_ratio

  _record(tmp_path, {0: [100.0, 50.0, 20.0, 10.0], 1: [200.0, 70.0, 40.0, 30.0]})
  monkeypatch.setattr(common, "RESULTS", tmp_path)
  table = release_ratio("jv", tmp_path)
  assert "| torch seed | eta x KSVD / task, step 1 | eta x KSVD / task, step 2 | eta x KSVD / task, step 4 |" in table
  assert "| 0 | 100 | 50 | 10 |" in table and "| 1 | 200 | 70 | 30 |" in table
  assert "| mean | 150 | 60 | 20 |" in table
  assert "commit 084d122), JapaneseVowels, eta 0.5, 2 epochs (4 steps of batch 16), torch 2.13.0+cpu" in table
  _record(tmp_path / "b", {0: [1.0, 2.0], 1: [1.0]})
  monkeypatch.setattr(common, "RESULTS", tmp_path / "b")
  with pytest.raises(ValueError, match="different step counts"):
    release_ratio("jv", tmp_path)


def test_a_folder_that_holds_a_record_and_bad_seeds_or_epochs_are_refused_before_anything_runs(tmp_path):
  (tmp_path / "ratio.json").write_text("{}")
  args = ["--release_dir=/nowhere", "--torch_python=/nowhere/python", f"--out={tmp_path}"]
  command = [sys.executable, "-m", "experiments.release_ratio", *args]
  done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
  assert done.returncode != 0 and "records are never rewritten" in done.stderr
  assert (tmp_path / "ratio.json").read_text() == "{}"
  for bad, says in (("--epochs=0", "--epochs: at least 1, got 0"), ("--seeds=0,x", "--seeds: comma-separated")):
    fresh = tmp_path / bad.strip("-").split("=")[0]
    done = subprocess.run([*command[:-1], f"--out={fresh}", bad], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode != 0 and says in done.stderr and not fresh.exists()


@pytest.mark.slow
def test_one_epoch_of_the_releases_own_run_where_torch_and_the_release_are_named(tmp_path):
  torch_python, release = os.environ.get("PRIMAL_JAX_TORCH_PYTHON"), os.environ.get("PRIMAL_JAX_RELEASE_DIR")
  if not (torch_python and release):
    pytest.skip("PRIMAL_JAX_TORCH_PYTHON and PRIMAL_JAX_RELEASE_DIR name torch and the release (docs/benchmarks.md)")
  args = [f"--release_dir={release}", f"--torch_python={torch_python}", f"--out={tmp_path}", "--seeds=0", "--epochs=1"]
  subprocess.run([sys.executable, "-m", "experiments.release_ratio", *args], check=True, cwd=ROOT)
  steps = json.loads((tmp_path / "ratio.json").read_text())["runs"][0]["steps"]
  assert len(steps) == 17  # 270 training series in batches of 16
  assert all(
    np.isfinite(s["ratio"]) and s["ratio"] == pytest.approx(0.5 * s["ksvd_loss"] / s["task_loss"]) for s in steps
  )
  assert steps[0]["ratio"] > 10  # the release's term dominates at step 1 (ours: 140-302)
