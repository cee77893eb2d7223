"""The offline-RL input pipeline: trajectory sources (D4RL HDF5, Minari, embedded), DT segments, rollouts.

References: the Decision Transformer code's `get_batch` loop, written out per segment in NumPy below, for the
vectorised sampler; `get_action` (the release's, no padding) for the batched rollout window.
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np
import pytest
from flax import linen as nn

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")
h5py = pytest.importorskip("h5py")

from primal_jax.models import DecisionTransformer, dt_config  # noqa: E402
from primal_jax.models.decision_transformer import get_action  # noqa: E402
from primal_jax.tasks.offline_rl import input_pipeline as seg  # noqa: E402
from primal_jax.tasks.offline_rl import rollouts  # noqa: E402
from primal_jax.tasks.offline_rl.trajectories import load_trajectories, split_trajectories  # noqa: E402

STATE, ACT = 11, 3  # Hopper's dims: rollouts run in the real Hopper-v4


def _arrays(lengths=(7, 3, 12, 5), seed=0, cut_last=True):
  """Flat D4RL arrays of trajectories with the given lengths (the first terminal, the others timeouts)."""
  rng = np.random.default_rng(seed)
  n = sum(lengths)
  ends = np.cumsum(lengths) - 1
  terminals, timeouts = np.zeros(n, bool), np.zeros(n, bool)
  terminals[ends[0]] = True
  timeouts[ends[1:-1] if cut_last else ends[1:]] = True
  return {
    "observations": rng.standard_normal((n, STATE)).astype(np.float32),
    "actions": rng.uniform(-1, 1, (n, ACT)).astype(np.float32),
    "rewards": rng.uniform(0, 2, n).astype(np.float32),
    "terminals": terminals,
    "timeouts": timeouts,
  }


def _write_hdf5(path, arrays):
  with h5py.File(path, "w") as f:
    for k, v in arrays.items():
      f.create_dataset(k, data=v)
    f.create_dataset("infos/qpos", data=np.zeros((len(arrays["rewards"]), 6)))  # extra keys D4RL files carry


def _data_config(**kw):
  base = dict(task="d4rl", env="hopper", dataset="medium", source="d4rl", batch_size=8, context=4, seed=3)
  return ml_collections.ConfigDict({**base, **kw})


# ============================================================================ sources


def test_split_trajectories_cuts_after_terminals_and_timeouts_and_keeps_the_tail():
  arrays = _arrays()
  trajs = split_trajectories(arrays)
  assert [len(t) for t in trajs] == [7, 3, 12, 5]  # the last 5 steps end in neither: kept, as the DT script
  np.testing.assert_array_equal(trajs[2].observations, arrays["observations"][10:22])
  assert trajs[0].terminals[-1] and not trajs[1].terminals.any()
  np.testing.assert_allclose(trajs[3].total_return, arrays["rewards"][22:].astype(np.float64).sum(), rtol=1e-12)


def test_sources_refuse_bad_data_naming_the_problem(tmp_path):
  arrays = _arrays()
  with pytest.raises(ValueError, match="missing \\['timeouts'\\]"):
    split_trajectories({k: v for k, v in arrays.items() if k != "timeouts"})
  bad = dict(arrays, rewards=np.where(np.arange(27) == 4, np.nan, arrays["rewards"]))
  with pytest.raises(ValueError, match="rewards has NaN"):
    split_trajectories(bad)
  with pytest.raises(ValueError, match="data.path"):
    load_trajectories("d4rl", env="hopper", level="medium", path=str(tmp_path / "missing.hdf5"))
  with pytest.raises(ValueError, match="data.source"):
    load_trajectories("pickle", env="hopper", level="medium")
  with pytest.raises(ValueError, match="data.minari_id"):
    load_trajectories("minari", env="hopper", level="medium")


def test_d4rl_hdf5_by_path_and_by_directory(tmp_path):
  arrays = _arrays()
  _write_hdf5(tmp_path / "hopper-medium-v2.hdf5", arrays)
  by_path = load_trajectories("d4rl", env="hopper", level="medium", path=str(tmp_path / "hopper-medium-v2.hdf5"))
  by_dir = load_trajectories("d4rl", env="hopper", level="medium", data_dir=str(tmp_path))
  expected = split_trajectories(arrays)
  for got in (by_path, by_dir):
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
      np.testing.assert_array_equal(a.observations, b.observations)
      np.testing.assert_array_equal(a.actions, b.actions)
      np.testing.assert_array_equal(a.rewards, b.rewards)


def test_minari_dataset_created_offline_loads_episode_by_episode(tmp_path, monkeypatch):
  minari = pytest.importorskip("minari")
  monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
  from primal_jax.tasks.offline_rl import policy as pol

  env = minari.DataCollector(pol.make_env("hopper"), record_infos=False)
  rng = np.random.default_rng(0)
  recorded = []
  for ep in range(3):
    obs, _ = env.reset(seed=ep)
    rewards = []
    for _ in range(40):
      obs, reward, term, trunc, _ = env.step(rng.uniform(-1, 1, ACT).astype(np.float32))
      rewards.append(reward)
      if term or trunc:
        break
    recorded.append(np.asarray(rewards, np.float32))
  env.create_dataset("test/hopper/random-v0", algorithm_name="uniform random", description="test")
  env.close()
  trajs = load_trajectories("minari", env="hopper", level="random", minari_id="test/hopper/random-v0")
  assert [len(t) for t in trajs] == [len(r) for r in recorded]
  for t, r in zip(trajs, recorded, strict=True):
    np.testing.assert_allclose(t.rewards, r, rtol=1e-6)
    assert t.observations.shape == (len(r), STATE) and t.actions.shape == (len(r), ACT)


# ============================================================================ segments


def _dt_get_batch_reference(trajs, traj_idx, starts, k, mean, std, scale, max_ep_len, padding):
  """The DT code's get_batch loop (gym/experiment.py), one segment at a time, float64."""
  out = {key: [] for key in ("states", "actions", "returns_to_go", "timesteps", "mask")}
  for i, si in zip(traj_idx, starts, strict=True):
    t = trajs[i]
    s, a = t.observations[si : si + k].astype(np.float64), t.actions[si : si + k].astype(np.float64)
    rtg = np.array([t.rewards[j:].astype(np.float64).sum() for j in range(si, si + len(s))])
    ts = np.minimum(np.arange(si, si + len(s)), max_ep_len - 1)
    pad = k - len(s)

    def join(padded, real, pad=pad):
      return np.concatenate([padded, real] if padding == "left" else [real, padded])

    out["states"].append((join(np.zeros((pad, STATE)), s) - mean) / std)
    out["actions"].append(join(np.full((pad, ACT), -10.0), a))
    out["returns_to_go"].append(join(np.zeros(pad), rtg)[:, None] / scale)
    out["timesteps"].append(join(np.zeros(pad, int), ts))
    out["mask"].append(join(np.zeros(pad), np.ones(len(s))))
  return {key: np.stack(v) for key, v in out.items()}


