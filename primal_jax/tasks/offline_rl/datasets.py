"""Embedded D4RL-style MuJoCo datasets, regenerated deterministically from the committed behaviour policies.

D4RL's datasets cannot be downloaded on an offline machine, so `medium`, `medium-replay`, `expert` and
`medium-expert` are rebuilt here by rolling out SAC actors trained in the same (-v4) MuJoCo environments
(`experiments/train_behaviour.py`; weights shipped with the package in `primal_jax/tasks/offline_rl/policies/<env>/`):

- `medium`: the `medium.npz` actor; `expert`: the `expert.npz` actor;
- `medium-replay`: the `replay_<step>.npz` actors along the medium policy's training run, in order, an equal
  share of the transitions each (D4RL uses that run's replay buffer; snapshots stand in for it);
- `medium-expert`: `medium` followed by `expert`, the same bytes as the two separate datasets.

Behaviour noise: as D4RL's SAC datasets, actions are *sampled* from the tanh-Gaussian (not its mean). Arrays use
D4RL's layout and dtypes: `observations`, `actions`, `next_observations`, `rewards` (float32), `terminals`,
`timeouts` (bool). Episodes end at a terminal or at the 1000-step limit (`timeouts`); the last, cut episode of a
dataset is marked as a timeout. Same seed and policies -> identical bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from primal_jax.data.cache import default_cache_dir, sha256_file
from primal_jax.errors import ConfigError, MissingFileError
from primal_jax.tasks.offline_rl import policy as pol

POLICY_ROOT = Path(__file__).resolve().parent / "policies"  # package data (setup.cfg), in the wheel too
LEVELS = ("medium", "medium-replay", "expert", "medium-expert")
KEYS = ("observations", "actions", "next_observations", "rewards", "terminals", "timeouts")
DEFAULT_SIZE = 100_000  # transitions per level (medium-expert: twice); D4RL has 1M (replay: 0.2-0.4M)
FORMAT_VERSION = 1
MAX_EPISODE_STEPS = 1000  # the -v4 envs' TimeLimit


def _seed(*parts: int) -> int:
  """A 32-bit seed from integer parts (env reset seeds must be plain ints)."""
  return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])


def rollout(policy: pol.NumpyPolicy, env_name: str, n: int, seed: int, stochastic: bool = True) -> dict:
  """`n` transitions of `policy` in a fresh env: the first reset seeded by `seed`, later ones by the env's RNG."""
  env = pol.make_env(env_name)
  rng = np.random.default_rng(seed) if stochastic else None
  obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
  out = {
    "observations": np.zeros((n, obs_dim), np.float32),
    "actions": np.zeros((n, act_dim), np.float32),
    "next_observations": np.zeros((n, obs_dim), np.float32),
    "rewards": np.zeros((n,), np.float32),
    "terminals": np.zeros((n,), bool),
    "timeouts": np.zeros((n,), bool),
  }
  obs, _ = env.reset(seed=seed)
  for i in range(n):
    act = policy.act(obs, rng)
    nxt, rew, term, trunc, _ = env.step(act)
    out["observations"][i], out["actions"][i], out["next_observations"][i] = obs, act, nxt
    out["rewards"][i], out["terminals"][i], out["timeouts"][i] = rew, term, trunc and not term
    obs = env.reset()[0] if (term or trunc) else nxt
  if n and not out["terminals"][-1]:
    out["timeouts"][-1] = True
  env.close()
  return out


def concat(parts: list[dict]) -> dict:
  return {k: np.concatenate([p[k] for p in parts]) for k in KEYS}


