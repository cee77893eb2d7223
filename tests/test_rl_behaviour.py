"""SAC behaviour-policy training: the maths, a few updates, exact resumption, and the committed policies."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")

from experiments import train_behaviour  # noqa: E402
from primal_jax.tasks.offline_rl import behaviour  # noqa: E402
from primal_jax.tasks.offline_rl import policy as pol  # noqa: E402
from primal_jax.tasks.offline_rl.behaviour import TrainConfig, Trainer  # noqa: E402
from primal_jax.tasks.offline_rl.sac import tanh_gaussian_log_prob  # noqa: E402

TINY = dict(
  env="hopper",
  total_steps=300,
  start_steps=100,
  update_after=100,
  update_every=50,
  checkpoint_every=100,
  snapshot_every=100,
  eval_episodes=1,
  actor_hidden=(16,),
  critic_hidden=(16,),
  batch_size=32,
)


def test_tanh_gaussian_log_prob_matches_float64_change_of_variables():
  rng = np.random.default_rng(0)
  mean, log_std = rng.normal(size=(64, 3)), rng.uniform(-2, 1, size=(64, 3))
  u = mean + np.exp(log_std) * rng.normal(size=(64, 3)) * 2
  a = np.tanh(u)
  # density of u under N(mean, std) minus log |d tanh(u) / du| = log(1 - a^2), per dimension, summed.
  ref = np.sum(-0.5 * ((u - mean) / np.exp(log_std)) ** 2 - log_std - 0.5 * np.log(2 * np.pi) - np.log1p(-(a**2)), -1)
  got = tanh_gaussian_log_prob(
    jnp.asarray(u, jnp.float32), jnp.asarray(mean, jnp.float32), jnp.asarray(log_std, jnp.float32)
  )
  np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-4, atol=1e-3)
  # Far in the tail (tanh(u) == 1 in float32) the stable form stays finite.
  assert np.isfinite(float(tanh_gaussian_log_prob(jnp.full((1, 1), 30.0), jnp.zeros((1, 1)), jnp.zeros((1, 1)))[0]))


def _moved(a, b):
  """Largest absolute change between two pytrees."""
  return max(float(jnp.abs(x - y).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def test_sac_updates_change_parameters_sensibly():
  # The tiny training config's SAC and compiled update, shared with the resume test (one compilation).
  sac = behaviour._sac(TrainConfig(**TINY), 11, 3)
  state = sac.init(jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  k, b = TINY["update_every"], TINY["batch_size"]
  batches = {
    "obs": rng.normal(size=(k, b, 11)).astype(np.float32),
    "act": rng.uniform(-1, 1, size=(k, b, 3)).astype(np.float32),
    "rew": rng.normal(size=(k, b)).astype(np.float32),
    "done": (rng.uniform(size=(k, b)) < 0.1).astype(np.float32),
    "next_obs": rng.normal(size=(k, b, 11)).astype(np.float32),
  }
  new, metrics = behaviour._jitted_update(sac)(state, batches)
  assert int(new.step) == k
  assert all(np.isfinite(float(v)) for v in metrics.values())
  assert _moved(new.actor, state.actor) > 0 and _moved(new.critic, state.critic) > 0
  # Polyak targets trail the critic: they moved, by less than the critic did.
  assert 0 < _moved(new.target_critic, state.target_critic) < _moved(new.critic, state.critic)
  # A fresh policy's entropy (~1.4 per dim) exceeds the target -|A| = -3, so the temperature goes down.
  assert float(new.log_alpha) < float(state.log_alpha) == pytest.approx(math.log(1.0))


def _leaves_equal(a, b):
  return _moved(a, b) == 0.0


def test_training_script_resumes_to_the_uninterrupted_state(tmp_path):
  straight = Trainer(TrainConfig(**TINY), tmp_path / "straight", log=lambda s: None).run()
  # The script, stopped after one chunk, then rerun with the same command: it resumes from its checkpoint.
  argv = [f"--{k}={v}" for k, v in TINY.items() if k not in ("actor_hidden", "critic_hidden")]
  argv += [f"--workdir={tmp_path / 'resumed'}", "--threads=0"]
  cfg = TrainConfig(**TINY)
  config = train_behaviour._config
  train_behaviour._config = lambda args: cfg  # the tiny networks have no flags
  try:
    train_behaviour.main([*argv, "--max_chunks=1"])
    first = Trainer(cfg, tmp_path / "resumed", log=lambda s: None)
    assert first.restored and first.step == 100
    train_behaviour.main(argv)
  finally:
    train_behaviour._config = config
  resumed = Trainer(cfg, tmp_path / "resumed", log=lambda s: None)
  assert resumed.restored and resumed.step == straight.step == 300
  assert _leaves_equal(resumed.state, straight.state)
  for k in straight.buffer.FIELDS:
    np.testing.assert_array_equal(resumed.buffer.state()[k], straight.buffer.state()[k])
  snaps = sorted(p.name for p in (tmp_path / "straight" / "snapshots").glob("*.npz"))
  assert snaps == sorted(p.name for p in (tmp_path / "resumed" / "snapshots").glob("*.npz"))
  assert len(snaps) == 4  # steps 0, 100, 200, 300
  with (
    np.load(tmp_path / "straight" / "snapshots" / snaps[-1]) as a,
    np.load(tmp_path / "resumed" / "snapshots" / snaps[-1]) as b,
  ):
    for k in a.files:
      np.testing.assert_array_equal(a[k], b[k])


def test_export_picks_medium_expert_and_replay_snapshots(tmp_path):
  work = tmp_path / "run"
  Trainer(TrainConfig(**TINY), work, log=lambda s: None).run()
  (work / "command.txt").write_text("python -m experiments.train_behaviour --env=hopper ...\n")
  args = train_behaviour.parse(["--env=hopper", f"--workdir={work}", f"--out={tmp_path / 'out'}", "--export"])
  record = train_behaviour.export(args, "the command")
  roles = record["policies"]
  assert {"medium", "expert"} <= set(roles) and record["train_command"] == "the command"
  replay = sorted(r for r in roles if r.startswith("replay_"))
  assert replay[0] == "replay_0000000" and roles[replay[-1]]["step"] == roles["medium"]["step"]
  for role, rec in roles.items():
    path = tmp_path / "out" / "hopper" / rec["file"]
    assert rec["sha256"] == behaviour_sha256(path) and pol.load_policy(path).meta["role"] == role
  assert [roles[r]["step"] for r in replay] == [0, 100, 200][: len(replay)]
  assert (tmp_path / "out" / "hopper" / "policies.json").exists()


def behaviour_sha256(path):
  import hashlib

  return hashlib.sha256(path.read_bytes()).hexdigest()


def test_resume_refuses_a_changed_config(tmp_path):
  Trainer(TrainConfig(**{**TINY, "total_steps": 100}), tmp_path, log=lambda s: None).run()
  with pytest.raises(ValueError, match="batch_size"):
    Trainer(TrainConfig(**{**TINY, "batch_size": 64}), tmp_path, log=lambda s: None)


def test_normalized_score_uses_d4rl_reference_returns():
  assert pol.normalized_score("hopper", 3234.3) == pytest.approx(100.0)
  assert pol.normalized_score("halfcheetah", -280.178953) == pytest.approx(0.0)
  assert pol.normalized_score("walker2d", (4592.3 + 1.629008) / 2) == pytest.approx(50.0)


def _short_return(policy, env_name, steps=300, seed=0):
  """Return over the first `steps` steps (or to the episode's end); `policy=None` acts uniformly at random."""
  env = pol.make_env(env_name)
  obs, _ = env.reset(seed=seed)
  rng = np.random.default_rng(seed)
  total = 0.0
  for _ in range(steps):
    act = rng.uniform(-1, 1, env.action_space.shape).astype(np.float32) if policy is None else policy.act(obs)
    obs, rew, term, trunc, _ = env.step(act)
    total += float(rew)
    if term or trunc:
      break
  return total


@pytest.mark.parametrize("env_name", ["hopper", "halfcheetah", "walker2d"])
def test_committed_policies_load_and_beat_a_random_policy(env_name):
  root = train_behaviour.POLICIES / env_name
  if not (root / "medium.npz").exists():
    pytest.skip(f"no committed {env_name} policies")
  random_return = max(_short_return(None, env_name, seed=s) for s in range(3))
  for name in ("medium.npz", "expert.npz"):
    policy = pol.load_policy(root / name)
    assert policy.meta["env"] == env_name and policy.obs_dim == pol.make_env(env_name).observation_space.shape[0]
    assert _short_return(policy, env_name) > random_return + 50, name