@pytest.mark.parametrize("padding", ["left", "right"])
def test_segments_equal_the_dt_code_loop(padding):
  trajs = split_trajectories(_arrays(lengths=(7, 3, 12, 5, 30)))
  k, scale, max_ep_len = 6, 10.0, 20
  sampler = seg.SegmentSampler(trajs, context=k, reward_scale=scale, max_ep_len=max_ep_len)
  mean, std = seg.state_statistics(trajs)
  got = sampler.sample(np.random.default_rng(5), 64, mean, std, padding)
  rng = np.random.default_rng(5)  # the same draws, made again
  idx = rng.choice(len(trajs), size=64, p=sampler.probs)
  starts = (rng.random(64) * sampler.lengths[idx]).astype(int)
  ref = _dt_get_batch_reference(trajs, idx, starts, k, mean, std, scale, max_ep_len, padding)
  for key in ref:
    np.testing.assert_allclose(got[key].reshape(ref[key].shape), ref[key], rtol=1e-5, atol=1e-5, err_msg=key)
  np.testing.assert_array_equal(got["targets"], got["actions"])
  np.testing.assert_array_equal(got["weight"], got["mask"])
  assert (got["mask"].sum(1) < k).any() and got["timesteps"].max() == max_ep_len - 1  # both edge cases hit


