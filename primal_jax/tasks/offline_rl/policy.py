"""Committed behaviour policies: NumPy actors stored as small `.npz` files, plus the D4RL score conventions.

The actor is run in NumPy (float64) rather than JAX so that dataset generation needs no jit, starts instantly,
and is bit-reproducible for a given seed. Actions are cast to float32 *before* they are sent to the environment,
so the stored `actions` are exactly the ones executed.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np

# gymnasium ids (the -v4 MuJoCo environments, closest to D4RL's -v2 dynamics) and D4RL infos.py reference returns.
ENV_IDS = {"hopper": "Hopper-v4", "halfcheetah": "HalfCheetah-v4", "walker2d": "Walker2d-v4"}
REF_MIN_SCORE = {"halfcheetah": -280.178953, "hopper": -20.272305, "walker2d": 1.629008}
REF_MAX_SCORE = {"halfcheetah": 12135.0, "hopper": 3234.3, "walker2d": 4592.3}
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


def normalized_score(env_name: str, ret) -> np.ndarray | float:
  """D4RL normalised score 100 (R - random) / (expert - random)."""
  lo, hi = REF_MIN_SCORE[env_name], REF_MAX_SCORE[env_name]
  return 100.0 * (np.asarray(ret, np.float64) - lo) / (hi - lo)


def make_env(env_name: str):
  """The gymnasium MuJoCo env (1000-step TimeLimit); imported lazily so the library imports without MuJoCo."""
  import warnings

  import gymnasium as gym

  with warnings.catch_warnings():  # "-v4 is out of date": kept on purpose, closest to D4RL's dynamics
    warnings.filterwarnings("ignore", message=".*is out of date.*")
    return gym.make(ENV_IDS[env_name])


def actor_params_to_arrays(params) -> dict[str, np.ndarray]:
  """Flax `Actor` params {Dense_i: {kernel, bias}} -> {w0, b0, w1, b1, ...} float32 NumPy arrays."""
  out = {}
  n = len(params)
  for i in range(n):
    layer = params[f"Dense_{i}"]
    out[f"w{i}"] = np.asarray(layer["kernel"], np.float32)
    out[f"b{i}"] = np.asarray(layer["bias"], np.float32)
  return out


class NumpyPolicy:
  """A tanh-Gaussian MLP actor (ReLU hidden layers, last layer -> [mean | log_std])."""

  def __init__(self, arrays: dict[str, np.ndarray], meta: dict | None = None):
    n = len([k for k in arrays if k.startswith("w")])
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    self.weights = [(f64(arrays[f"w{i}"]), f64(arrays[f"b{i}"])) for i in range(n)]
    self.meta = dict(meta or {})
    self.obs_dim = self.weights[0][0].shape[0]
    self.act_dim = self.weights[-1][0].shape[1] // 2

  def dist(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """obs [..., O] -> mean, log_std [..., A] of the pre-tanh Gaussian."""
    x = np.asarray(obs, np.float64)
    for w, b in self.weights[:-1]:
      x = np.maximum(x @ w + b, 0.0)
    w, b = self.weights[-1]
    out = x @ w + b
    mean, log_std = out[..., : self.act_dim], out[..., self.act_dim :]
    return mean, np.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)

  def act(self, obs: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
    """float32 action: tanh(mean) when `rng` is None, else a sample tanh(mean + std * eps)."""
    mean, log_std = self.dist(obs)
    u = mean if rng is None else mean + np.exp(log_std) * rng.standard_normal(mean.shape)
    return np.tanh(u).astype(np.float32)


def save_policy(path, arrays: dict[str, np.ndarray], meta: dict) -> Path:
  """Write the actor arrays and a JSON metadata string into one `.npz` with fixed zip timestamps.

  `np.savez` stamps each member with the current time; fixed stamps make the same weights the same bytes, so a
  re-export leaves committed files (and the datasets cached under their sha256) unchanged.
  """
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(".tmp.npz")
  members = {**arrays, "meta": np.asarray(json.dumps(meta, sort_keys=True))}
  with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zf:
    for name in sorted(members):
      buf = io.BytesIO()
      np.lib.format.write_array(buf, np.asarray(members[name]), allow_pickle=False)
      zf.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buf.getvalue())
  tmp.replace(path)
  return path


def load_policy(path) -> NumpyPolicy:
  with np.load(path) as z:
    arrays = {k: z[k] for k in z.files if k != "meta"}
    meta = json.loads(str(z["meta"])) if "meta" in z.files else {}
  return NumpyPolicy(arrays, meta)


def evaluate(policy, env_name: str, episodes: int, seed: int, stochastic: bool = False, env=None) -> list[float]:
  """Undiscounted returns of `episodes` full episodes; env seeds seed, seed+1, ...; sampling rng from `seed`."""
  env = env or make_env(env_name)
  rng = np.random.default_rng(seed) if stochastic else None
  returns = []
  for ep in range(episodes):
    obs, _ = env.reset(seed=seed + ep)
    total, done = 0.0, False
    while not done:
      obs, rew, term, trunc, _ = env.step(policy.act(obs, rng))
      total += float(rew)
      done = term or trunc
    returns.append(total)
  return returns
