"""Offline-RL data a run cannot use is refused when the pipeline is built, in one line (issue 26, items 8, 10).

Real files: D4RL HDF5 files written with h5py (a HalfCheetah-sized one for env=hopper, a truncated one, one that
is not HDF5 at all), Minari datasets recorded offline from the real MuJoCo envs, and the training binary.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ml_collections
import numpy as np
import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")
h5py = pytest.importorskip("h5py")

from primal_jax.errors import ConfigError, MissingFileError  # noqa: E402
from primal_jax.tasks.offline_rl import input_pipeline as seg  # noqa: E402
from primal_jax.tasks.offline_rl.trajectories import load_trajectories  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}


def _write(path, n=30, obs=11, act=3, seed=0):
  rng = np.random.default_rng(seed)
  timeouts = np.zeros(n, bool)
  timeouts[[9, 19, n - 1]] = True
  with h5py.File(path, "w") as f:
    f.create_dataset("observations", data=rng.standard_normal((n, obs)).astype(np.float32))
    f.create_dataset("actions", data=rng.uniform(-1, 1, (n, act)).astype(np.float32))
    f.create_dataset("rewards", data=rng.uniform(0, 1, n).astype(np.float32))
    f.create_dataset("terminals", data=np.zeros(n, bool))
    f.create_dataset("timeouts", data=timeouts)
  return str(path)


def _config(**kw):
  base = dict(task="d4rl", env="hopper", dataset="medium", source="d4rl", batch_size=4, context=4, seed=0)
  return ml_collections.ConfigDict({**base, **kw})


@pytest.mark.parametrize(
  "obs, act, message",
  [
    (17, 6, r"data\.path .*: observations have 17 features and actions 6; env='hopper' \(Hopper-v4\) has 11 and 3"),
    (11, 6, r"observations have 11 features and actions 6; env='hopper' \(Hopper-v4\) has 11 and 3"),
  ],
)
def test_d4rl_data_of_another_env_is_refused_when_the_pipeline_is_built(tmp_path, obs, act, message):
  path = _write(tmp_path / "halfcheetah-medium-v2.hdf5", obs=obs, act=act)
  with pytest.raises(ConfigError, match=message):
    seg.make_offline_rl_pipeline(_config(path=path))
  if (obs, act) == (17, 6):  # the same file with its own env builds
    assert seg.make_offline_rl_pipeline(_config(path=path, env="halfcheetah")).info.state_dim == 17


def _record_minari(env_name: str, dataset_id: str, steps: int = 30) -> None:
  minari = pytest.importorskip("minari")
  from primal_jax.tasks.offline_rl import policy as pol

  env = minari.DataCollector(pol.make_env(env_name), record_infos=False)
  rng = np.random.default_rng(0)
  env.reset(seed=0)
  for _ in range(steps):
    _, _, term, trunc, _ = env.step(rng.uniform(-1, 1, env.action_space.shape).astype(np.float32))
    if term or trunc:
      env.reset()
  env.create_dataset(dataset_id, algorithm_name="uniform random", description="test")
  env.close()


def test_a_minari_dataset_of_another_env_is_refused(tmp_path, monkeypatch):
  pytest.importorskip("minari")
  monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
  _record_minari("halfcheetah", "test/halfcheetah/random-v0")
  with pytest.raises(ConfigError, match=r"data\.minari_id 'test/halfcheetah/random-v0': observations have 17 "
                     r"features and actions 6; env='hopper' \(Hopper-v4\) has 11 and 3"):  # fmt: skip
    seg.make_offline_rl_pipeline(_config(source="minari", minari_id="test/halfcheetah/random-v0"))


def test_a_missing_minari_dataset_is_one_line_naming_the_id(tmp_path, monkeypatch):
  pytest.importorskip("minari")
  monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
  with pytest.raises(MissingFileError, match=r"data\.minari_id: no local Minari dataset 'mujoco/hopper/nope-v0'"):
    load_trajectories("minari", env="hopper", level="medium", minari_id="mujoco/hopper/nope-v0")


def test_malformed_d4rl_hdf5_files_are_one_line_naming_the_file(tmp_path):
  garbage = tmp_path / "garbage.hdf5"
  garbage.write_bytes(b"not an HDF5 file\n" * 100)
  good = Path(_write(tmp_path / "good.hdf5", n=2000))
  truncated = tmp_path / "truncated.hdf5"
  truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
  grouped = tmp_path / "grouped.hdf5"
  with h5py.File(grouped, "w") as f:
    f.create_group("observations")
  for path in (garbage, truncated, grouped):
    with pytest.raises(ConfigError, match=rf"data\.path: {path} is not a readable D4RL HDF5 file") as info:
      load_trajectories("d4rl", env="hopper", level="medium", path=str(path))
    assert "\n" not in str(info.value)


def test_a_negative_embedded_size_names_data_size():
  with pytest.raises(ConfigError, match=r"data\.size must be an integer >= 1 .*got -5"):
    load_trajectories("embedded", env="hopper", level="medium", size=-5)


@pytest.mark.parametrize("targets", [(float("nan"),), (3600.0, float("inf")), (1800.0, -float("inf"))])
def test_non_finite_target_returns_are_refused_before_the_data_is_read(tmp_path, targets):
  with pytest.raises(ConfigError, match=r"data\.target_returns must be finite numbers"):
    seg.make_offline_rl_pipeline(_config(path=str(tmp_path / "not_read.hdf5"), target_returns=targets))


def _binary(tmp_path, *overrides) -> subprocess.CompletedProcess:
  command = [sys.executable, "-m", "experiments.main", "--config=d4rl:smoke", f"--workdir={tmp_path / 'run'}"]
  return subprocess.run([*command, *overrides], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)


def test_the_binary_refuses_a_nan_target_and_another_envs_file_in_one_line(tmp_path):
  path = _write(tmp_path / "halfcheetah-medium-v2.hdf5", obs=17, act=6)
  for overrides, message in (
    (["--config.data.target_returns=nan"], "data.target_returns must be finite numbers"),
    (["--config.data.target_returns=(nan,)"], "data.target_returns must be finite numbers"),  # a string to absl
    (["--config.data.source=d4rl", f"--config.data.path={path}"], "observations have 17 features and actions 6"),
  ):
    result = _binary(tmp_path, *overrides)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(lines) == 1 and message in lines[0], result.stderr[-3000:]
    assert not (tmp_path / "run" / "checkpoints").exists()
