"""Offline-RL datasets as lists of trajectories, from three sources behind one function (`load_trajectories`).

Sources (`source`)::

  "embedded": the D4RL-style datasets regenerated here in the MuJoCo -v4 envs from the committed behaviour
    policies (`primal_jax.tasks.offline_rl.datasets`), cached under the user's cache directory with checksums;
  "d4rl": a D4RL HDF5 file (`observations`, `actions`, `rewards`, `terminals`, `timeouts` at the file root,
    as in `hopper-medium-v2.hdf5`), given as a path or found as `<data_dir>/<env>-<level>-v2.hdf5`;
  "minari": a local Minari dataset by id (e.g. `mujoco/hopper/medium-v0`), through the `minari` package.

Trajectories are split as the Decision Transformer's D4RL script splits them: after every step that is a
terminal or a timeout. A trailing run of steps with neither (a dataset cut mid-episode) is kept as the last
trajectory, as that script keeps it.

Data the run cannot use is a `ConfigError` naming the setting and the file or id, raised when the data is read
(not at the first rollout): a file that is not D4RL HDF5, missing keys, NaN values, and observations or actions
whose size is not the env's (`check_env_dims`: a HalfCheetah file with env=hopper).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np

from primal_jax.errors import ConfigError, MissingFileError
from primal_jax.validation import check_choice

SOURCES = ("embedded", "d4rl", "minari")
D4RL_KEYS = ("observations", "actions", "rewards", "terminals", "timeouts")


@dataclasses.dataclass(frozen=True)
class Trajectory:
  """One episode: observations [T, state_dim], actions [T, act_dim], rewards [T] float32, terminals [T] bool."""

  observations: np.ndarray
  actions: np.ndarray
  rewards: np.ndarray
  terminals: np.ndarray

  def __len__(self) -> int:
    return int(self.rewards.shape[0])

  @property
  def total_return(self) -> float:
    return float(np.sum(self.rewards, dtype=np.float64))


def check_arrays(arrays: dict, where: str) -> dict:
  """The D4RL arrays of `arrays`, checked for keys, lengths, dtypes and finiteness (ValueError naming `where`)."""
  missing = [k for k in D4RL_KEYS if k not in arrays]
  if missing:
    raise ConfigError(f"{where}: a D4RL dataset needs {list(D4RL_KEYS)}; missing {missing}")
  out = {k: np.asarray(arrays[k]) for k in D4RL_KEYS}
  n = out["rewards"].shape[0]
  if n == 0:
    raise ConfigError(f"{where}: the dataset has no transitions")
  for k, v in out.items():
    if v.shape[0] != n:
      raise ConfigError(f"{where}: {k} has {v.shape[0]} rows, rewards has {n}")
  if out["observations"].ndim != 2 or out["actions"].ndim != 2:
    raise ConfigError(f"{where}: observations and actions must be 2-D [N, dim]")
  for k in ("observations", "actions", "rewards"):
    out[k] = out[k].astype(np.float32)
    if not np.isfinite(out[k]).all():
      raise ConfigError(f"{where}: {k} has NaN or infinite values")
  out["terminals"], out["timeouts"] = out["terminals"].astype(bool), out["timeouts"].astype(bool)
  return out


def split_trajectories(arrays: dict, where: str = "dataset") -> list[Trajectory]:
  """Flat D4RL arrays -> trajectories, cut after every terminal or timeout (module doc)."""
  data = check_arrays(arrays, where)
  ends = np.flatnonzero(data["terminals"] | data["timeouts"]) + 1
  n = data["rewards"].shape[0]
  bounds = np.concatenate([[0], ends, [n] if (ends.size == 0 or ends[-1] != n) else []]).astype(np.int64)
  return [
    Trajectory(data["observations"][a:b], data["actions"][a:b], data["rewards"][a:b], data["terminals"][a:b])
    for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    if b > a
  ]


def read_d4rl_hdf5(path: str | Path) -> dict:
  """The D4RL arrays of one HDF5 file (extra datasets such as `infos/*` or `next_observations` are ignored)."""
  import h5py

  path = Path(path).expanduser()
  if not path.is_file():
    raise MissingFileError(f"data.path: no D4RL HDF5 file at {path}")
  try:
    with h5py.File(path, "r") as f:
      return {k: np.asarray(f[k][()]) for k in D4RL_KEYS if k in f}
  except (OSError, TypeError, ValueError, KeyError) as err:  # not HDF5, truncated, a group where a dataset belongs
    reason = (str(err).splitlines() or [type(err).__name__])[0]
    raise ConfigError(
      f"data.path: {path} is not a readable D4RL HDF5 file ({reason}); it needs the datasets {list(D4RL_KEYS)} "
      "at its root"
    ) from err


@functools.lru_cache(maxsize=8)
def env_dims(env: str) -> tuple[int, int]:
  """(observation size, action size) of the MuJoCo env the rollouts of `env` run in."""
  from primal_jax.tasks.offline_rl import policy as pol

  made = pol.make_env(env)
  try:
    return int(made.observation_space.shape[0]), int(made.action_space.shape[0])
  finally:
    made.close()


def check_env_dims(trajectories: list[Trajectory], env: str, where: str) -> list[Trajectory]:
  """`trajectories`, after a ConfigError naming `where` and both sizes unless their observation and action sizes
  are those of `env`'s MuJoCo env (data of another env would train, then crash in the first rollout)."""
  from primal_jax.tasks.offline_rl import policy as pol

  state_dim, act_dim = env_dims(env)
  got = {(t.observations.shape[1], t.actions.shape[1]) for t in trajectories}
  if got != {(state_dim, act_dim)}:
    sizes = " or ".join(f"observations have {o} features and actions {a}" for o, a in sorted(got))
    raise ConfigError(
      f"{where}: {sizes}; env={env!r} ({pol.ENV_IDS[env]}) has {state_dim} and {act_dim}: data of another env? "
      "Set data.env to the data's env"
    )
  return trajectories