def episodes(data: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Per episode (split after every terminal or timeout): return, length, and whether it is complete.

  Complete = ended in a terminal or ran the 1000-step limit; the episode cut at the end of a rollout is not.
  """
  ends = np.flatnonzero(data["terminals"] | data["timeouts"])
  sums = np.cumsum(data["rewards"], dtype=np.float64)[ends]
  returns = np.diff(np.concatenate([[0.0], sums]))
  lengths = np.diff(np.concatenate([[-1], ends]))
  complete = data["terminals"][ends] | (lengths == MAX_EPISODE_STEPS)
  return returns, lengths, complete


def policy_files(env_name: str, level: str, policy_dir: str | Path | None = None) -> list[Path]:
  """The committed actor files that generate `level`, in order."""
  root = Path(policy_dir) if policy_dir is not None else POLICY_ROOT / env_name
  if level == "medium-replay":
    files = sorted(root.glob("replay_*.npz"))
  elif level == "medium-expert":
    files = [root / "medium.npz", root / "expert.npz"]
  else:
    files = [root / f"{level}.npz"]
  missing = [f for f in files if not f.exists()]
  if missing or not files:
    raise MissingFileError(f"no behaviour policy for {env_name}/{level}: {missing or root}")
  return files


def check_size(size: int) -> None:
  """ConfigError unless `size` is an integer >= 1 (a dataset of 0 transitions has a NaN mean return)."""
  if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 1:
    raise ConfigError(f"size must be an integer >= 1 (transitions per level), got {size!r}")


def generate(env_name: str, level: str, size: int = DEFAULT_SIZE, seed: int = 0, policy_dir=None) -> dict:
  """The dataset's arrays (`size` transitions; medium-expert 2 * size), deterministic in (policies, size, seed)."""
  check_size(size)
  if level not in LEVELS:
    raise ValueError(f"level {level!r} not in {LEVELS}")
  if level == "medium-expert":
    return concat([generate(env_name, lv, size, seed, policy_dir) for lv in ("medium", "expert")])
  files = policy_files(env_name, level, policy_dir)
  shares = [size // len(files) + (i < size % len(files)) for i in range(len(files))]
  level_id = LEVELS.index(level)
  parts = [
    rollout(pol.load_policy(f), env_name, k, _seed(seed, level_id, i))
    for i, (f, k) in enumerate(zip(files, shares, strict=True))
  ]
  return concat(parts)


def summary(env_name: str, data: dict) -> dict:
  """Transitions, episodes and the mean return / D4RL normalised score over the complete episodes."""
  returns, _, complete = episodes(data)
  rets = returns[complete] if complete.any() else returns
  return {
    "transitions": int(len(data["rewards"])),
    "episodes": int(len(returns)),
    "complete_episodes": int(complete.sum()),
    "mean_return": float(rets.mean()),
    "std_return": float(rets.std()),
    "normalized_score": float(pol.normalized_score(env_name, rets.mean())),
  }


def write_hdf5(path: Path, data: dict, attrs: dict) -> None:
  """D4RL layout: one flat dataset per key at the file root; no compression, fixed attrs -> stable bytes."""
  import h5py

  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  with h5py.File(tmp, "w", track_order=True) as f:
    for k in KEYS:
      f.create_dataset(k, data=data[k], track_times=False)
    for k, v in attrs.items():
      f.attrs[k] = json.dumps(v) if isinstance(v, dict | list) else v
  tmp.replace(path)


def read_hdf5(path: Path) -> dict:
  import h5py

  with h5py.File(path, "r") as f:
    return {k: f[k][()] for k in KEYS}


def load(env_name: str, level: str, size: int = DEFAULT_SIZE, seed: int = 0, cache_dir=None, policy_dir=None):
  """(arrays, info): the cached dataset, regenerated when missing, altered, or made by other policies.

  Cached as `<cache>/d4rl/<env>-<level>-v4-n<size>-s<seed>.hdf5` with a `.json` beside it holding the
  summary, the generating policies' sha256 and the file's sha256 (checked on every load).
  """
  check_size(size)
  root = (Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()) / "d4rl"
  stem = f"{env_name}-{level}-v4-n{size}-s{seed}"
  path, info_path = root / f"{stem}.hdf5", root / f"{stem}.json"
  files = policy_files(env_name, level, policy_dir)
  policies = {f.name: sha256_file(f) for f in files}
  if path.exists() and info_path.exists():
    info = json.loads(info_path.read_text())
    same = info.get("policies") == policies and info.get("format") == FORMAT_VERSION
    if same and info.get("sha256") == sha256_file(path):
      return read_hdf5(path), info
  if level == "medium-expert":  # from the (cached) medium and expert datasets: the same bytes, no second rollout
    data = concat([load(env_name, lv, size, seed, cache_dir, policy_dir)[0] for lv in ("medium", "expert")])
  else:
    data = generate(env_name, level, size, seed, policy_dir)
  info = {"env": env_name, "env_id": pol.ENV_IDS[env_name], "level": level, "size": size, "seed": seed}
  info.update(format=FORMAT_VERSION, policies=policies, **summary(env_name, data))
  write_hdf5(path, data, {k: v for k, v in info.items() if k != "policies"})
  info["sha256"] = sha256_file(path)
  info_path.write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
  return data, info