def test_state_statistics_are_the_dt_codes():
  trajs = split_trajectories(_arrays())
  mean, std = seg.state_statistics(trajs)
  states = np.concatenate([t.observations for t in trajs]).astype(np.float64)
  np.testing.assert_allclose(mean, states.mean(0), rtol=1e-6)
  np.testing.assert_allclose(std, states.std(0) + 1e-6, rtol=1e-6)


def test_trajectories_are_drawn_in_proportion_to_their_length():
  trajs = split_trajectories(_arrays(lengths=(10, 30, 60), cut_last=False))
  sampler = seg.SegmentSampler(trajs, context=4, reward_scale=1.0, max_ep_len=100)
  rng = np.random.default_rng(0)
  draws = rng.choice(3, size=200_000, p=sampler.probs)
  np.testing.assert_allclose(np.bincount(draws) / draws.size, [0.1, 0.3, 0.6], atol=0.005)  # ~5 sigma


def test_pipeline_batches_are_deterministic_resumable_and_split_over_hosts(tmp_path):
  _write_hdf5(tmp_path / "d.hdf5", _arrays())
  cfg = _data_config(path=str(tmp_path / "d.hdf5"), steps_per_epoch=5)
  whole = seg.make_offline_rl_pipeline(cfg)
  assert whole.info.split_sizes["train"] == 27 and whole.info.state_dim == STATE and whole.info.act_dim == ACT
  epoch1 = list(whole.train_batches(1))
  assert len(epoch1) == 5
  again = list(whole.train_batches(1, start=2))
  for a, b in zip(epoch1[2:], again, strict=True):
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])
  assert not np.array_equal(epoch1[0]["states"], next(whole.train_batches(2))["states"])
  hosts = [seg.make_offline_rl_pipeline(cfg, process_index=p, process_count=2) for p in range(2)]
  parts = [next(h.train_batches(1)) for h in hosts]
  for key in epoch1[0]:
    np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), epoch1[0][key])
  with pytest.raises(ValueError, match="start"):
    next(whole.train_batches(0, start=6))
  with pytest.raises(ValueError, match="rollouts"):
    whole.eval_batches("test")
  with pytest.raises(ValueError, match="data.env"):
    seg.make_offline_rl_pipeline(_data_config(path=str(tmp_path / "d.hdf5"), env="ant"))


def test_default_targets_follow_the_data_source():
  trajs = split_trajectories(_arrays())
  assert seg.default_targets("d4rl", "hopper", trajs) == (3600.0, 1800.0)
  assert seg.default_targets("minari", "walker2d", trajs) == (5000.0, 2500.0)
  best = max(t.total_return for t in trajs)
  assert seg.default_targets("embedded", "hopper", trajs) == (float(np.ceil(best / 100) * 100),)


# ============================================================================ rollouts


K = 4


def _policy_model(masking):
  config = dt_config(True, num_layers=2, dim=16, num_heads=2, low_rank=4, hidden_dim=32, dropout_rate=0.0)
  return DecisionTransformer(config, state_dim=STATE, act_dim=ACT, max_ep_len=50, masking=masking, action_only=True)


def _policy_params(model):
  z = np.zeros((1, K, STATE), np.float32)
  variables = model.init(
    jax.random.key(1), z, np.zeros((1, K, ACT), np.float32), np.zeros((1, K, 1)), np.zeros((1, K), int)
  )
  return nn.unbox(variables["params"])