def d4rl_path(env: str, level: str, path: str | None = None, data_dir: str | None = None) -> Path:
  """`path` if given, else `<data_dir>/<env>-<level>-v2.hdf5` (D4RL's file names)."""
  if path:
    return Path(path).expanduser()
  if not data_dir:
    raise ConfigError("source='d4rl' needs data.path (an .hdf5 file) or data.data_dir (holding <env>-<level>-v2.hdf5)")
  return Path(data_dir).expanduser() / f"{env}-{level}-v2.hdf5"


def minari_trajectories(dataset_id: str) -> list[Trajectory]:
  """Episodes of a local Minari dataset (observations drop the final next-observation Minari stores)."""
  import minari

  try:
    dataset = minari.load_dataset(dataset_id)
  except FileNotFoundError as err:
    raise MissingFileError(
      f"data.minari_id: no local Minari dataset {dataset_id!r} ({str(err).splitlines()[0]}); create or download "
      "it first (minari download ID), or set MINARI_DATASETS_PATH to the directory that holds it"
    ) from err
  out = []
  for ep in dataset.iterate_episodes():
    obs = np.asarray(ep.observations, np.float32)
    if obs.ndim != 2:
      raise ValueError(f"minari dataset {dataset_id!r}: observations must be flat arrays, got shape {obs.shape}")
    rewards = np.asarray(ep.rewards, np.float32)
    steps = rewards.shape[0]
    out.append(Trajectory(obs[:steps], np.asarray(ep.actions, np.float32), rewards, np.asarray(ep.terminations, bool)))
  if not out:
    raise ValueError(f"minari dataset {dataset_id!r} has no episodes")
  return out


def load_trajectories(
  source: str, *, env: str, level: str, path=None, data_dir=None, minari_id=None, size=None, seed: int = 0
) -> list[Trajectory]:
  """The trajectories of one dataset from `source` (module doc); `size`/`seed` apply to "embedded"."""
  check_choice(source, SOURCES, "data.source")
  if source == "embedded":
    from primal_jax.tasks.offline_rl import datasets

    if size is not None and (isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 0):
      raise ConfigError(
        f"data.size must be an integer >= 1 (transitions per level; 0: the default {datasets.DEFAULT_SIZE}), "
        f"got {size!r}"
      )
    arrays, _ = datasets.load(env, level, size=size or datasets.DEFAULT_SIZE, seed=seed)
    return split_trajectories(arrays, f"embedded {env}-{level}")
  if source == "d4rl":
    file = d4rl_path(env, level, path, data_dir)
    where = f"data.path {file}" if path else f"data.data_dir {file}"
    return check_env_dims(split_trajectories(read_d4rl_hdf5(file), where), env, where)
  if not minari_id:
    raise ConfigError("source='minari' needs data.minari_id, e.g. 'mujoco/hopper/medium-v0'")
  return check_env_dims(minari_trajectories(minari_id), env, f"data.minari_id {minari_id!r}")
