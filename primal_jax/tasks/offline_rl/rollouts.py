"""Return-conditioned rollouts of a Decision Transformer in the MuJoCo envs, several episodes as one batch.

As the DT code's `evaluate_episode_rtg`: states are normalised with the dataset's mean and std; the
return-to-go starts at `target_return / reward_scale` and drops by `reward / reward_scale` after every
step; the current step's action slot holds zeros; the model sees the last `context` (K) steps.

Batching: all episodes start together, so at step t every live history has the same length; the model is
called once per step for all of them, on a [episodes, K] window that holds the last min(t + 1, K) steps
followed by masked padding, and the action is read at the last real position. Every layer is causal, so
the padding after it cannot change that action: this is the release's `get_action` (no left padding, a
history shorter than K runs as a shorter sequence) with one compiled shape instead of K. Episodes that
ended keep being computed (fixed shapes) but no longer step their env.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from primal_jax.tasks.offline_rl import policy as pol
from primal_jax.validation import check_positive

# The DT code's two conditioning returns per env (gym/experiment.py `env_targets`), D4RL scale.
TARGET_RETURNS = {"hopper": (3600.0, 1800.0), "halfcheetah": (12000.0, 6000.0), "walker2d": (5000.0, 2500.0)}


@functools.lru_cache(maxsize=16)
def _act_fn(apply_fn):
  """jit of (params, window arrays, index) -> the actions at `index` [E, act_dim]; compiled once per shape."""

  def act(params, states, actions, returns_to_go, timesteps, mask, index):
    preds = apply_fn({"params": params}, states, actions, returns_to_go, timesteps, mask)  # [E, K, A]
    return jax.lax.dynamic_index_in_dim(preds, index, axis=1, keepdims=False)

  return jax.jit(act)


def evaluate(
  apply_fn, params, env_name: str, *, episodes: int, seed: int, target_return: float, reward_scale: float,
  state_mean: np.ndarray, state_std: np.ndarray, context: int, act_dim: int, max_ep_len: int = 1000,
) -> dict[str, float]:  # fmt: skip
  """Mean (and std) undiscounted return, D4RL normalised score and length of `episodes` episodes.

  `apply_fn(variables, states, actions, returns_to_go, timesteps, mask)` -> action predictions [E, K, A]
  (a `DecisionTransformer` built with `action_only=True`). Env e is reset with seed `seed + e`.
  """
  check_positive(episodes, "episodes")
  check_positive(context, "context")
  returns, lengths = run_episodes(
    apply_fn, params, env_name, episodes=episodes, seed=seed, target_return=target_return,
    reward_scale=reward_scale, state_mean=state_mean, state_std=state_std, context=context, act_dim=act_dim,
    max_ep_len=max_ep_len,
  )  # fmt: skip
  scores = pol.normalized_score(env_name, returns)
  return {
    "return": float(returns.mean()),
    "return_std": float(returns.std()),
    "normalized_score": float(scores.mean()),
    "normalized_score_std": float(scores.std()),
    "episode_length": float(lengths.mean()),
  }


def run_episodes(
  apply_fn, params, env_name: str, *, episodes: int, seed: int, target_return: float, reward_scale: float,
  state_mean: np.ndarray, state_std: np.ndarray, context: int, act_dim: int, max_ep_len: int = 1000,
  make_env: Callable[[str], Any] = pol.make_env,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
  """(returns [E] float64, lengths [E] int) of `episodes` lock-step episodes (module doc).

  `make_env(env_name)` makes each episode's env (closed at the end): e.g. one made with
  `render_mode="rgb_array"` and wrapped in `gymnasium.wrappers.RenderCollection` keeps the episode's frames.
  """
  envs = [make_env(env_name) for _ in range(episodes)]
  try:
    first = np.stack([env.reset(seed=seed + e)[0] for e, env in enumerate(envs)]).astype(np.float32)
    state_dim = first.shape[1]
    if state_mean.shape != (state_dim,) or state_std.shape != (state_dim,):
      raise ValueError(f"state_mean/state_std must have shape [{state_dim}] (the env's), got {state_mean.shape}")
    act = _act_fn(apply_fn)
    k, e_range = context, np.arange(episodes)
    states = np.zeros((episodes, max_ep_len + 1, state_dim), np.float32)  # normalised history
    actions = np.zeros((episodes, max_ep_len + 1, act_dim), np.float32)
    rtg = np.zeros((episodes, max_ep_len + 1), np.float32)
    states[:, 0] = (first - state_mean) / state_std
    rtg[:, 0] = target_return / reward_scale
    returns, lengths = np.zeros(episodes, np.float64), np.zeros(episodes, np.int64)
    alive = np.ones(episodes, bool)
    for t in range(max_ep_len):
      lo = max(0, t + 1 - k)
      n = t + 1 - lo  # real steps in the window
      window = np.zeros((episodes, k), np.int32)
      window[:, :n] = 1
      pad = k - n

      def cut(x, pad=pad, lo=lo, t=t):
        return np.concatenate([x[:, lo : t + 1], np.zeros((episodes, pad) + x.shape[2:], x.dtype)], axis=1)

      steps = np.minimum(np.arange(lo, lo + k), max_ep_len - 1)[None].repeat(episodes, 0).astype(np.int32)
      steps[:, n:] = 0
      chosen = act(
        params, jnp.asarray(cut(states)), jnp.asarray(cut(actions)), jnp.asarray(cut(rtg)[..., None]),
        jnp.asarray(steps), jnp.asarray(window), n - 1,
      )  # fmt: skip
      chosen = np.asarray(jax.device_get(chosen), np.float32)  # [E, A]
      if not np.isfinite(chosen).all():
        raise ValueError(f"the model predicted a non-finite action at step {t} of the {env_name} rollout")
      actions[:, t] = chosen
      for e in e_range[alive]:
        obs, reward, terminated, truncated, _ = envs[e].step(chosen[e])
        returns[e] += reward
        lengths[e] += 1
        states[e, t + 1] = (np.asarray(obs, np.float32) - state_mean) / state_std
        rtg[e, t + 1] = rtg[e, t] - reward / reward_scale
        if terminated or truncated:
          alive[e] = False
      if not alive.any():
        break
    return returns, lengths
  finally:
    for env in envs:
      env.close()