@pytest.mark.matmul_precision("highest")  # two paths compared at float32 tolerance (TF32 on a GPU misses it)
@pytest.mark.parametrize("masking", ["release", "padding_aware"])
def test_rollout_window_equals_the_release_get_action(masking):
  """Right-padded fixed-shape windows give the action the release's unpadded get_action gives, at every t."""
  model = _policy_model(masking)
  params = _policy_params(model)
  rng = np.random.default_rng(0)
  steps = K + 3
  states, actions = rng.standard_normal((steps, STATE)), rng.uniform(-1, 1, (steps, ACT))
  rtg, ts = rng.uniform(0, 2, steps), np.arange(steps)
  act = rollouts._act_fn(model.apply)
  full = DecisionTransformer(model.config, STATE, ACT, 50, masking)  # returns all heads: what get_action reads
  for t in range(steps):
    lo, n = max(0, t + 1 - K), min(t + 1, K)
    hist = [x[: t + 1].copy() for x in (states, actions, rtg, ts)]
    hist[1][-1] = 0.0  # the current step's action slot
    want = get_action(full, params, *hist, context=K, pad=False)
    win = [np.zeros((1, K) + x.shape[1:], np.float32) for x in (states, actions)]
    win[0][0, :n], win[1][0, :n] = hist[0][lo:], hist[1][lo:]
    r = np.zeros((1, K, 1), np.float32)
    r[0, :n, 0] = hist[2][lo:]
    tt, mask = np.zeros((1, K), np.int32), np.zeros((1, K), np.int32)
    tt[0, :n], mask[0, :n] = hist[3][lo:], 1
    got = act(params, win[0], win[1], r, tt, mask, n - 1)
    np.testing.assert_allclose(np.asarray(got)[0], np.asarray(want), rtol=1e-5, atol=1e-6, err_msg=f"t={t}")


def test_batched_rollouts_are_seeded_and_scored_as_d4rl():
  model = _policy_model("padding_aware")
  params = _policy_params(model)
  kw = dict(
    episodes=3, seed=11, target_return=100.0, reward_scale=100.0, state_mean=np.zeros(STATE, np.float32),
    state_std=np.ones(STATE, np.float32), context=K, act_dim=ACT, max_ep_len=50,
  )  # fmt: skip
  returns, lengths = rollouts.run_episodes(model.apply, params, "hopper", **kw)
  again, _ = rollouts.run_episodes(model.apply, params, "hopper", **kw)
  np.testing.assert_array_equal(returns, again)
  assert (lengths >= 1).all() and (lengths <= 50).all()
  metrics = rollouts.evaluate(model.apply, params, "hopper", **kw)
  expected = 100 * (returns - (-20.272305)) / (3234.3 - (-20.272305))
  np.testing.assert_allclose(metrics["normalized_score"], expected.mean(), rtol=1e-12)
  np.testing.assert_allclose(metrics["return"], returns.mean(), rtol=1e-12)
  assert metrics["episode_length"] == lengths.mean()
  with pytest.raises(ValueError, match="state_mean"):
    rollouts.run_episodes(model.apply, params, "hopper", **{**kw, "state_mean": np.zeros(3, np.float32)})


def test_rollouts_run_in_the_envs_make_env_gives():
  """`make_env` supplies each episode's env (the notebook's rendering wrapper): the episodes are the same as in
  the default envs, and the wrapper saw every step of them."""
  import gymnasium as gym

  from primal_jax.tasks.offline_rl.policy import make_env

  model = _policy_model("padding_aware")
  params = _policy_params(model)
  kw = dict(
    episodes=2, seed=5, target_return=100.0, reward_scale=100.0, state_mean=np.zeros(STATE, np.float32),
    state_std=np.ones(STATE, np.float32), context=K, act_dim=ACT, max_ep_len=30,
  )  # fmt: skip
  made = []

  def recording_env(name):
    made.append(gym.wrappers.RecordEpisodeStatistics(make_env(name)))
    return made[-1]

  returns, lengths = rollouts.run_episodes(model.apply, params, "hopper", make_env=recording_env, **kw)
  default_returns, default_lengths = rollouts.run_episodes(model.apply, params, "hopper", **kw)
  np.testing.assert_array_equal(returns, default_returns)
  np.testing.assert_array_equal(lengths, default_lengths)
  assert len(made) == 2
  np.testing.assert_array_equal([env.episode_lengths for env in made], lengths)
  np.testing.assert_allclose([env.episode_returns for env in made], returns, rtol=1e-6)
