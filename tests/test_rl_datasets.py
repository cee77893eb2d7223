"""The D4RL-style dataset generator: layout, dtypes, episode bookkeeping, determinism and the cache."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")
pytest.importorskip("h5py")

from primal_jax.tasks.offline_rl import datasets as ds  # noqa: E402
from primal_jax.tasks.offline_rl import policy as pol  # noqa: E402


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
  """Small random actors standing in for the committed ones (hopper: 11 -> 3)."""
  root = tmp_path_factory.mktemp("policies")
  for i, name in enumerate(["medium", "expert", "replay_0000000", "replay_0005000"]):
    rng = np.random.default_rng(i)
    arrays = {
      "w0": rng.normal(0, 0.3, (11, 16)),
      "b0": np.zeros(16),
      "w1": rng.normal(0, 0.3, (16, 6)),
      "b1": np.zeros(6),
    }
    pol.save_policy(root / f"{name}.npz", {k: v.astype(np.float32) for k, v in arrays.items()}, {"env": "hopper"})
  return root


def test_rollout_has_the_d4rl_layout(policy_dir):
  data = ds.generate("hopper", "medium", size=300, seed=0, policy_dir=policy_dir)
  assert set(data) == set(ds.KEYS)
  assert data["observations"].shape == data["next_observations"].shape == (300, 11)
  assert data["actions"].shape == (300, 3) and data["actions"].dtype == np.float32
  assert data["rewards"].dtype == np.float32 and data["terminals"].dtype == bool and data["timeouts"].dtype == bool
  assert np.abs(data["actions"]).max() <= 1.0
  ends = data["terminals"] | data["timeouts"]
  assert ends[-1] and ends.sum() > 1  # random hopper actors fall within 300 steps
  # Within an episode the next observation is the following observation.
  inside = np.flatnonzero(~ends[:-1])
  np.testing.assert_array_equal(data["next_observations"][inside], data["observations"][inside + 1])
  info = ds.summary("hopper", data)
  assert info["transitions"] == 300 and info["complete_episodes"] == int(data["terminals"].sum())
  returns, lengths, _ = ds.episodes(data)
  assert lengths.sum() == 300 and np.isclose(returns.sum(), data["rewards"].astype(np.float64).sum())


def test_levels_are_built_from_their_policies(policy_dir):
  medium = ds.generate("hopper", "medium", size=200, seed=3, policy_dir=policy_dir)
  expert = ds.generate("hopper", "expert", size=200, seed=3, policy_dir=policy_dir)
  both = ds.generate("hopper", "medium-expert", size=200, seed=3, policy_dir=policy_dir)
  for k in ds.KEYS:
    np.testing.assert_array_equal(both[k], np.concatenate([medium[k], expert[k]]))
  replay = ds.generate("hopper", "medium-replay", size=201, seed=3, policy_dir=policy_dir)
  assert len(replay["rewards"]) == 201 and replay["timeouts"][100] | replay["terminals"][100]  # 101 + 100
  assert not np.array_equal(medium["actions"], expert["actions"])
  with pytest.raises(FileNotFoundError):
    ds.generate("walker2d", "medium", size=10, policy_dir=policy_dir / "none")


def test_cached_hdf5_is_deterministic_and_verified(policy_dir, tmp_path):
  data_a, info_a = ds.load("hopper", "medium-replay", size=250, seed=1, cache_dir=tmp_path / "a", policy_dir=policy_dir)
  data_b, info_b = ds.load("hopper", "medium-replay", size=250, seed=1, cache_dir=tmp_path / "b", policy_dir=policy_dir)
  path_a = tmp_path / "a" / "d4rl" / "hopper-medium-replay-v4-n250-s1.hdf5"
  assert path_a.read_bytes() == (tmp_path / "b" / "d4rl" / path_a.name).read_bytes()
  assert info_a["sha256"] == info_b["sha256"] == ds.sha256_file(path_a)
  for k in ds.KEYS:
    np.testing.assert_array_equal(data_a[k], data_b[k])
  import h5py

  with h5py.File(path_a) as f:
    assert set(f.keys()) == set(ds.KEYS) and f["observations"].shape == (250, 11)
  # A second load reads the cache; an altered file fails its checksum and is regenerated.
  mtime = path_a.stat().st_mtime_ns
  ds.load("hopper", "medium-replay", size=250, seed=1, cache_dir=tmp_path / "a", policy_dir=policy_dir)
  assert path_a.stat().st_mtime_ns == mtime
  with h5py.File(path_a, "r+") as f:
    f["rewards"][0] = 1e6
  again, _ = ds.load("hopper", "medium-replay", size=250, seed=1, cache_dir=tmp_path / "a", policy_dir=policy_dir)
  np.testing.assert_array_equal(again["rewards"], data_a["rewards"])
  other, _ = ds.load("hopper", "medium-replay", size=250, seed=2, cache_dir=tmp_path / "a", policy_dir=policy_dir)
  assert not np.array_equal(other["observations"], data_a["observations"])


def test_cli_writes_and_then_reads_the_cache(policy_dir, tmp_path, capsys):
  from experiments import make_d4rl_dataset

  argv = ["--env=hopper", "--level=medium-expert", "--size=60", f"--cache_dir={tmp_path}", f"--policy_dir={policy_dir}"]
  make_d4rl_dataset.main(argv)
  first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert first["transitions"] == 120 and first["level"] == "medium-expert"
  make_d4rl_dataset.main(argv)
  again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert again["sha256"] == first["sha256"] == ds.sha256_file(tmp_path / "d4rl" / "hopper-medium-expert-v4-n60-s0.hdf5")


@pytest.mark.parametrize("size", ["0", "-5"])
def test_cli_refuses_a_size_below_one_in_one_line(policy_dir, tmp_path, capsys, size):
  """Issue 26.7: --size=0 exited 0 and reported a NaN mean return and score; -5 ended in a traceback."""
  from experiments import make_d4rl_dataset

  with pytest.raises(SystemExit) as exit_info:
    make_d4rl_dataset.main([f"--size={size}", f"--cache_dir={tmp_path}", f"--policy_dir={policy_dir}"])
  assert exit_info.value.code == 2
  captured = capsys.readouterr()
  assert (
    captured.out == ""
    and captured.err == f"error: --size must be an integer >= 1 (transitions per level), got {size}\n"
  )
  assert not (tmp_path / "d4rl").exists()
  for bad in (0, -5):
    with pytest.raises(ValueError, match="size must be an integer >= 1"):
      ds.generate("hopper", "medium", size=bad, policy_dir=policy_dir)


def test_cli_names_a_missing_policy_dir_in_one_line(tmp_path, capsys):
  from experiments import make_d4rl_dataset

  with pytest.raises(SystemExit) as exit_info:
    make_d4rl_dataset.main(["--size=10", f"--cache_dir={tmp_path}", f"--policy_dir={tmp_path / 'nowhere'}"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert (
    err.startswith(f"error: --policy_dir {tmp_path / 'nowhere'}: no behaviour policy for hopper/medium")
    and err.count("\n") == 1
  )
