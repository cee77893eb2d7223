"""Resumable SAC training of a behaviour policy in a gymnasium MuJoCo env, with actor snapshots and evaluations.

Resumption is exact: a checkpoint holds the SAC state, the replay buffer (npz) and both NumPy generators, and it
is written only at chunk boundaries (every `checkpoint_every` env steps) where the episode is cut (a timeout,
bootstrapped like D4RL's) and the env is reset with a seed derived from (seed, chunk index). So no MuJoCo
internal state has to be saved, and an interrupted run resumed from its workdir matches an uninterrupted one.

Workdir layout: `ckpt/{state.npz, buffer.npz, meta.json}`, `snapshots/actor_<step>.npz`, `log.jsonl`.
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import jax
import numpy as np

from primal_jax.tasks.offline_rl import policy as pol
from primal_jax.tasks.offline_rl.sac import SAC, SACConfig


@dataclass(frozen=True)
class TrainConfig:
  env: str = "hopper"
  seed: int = 0
  total_steps: int = 300_000
  start_steps: int = 5_000  # uniform-random actions before the actor acts
  update_after: int = 1_000  # no gradient steps before this many transitions
  update_every: int = 50  # env steps per block; then that many gradient steps in one jitted scan
  checkpoint_every: int = 10_000  # chunk length (multiple of update_every)
  snapshot_every: int = 10_000  # actor snapshot + evaluation (multiple of update_every)
  eval_episodes: int = 3
  actor_hidden: tuple[int, ...] = (128, 128)
  critic_hidden: tuple[int, ...] = (128, 128)  # half SAC's 256: ~3x more updates/s on this shared 2-core CPU
  batch_size: int = 256


def _sac(cfg: TrainConfig, obs_dim: int, act_dim: int) -> SAC:
  sac_cfg = SACConfig(actor_hidden=tuple(cfg.actor_hidden), critic_hidden=tuple(cfg.critic_hidden))
  return SAC(obs_dim, act_dim, sac_cfg._replace(batch_size=cfg.batch_size))


@functools.lru_cache(maxsize=8)
def _jitted_update(sac: SAC):
  """One compiled `update_many` per (shapes, config): trainers built again in one process (tests) reuse it."""
  return jax.jit(sac.update_many)


def _atomic_savez(path: Path, **arrays):
  tmp = path.with_name(path.name + ".tmp.npz")
  np.savez(tmp, **arrays)
  os.replace(tmp, path)


def _atomic_json(path: Path, obj):
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
  os.replace(tmp, path)


class Buffer:
  """Flat NumPy replay buffer; `done` is the terminal flag only (timeouts bootstrap)."""

  FIELDS = ("obs", "act", "rew", "done", "next_obs")

  def __init__(self, capacity: int, obs_dim: int, act_dim: int):
    shapes = {"obs": (obs_dim,), "act": (act_dim,), "rew": (), "done": (), "next_obs": (obs_dim,)}
    self.data = {k: np.zeros((capacity, *s), np.float32) for k, s in shapes.items()}
    self.size = 0

  def add(self, obs, act, rew, done, next_obs):
    i = self.size
    for k, v in zip(self.FIELDS, (obs, act, rew, done, next_obs), strict=True):
      self.data[k][i] = v
    self.size += 1

  def sample(self, rng: np.random.Generator, k: int, b: int) -> dict:
    idx = rng.integers(0, self.size, size=(k, b))  # [K, B]
    return {f: self.data[f][idx] for f in self.FIELDS}

  def state(self) -> dict:
    return {k: v[: self.size] for k, v in self.data.items()}

  def load(self, arrays):
    self.size = len(arrays["rew"])
    for k in self.FIELDS:
      self.data[k][: self.size] = arrays[k]


class Trainer:
  """Owns env, SAC state, buffer and RNGs; `run()` trains to `total_steps`, resuming from the workdir if possible."""

  def __init__(self, cfg: TrainConfig, workdir, log=print):
    assert cfg.checkpoint_every % cfg.update_every == 0 and cfg.snapshot_every % cfg.update_every == 0
    self.cfg, self.workdir, self.log = cfg, Path(workdir), log
    self.env = pol.make_env(cfg.env)
    self.eval_env = pol.make_env(cfg.env)
    self.obs_dim = self.env.observation_space.shape[0]
    self.act_dim = self.env.action_space.shape[0]
    self.sac = _sac(cfg, self.obs_dim, self.act_dim)
    self._update = _jitted_update(self.sac)
    self.state = self.sac.init(jax.random.PRNGKey(cfg.seed))
    self.buffer = Buffer(cfg.total_steps, self.obs_dim, self.act_dim)
    self.act_rng = np.random.default_rng([cfg.seed, 1])
    self.batch_rng = np.random.default_rng([cfg.seed, 2])
    self.step = 0
    self.episodes: list[float] = []  # returns of completed episodes (for logging)
    self.ckpt = self.workdir / "ckpt"
    self.restored = self._restore()

  # --- checkpoints -------------------------------------------------------------------------------------------
  def _restore(self) -> bool:
    meta_path = self.ckpt / "meta.json"
    if not meta_path.exists():
      return False
    meta = json.loads(meta_path.read_text())
    saved_cfg = {k: (tuple(v) if isinstance(v, list) else v) for k, v in meta["config"].items()}
    mine = asdict(self.cfg)
    for k in mine:  # total_steps may grow on resume; everything else must match
      if k != "total_steps" and saved_cfg.get(k) != mine[k]:
        raise ValueError(f"workdir {self.workdir} was trained with {k}={saved_cfg.get(k)!r}, not {mine[k]!r}")
    leaves, treedef = jax.tree.flatten(self.state)
    with np.load(self.ckpt / "state.npz") as z:
      loaded = [z[f"arr_{i}"] for i in range(len(leaves))]
    self.state = jax.tree.unflatten(treedef, [jax.numpy.asarray(x, dtype=x.dtype) for x in loaded])
    with np.load(self.ckpt / "buffer.npz") as z:
      self.buffer.load(z)
    self.act_rng.bit_generator.state = meta["act_rng"]
    self.batch_rng.bit_generator.state = meta["batch_rng"]
    self.step, self.episodes = meta["step"], meta["episodes"]
    self.log(f"resumed {self.workdir} at step {self.step}")
    return True

  def save(self):
    self.ckpt.mkdir(parents=True, exist_ok=True)
    leaves = jax.tree.leaves(self.state)
    _atomic_savez(self.ckpt / "state.npz", **{f"arr_{i}": np.asarray(x) for i, x in enumerate(leaves)})
    _atomic_savez(self.ckpt / "buffer.npz", **self.buffer.state())
    meta = {
      "config": asdict(self.cfg),
      "step": self.step,
      "episodes": self.episodes,
      "act_rng": self.act_rng.bit_generator.state,
      "batch_rng": self.batch_rng.bit_generator.state,
    }
    _atomic_json(self.ckpt / "meta.json", meta)  # written last: it marks the checkpoint complete

  # --- acting ------------------------------------------------------------------------------------------------
  def actor_arrays(self) -> dict[str, np.ndarray]:
    return pol.actor_params_to_arrays(self.state.actor)

  def _snapshot(self):
    arrays = self.actor_arrays()
    policy = pol.NumpyPolicy(arrays)
    seed = 10_000 + self.cfg.seed * 100
    det = pol.evaluate(policy, self.cfg.env, self.cfg.eval_episodes, seed, env=self.eval_env)
    sto = pol.evaluate(policy, self.cfg.env, self.cfg.eval_episodes, seed, stochastic=True, env=self.eval_env)
    meta = {"env": self.cfg.env, "env_id": pol.ENV_IDS[self.cfg.env], "step": self.step, "seed": self.cfg.seed}
    pol.save_policy(self.workdir / "snapshots" / f"actor_{self.step:07d}.npz", arrays, meta)
    rec = {
      "kind": "eval",
      "step": self.step,
      "return_det": float(np.mean(det)),
      "score_det": float(pol.normalized_score(self.cfg.env, np.mean(det))),
      "return_sto": float(np.mean(sto)),
      "score_sto": float(pol.normalized_score(self.cfg.env, np.mean(sto))),
      "time": time.time(),
    }
    self._write_log(rec)

  def _write_log(self, rec):
    with open(self.workdir / "log.jsonl", "a") as f:
      f.write(json.dumps(rec) + "\n")
    self.log(json.dumps(rec))

  def run_chunk(self):
    """`checkpoint_every` env steps (fewer at the end) from a freshly seeded reset, then a checkpoint."""
    cfg = self.cfg
    chunk = self.step // cfg.checkpoint_every
    obs, _ = self.env.reset(seed=cfg.seed * 1_000_003 + chunk)
    ep_ret, t0 = 0.0, time.time()
    end = min(self.step + cfg.checkpoint_every, cfg.total_steps)
    policy, metrics = pol.NumpyPolicy(self.actor_arrays()), {}
    while self.step < end:
      if self.step % cfg.snapshot_every == 0:
        self._snapshot()
      for _ in range(cfg.update_every):
        if self.step < cfg.start_steps:
          act = self.act_rng.uniform(-1.0, 1.0, self.act_dim).astype(np.float32)
        else:
          act = policy.act(obs, self.act_rng)
        nxt, rew, term, trunc, _ = self.env.step(act)
        self.buffer.add(obs, act, rew, float(term), nxt)
        ep_ret += float(rew)
        self.step += 1
        obs = nxt
        if term or trunc:
          self.episodes.append(ep_ret)
          obs, ep_ret = self.env.reset()[0], 0.0
      if self.step >= cfg.update_after:
        batches = self.buffer.sample(self.batch_rng, cfg.update_every, cfg.batch_size)
        self.state, metrics = self._update(self.state, batches)
        policy = pol.NumpyPolicy(self.actor_arrays())
    n = end - chunk * cfg.checkpoint_every
    recent = self.episodes[-10:]
    rec = {"kind": "train", "step": self.step, "steps_per_s": n / (time.time() - t0)}
    rec["train_return_last10"] = float(np.mean(recent)) if recent else None
    rec.update({k: float(v) for k, v in metrics.items()})
    self._write_log(rec)
    self.save()

  def run(self):
    self.workdir.mkdir(parents=True, exist_ok=True)
    while self.step < self.cfg.total_steps:
      self.run_chunk()
    last = self.workdir / "snapshots" / f"actor_{self.step:07d}.npz"
    if self.step % self.cfg.snapshot_every == 0 and not last.exists():
      self._snapshot()
    return self
