"""Soft Actor-Critic (Haarnoja et al. 2018, v2) in JAX + optax, for the offline-RL behaviour policies.

Hand-written because the well-kept JAX SAC (sbx) sits on stable-baselines3, which needs torch, and torch stays
out of this project's extras. This is the textbook algorithm and nothing more: twin Q networks with Polyak
target copies, a tanh-squashed Gaussian actor, and an entropy temperature tuned towards `-|A|`.

Everything is a pure function on a `SACState` pytree; `update_many` runs K gradient steps in one jitted
`lax.scan` (the SpinningUp "update every 50 steps, 50 updates" schedule), so Python dispatch costs nothing.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
_LOG2 = math.log(2.0)


class SACConfig(NamedTuple):
  """Hyper-parameters (SAC v2 defaults, except the smaller actor that keeps committed weights small)."""

  actor_hidden: tuple[int, ...] = (128, 128)
  critic_hidden: tuple[int, ...] = (256, 256)
  lr: float = 3e-4
  gamma: float = 0.99
  tau: float = 0.005
  init_alpha: float = 1.0
  batch_size: int = 256


class Actor(nn.Module):
  """MLP -> (mean, log_std) of the pre-tanh Gaussian; one head of width 2|A|."""

  act_dim: int
  hidden: tuple[int, ...]

  @nn.compact
  def __call__(self, obs):  # obs [..., O] -> mean, log_std [..., A]
    x = obs
    for h in self.hidden:
      x = nn.relu(nn.Dense(h)(x))
    out = nn.Dense(2 * self.act_dim)(x)
    mean, log_std = jnp.split(out, 2, axis=-1)
    return mean, jnp.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)


class QNet(nn.Module):
  """One Q(s, a) MLP."""

  hidden: tuple[int, ...]

  @nn.compact
  def __call__(self, obs, act):  # [B, O], [B, A] -> [B]
    x = jnp.concatenate([obs, act], axis=-1)
    for h in self.hidden:
      x = nn.relu(nn.Dense(h)(x))
    return nn.Dense(1)(x)[..., 0]


class TwinQ(nn.Module):
  """Two independent Q networks evaluated as one batched matmul (vmap over stacked parameters)."""

  hidden: tuple[int, ...]

  @nn.compact
  def __call__(self, obs, act):  # -> [2, B]
    vq = nn.vmap(QNet, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=None, out_axes=0, axis_size=2)
    return vq(self.hidden)(obs, act)


def tanh_gaussian_log_prob(u, mean, log_std):
  """log pi(tanh(u)) for u ~ N(mean, exp(log_std)), summed over the action axis.

  The Jacobian term log(1 - tanh(u)^2) is written as 2 (log 2 - u - softplus(-2u)), which stays finite where
  tanh(u) rounds to +-1 in float32.
  """
  z = (u - mean) * jnp.exp(-log_std)
  gauss = -0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)
  jac = 2.0 * (_LOG2 - u - jax.nn.softplus(-2.0 * u))
  return jnp.sum(gauss - jac, axis=-1)


def sample_action(mean, log_std, key):
  """Reparameterised sample a = tanh(mean + std * eps) and its log-probability."""
  u = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)
  return jnp.tanh(u), tanh_gaussian_log_prob(u, mean, log_std)


class SACState(NamedTuple):
  actor: Any
  critic: Any
  target_critic: Any
  log_alpha: jax.Array
  actor_opt: Any
  critic_opt: Any
  alpha_opt: Any
  key: jax.Array
  step: jax.Array


class SAC(NamedTuple):
  """The modules and optimiser for one environment's shapes; methods are pure and jit-able."""

  obs_dim: int
  act_dim: int
  cfg: SACConfig

  @property
  def actor_net(self):
    return Actor(self.act_dim, tuple(self.cfg.actor_hidden))

  @property
  def critic_net(self):
    return TwinQ(tuple(self.cfg.critic_hidden))

  @property
  def opt(self):
    return optax.adam(self.cfg.lr)

  def init(self, key) -> SACState:
    k_actor, k_critic, key = jax.random.split(key, 3)
    obs = jnp.zeros((1, self.obs_dim), jnp.float32)
    act = jnp.zeros((1, self.act_dim), jnp.float32)
    actor = self.actor_net.init(k_actor, obs)["params"]
    critic = self.critic_net.init(k_critic, obs, act)["params"]
    log_alpha = jnp.asarray(math.log(self.cfg.init_alpha), jnp.float32)
    return SACState(
      actor=actor,
      critic=critic,
      target_critic=critic,
      log_alpha=log_alpha,
      actor_opt=self.opt.init(actor),
      critic_opt=self.opt.init(critic),
      alpha_opt=self.opt.init(log_alpha),
      key=key,
      step=jnp.zeros((), jnp.int32),
    )

  def update(self, state: SACState, batch: dict) -> tuple[SACState, dict]:
    """One SAC step on a batch {obs [B,O], act [B,A], rew [B], done [B] (terminal, not timeout), next_obs [B,O]}."""
    cfg = self.cfg
    key, k_next, k_pi = jax.random.split(state.key, 3)
    alpha = jnp.exp(state.log_alpha)

    # Critic: soft Bellman target from the target twins (min), bootstrapped unless the state was terminal.
    mean_n, log_std_n = self.actor_net.apply({"params": state.actor}, batch["next_obs"])
    a_next, logp_next = sample_action(mean_n, log_std_n, k_next)
    q_next = self.critic_net.apply({"params": state.target_critic}, batch["next_obs"], a_next).min(axis=0)
    target = batch["rew"] + cfg.gamma * (1.0 - batch["done"]) * (q_next - alpha * logp_next)
    target = jax.lax.stop_gradient(target)

    def critic_loss(params):
      q = self.critic_net.apply({"params": params}, batch["obs"], batch["act"])  # [2, B]
      return 0.5 * jnp.mean(jnp.sum((q - target[None]) ** 2, axis=0)), q.mean()

    (c_loss, q_mean), c_grads = jax.value_and_grad(critic_loss, has_aux=True)(state.critic)
    c_updates, critic_opt = self.opt.update(c_grads, state.critic_opt, state.critic)
    critic = optax.apply_updates(state.critic, c_updates)

    # Actor: minimise alpha log pi - min Q under the freshly updated critic.
    def actor_loss(params):
      mean, log_std = self.actor_net.apply({"params": params}, batch["obs"])
      a, logp = sample_action(mean, log_std, k_pi)
      q = self.critic_net.apply({"params": critic}, batch["obs"], a).min(axis=0)
      return jnp.mean(alpha * logp - q), logp

    (a_loss, logp), a_grads = jax.value_and_grad(actor_loss, has_aux=True)(state.actor)
    a_updates, actor_opt = self.opt.update(a_grads, state.actor_opt, state.actor)
    actor = optax.apply_updates(state.actor, a_updates)

    # Temperature: drive the policy entropy towards -|A|.
    entropy_gap = jax.lax.stop_gradient(-logp - (-self.act_dim))

    def alpha_loss(log_alpha):
      return jnp.mean(log_alpha * entropy_gap)

    al_loss, al_grad = jax.value_and_grad(alpha_loss)(state.log_alpha)
    al_updates, alpha_opt = self.opt.update(al_grad, state.alpha_opt, state.log_alpha)
    log_alpha = optax.apply_updates(state.log_alpha, al_updates)

    target_critic = optax.incremental_update(critic, state.target_critic, cfg.tau)
    new = SACState(actor, critic, target_critic, log_alpha, actor_opt, critic_opt, alpha_opt, key, state.step + 1)
    metrics = {
      "critic_loss": c_loss,
      "actor_loss": a_loss,
      "alpha_loss": al_loss,
      "alpha": alpha,
      "q_mean": q_mean,
      "entropy": -logp.mean(),
    }
    return new, metrics

  def update_many(self, state: SACState, batches: dict) -> tuple[SACState, dict]:
    """K updates over stacked batches (leading axis K); returns the metrics of the last one."""
    state, metrics = jax.lax.scan(self.update, state, batches)
    return state, jax.tree.map(lambda m: m[-1], metrics)
