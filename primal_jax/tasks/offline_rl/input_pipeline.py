"""Trajectory segments of length K as the Decision Transformer samples them, and the offline-RL input pipeline.

`sample_segments` is the DT code's `get_batch` (gym/experiment.py), vectorised and seeded:
  * a trajectory is drawn with probability proportional to its length, a start step uniformly in it;
  * the segment holds up to K steps from there; returns-to-go are the undiscounted sums of the rewards from
    each step to the trajectory's end, divided by `reward_scale`; timesteps are clipped to `max_ep_len - 1`;
  * a segment shorter than K is padded to K: states with raw zeros (then normalised, as the DT code
    normalises after padding), actions with -10, returns-to-go and timesteps with 0, mask 0.
    `padding="left"` pads before the segment (the DT code); "right" pads after it (the convention of the
    data module the Primal-Attention release's experiment imports). With causal layers right padding
    cannot reach real outputs, whatever the Primal layer's masking mode.

`OfflineRLPipeline` draws every global batch from a generator seeded by (seed, epoch, batch index), so a
resumed run gets the same batches as an uninterrupted one, and every host draws the same global batch and
keeps its own rows. An "epoch" is `steps_per_epoch` batches (the DT code's `num_steps_per_iter`).
Evaluation is by rollouts in the environment (`evaluate_split`, see `rollouts`), not by eval batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from primal_jax.data.checks import check_positive_int
from primal_jax.data.core import DatasetInfo, SplitEvaluator
from primal_jax.data.pipeline import local_batch_size
from primal_jax.errors import ConfigError
from primal_jax.tasks.offline_rl import rollouts
from primal_jax.tasks.offline_rl.trajectories import Trajectory, load_trajectories
from primal_jax.validation import check_choice

PADDINGS = ("left", "right")
ACTION_PAD = -10.0  # the DT code's padded action value
EVAL_SPLITS = ("validation", "test")


@dataclasses.dataclass(frozen=True)
class RLDatasetInfo(DatasetInfo):
  """DatasetInfo of an offline-RL dataset: `seq_len` is the context K; split sizes count transitions
  (train) and evaluation episodes (validation, test)."""

  state_dim: int = 0
  act_dim: int = 0
  env: str = ""
  max_ep_len: int = 1000


def state_statistics(trajectories: Sequence[Trajectory]) -> tuple[np.ndarray, np.ndarray]:
  """Mean and std (+1e-6, as the DT code) of every observation of the dataset, float32 [state_dim]."""
  states = np.concatenate([t.observations for t in trajectories]).astype(np.float64)
  return states.mean(0).astype(np.float32), (states.std(0) + 1e-6).astype(np.float32)


class SegmentSampler:
  """The dataset flattened once, so that a batch of segments is a few gathers (no per-segment Python loop)."""

  def __init__(self, trajectories: Sequence[Trajectory], *, context: int, reward_scale: float, max_ep_len: int):
    if not trajectories:
      raise ValueError("trajectories must not be empty")
    check_positive_int(context, "context")
    if not reward_scale > 0:
      raise ValueError(f"reward_scale must be > 0, got {reward_scale}")
    self.context, self.reward_scale, self.max_ep_len = context, float(reward_scale), max_ep_len
    self.lengths = np.array([len(t) for t in trajectories], np.int64)  # [n_traj]
    self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]])  # [n_traj] offset of each trajectory
    self.observations = np.concatenate([t.observations for t in trajectories])  # [N, state_dim]
    self.actions = np.concatenate([t.actions for t in trajectories])  # [N, act_dim]
    # Returns-to-go: reverse cumulative sums within each trajectory (float64, then float32).
    rtg = [np.cumsum(t.rewards[::-1].astype(np.float64))[::-1] for t in trajectories]
    self.returns_to_go = np.concatenate(rtg).astype(np.float32)  # [N]
    self.step_in_traj = np.concatenate([np.arange(n) for n in self.lengths])  # [N]
    self.probs = self.lengths / self.lengths.sum()

  def sample(
    self, rng: np.random.Generator, batch: int, state_mean: np.ndarray, state_std: np.ndarray, padding: str = "left"
  ) -> dict[str, np.ndarray]:
    """A batch of `batch` segments: states, actions, returns_to_go, timesteps, mask and the targets/weight."""
    check_choice(padding, PADDINGS, "padding")
    k = self.context
    traj = rng.choice(len(self.lengths), size=batch, p=self.probs)  # [b]
    start = (rng.random(batch) * self.lengths[traj]).astype(np.int64)  # [b] uniform in [0, length)
    valid = np.minimum(k, self.lengths[traj] - start)  # [b] real steps per segment
    offs = np.arange(k)[None, :]  # [1, K]
    if padding == "left":
      real = offs >= (k - valid)[:, None]  # [b, K]
      pos = offs - (k - valid)[:, None]
    else:
      real = offs < valid[:, None]
      pos = offs
    rows = np.where(real, self.starts[traj][:, None] + start[:, None] + pos, 0)  # [b, K] flat row indices
    obs = np.where(real[..., None], self.observations[rows], 0.0)
    states = ((obs - state_mean) / state_std).astype(np.float32)  # padded raw zeros normalised, as the DT code
    actions = np.where(real[..., None], self.actions[rows], ACTION_PAD).astype(np.float32)
    rtg = np.where(real, self.returns_to_go[rows] / self.reward_scale, 0.0).astype(np.float32)[..., None]
    timesteps = np.where(real, np.minimum(self.step_in_traj[rows], self.max_ep_len - 1), 0).astype(np.int32)
    mask = real.astype(np.int32)
    return {
      "states": states,  # [b, K, state_dim]
      "actions": actions,  # [b, K, act_dim]
      "returns_to_go": rtg,  # [b, K, 1]
      "timesteps": timesteps,  # [b, K]
      "mask": mask,  # [b, K]
      "targets": actions,  # the action loss's targets (the inputs themselves: a_t is read from the s_t token)
      "weight": real.astype(np.float32),  # [b, K]
    }


@dataclasses.dataclass(frozen=True, eq=False)
class OfflineRLPipeline:
  """Sampled training segments and rollout evaluation of one offline-RL dataset (module doc)."""

  info: RLDatasetInfo
  sampler: SegmentSampler
  state_mean: np.ndarray
  state_std: np.ndarray
  batch_size: int
  seed: int
  steps_per_epoch: int
  padding: str = "left"
  target_returns: tuple[float, ...] = ()
  eval_episodes: int = 10
  test_episodes: int = 10
  process_index: int = 0
  process_count: int = 1

  def __post_init__(self) -> None:
    local_batch_size(self.batch_size, self.process_count)
    check_positive_int(self.steps_per_epoch, "steps_per_epoch")
    check_choice(self.padding, PADDINGS, "padding")
    if not self.target_returns:
      raise ValueError("target_returns must name at least one return to condition the rollouts on")

  def train_batches(self, epoch: int, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """The `steps_per_epoch` local batches of epoch `epoch`, from batch `start` on."""
    if isinstance(start, bool) or not 0 <= int(start) <= self.steps_per_epoch:
      raise ValueError(f"start must be an integer in [0, steps_per_epoch={self.steps_per_epoch}], got {start!r}")
    local = local_batch_size(self.batch_size, self.process_count)
    rows = slice(self.process_index * local, (self.process_index + 1) * local)
    for i in range(int(start), self.steps_per_epoch):
      rng = np.random.default_rng([self.seed, epoch, i])
      batch = self.sampler.sample(rng, self.batch_size, self.state_mean, self.state_std, self.padding)
      yield {k: v[rows] for k, v in batch.items()}

  def eval_batches(self, split: str):
    raise ValueError(f"split {split!r}: an offline-RL run is evaluated by rollouts (evaluate_split), not by batches")

  def episodes(self, split: str) -> int:
    check_choice(split, EVAL_SPLITS, "split")
    return self.eval_episodes if split == "validation" else self.test_episodes

  @property
  def evaluate_split(self) -> SplitEvaluator:
    """How the train loop evaluates a split (`InputPipeline.evaluate_split`): by rollouts."""
    return self.rollout_metrics

  def rollout_metrics(self, apply_fn, params, split: str) -> dict[str, float]:
    """Rollout metrics of `split`: its own environment seeds (validation and test never share one)."""
    episodes = self.episodes(split)
    seed = int(np.random.SeedSequence([self.seed, EVAL_SPLITS.index(split) + 1]).generate_state(1)[0] >> 1)
    metrics = {}
    for i, target in enumerate(self.target_returns):
      result = rollouts.evaluate(
        apply_fn, params, self.info.env, episodes=episodes, seed=seed, target_return=target,
        reward_scale=self.sampler.reward_scale, state_mean=self.state_mean, state_std=self.state_std,
        context=self.info.seq_len, act_dim=self.info.act_dim, max_ep_len=self.info.max_ep_len,
      )  # fmt: skip
      suffix = "" if i == 0 else f"@{target:g}"
      metrics.update({f"{k}{suffix}": v for k, v in result.items()})
    metrics["count"] = float(episodes)
    return metrics


def default_targets(source: str, env: str, trajectories: Sequence[Trajectory]) -> tuple[float, ...]:
  """The returns rollouts are conditioned on when the config names none.

  D4RL and Minari data: the DT code's targets (`rollouts.TARGET_RETURNS`), set for D4RL's returns. The
  embedded datasets' returns are several times lower (their expert policies are weaker than D4RL's), and
  a target far above every return in the data is out of distribution (measured: hopper-medium, 400 steps,
  target 3600 -> score 7, 1800 -> 44). So: the best trajectory return of the dataset, rounded up to 100.
  """
  if source != "embedded":
    return rollouts.TARGET_RETURNS[env]
  best = max(t.total_return for t in trajectories)
  return (float(np.ceil(best / 100.0) * 100.0),)


def check_target_returns(targets) -> None:
  """ConfigError unless `targets` are finite numbers (a NaN target would train, then fail in every rollout)."""
  try:
    ok = all(np.isfinite(float(t)) for t in targets)
  except (TypeError, ValueError):
    ok = False
  if not ok:
    raise ConfigError(
      f"data.target_returns must be finite numbers (the returns rollouts are conditioned on; () for the "
      f"default), got {tuple(targets)!r}"
    )


def make_offline_rl_pipeline(data_config, *, process_index: int = 0, process_count: int = 1) -> OfflineRLPipeline:
  """The `d4rl` task: `data_config` names env, dataset level, source (`trajectories`) and sampling options."""
  cfg = data_config
  env = cfg.env
  check_choice(env, tuple(rollouts.TARGET_RETURNS), "data.env")
  check_target_returns(cfg.get("target_returns") or ())
  source = cfg.get("source", "embedded")
  trajectories = load_trajectories(
    source, env=env, level=cfg.dataset, path=cfg.get("path") or None,
    data_dir=cfg.get("data_dir") or None, minari_id=cfg.get("minari_id") or None,
    size=cfg.get("size") or None, seed=cfg.get("dataset_seed", 0),
  )  # fmt: skip
  max_ep_len = cfg.get("max_ep_len", 1000)
  context = cfg.get("context", 20)
  sampler = SegmentSampler(trajectories, context=context, reward_scale=cfg.get("reward_scale", 1000.0),
                           max_ep_len=max_ep_len)  # fmt: skip
  mean, std = state_statistics(trajectories)
  transitions = int(sampler.lengths.sum())
  eval_episodes, test_episodes = cfg.get("eval_episodes", 10), cfg.get("test_episodes", 10)
  info = RLDatasetInfo(
    name=f"{env}-{cfg.dataset}", num_classes=0, num_features=mean.shape[0], seq_len=context,
    max_length=int(sampler.lengths.max()), split_sizes={"train": transitions, "validation": eval_episodes,
    "test": test_episodes}, class_names=(), state_dim=mean.shape[0], act_dim=sampler.actions.shape[1], env=env,
    max_ep_len=max_ep_len,
  )  # fmt: skip
  targets = tuple(cfg.get("target_returns") or default_targets(source, env, trajectories))
  return OfflineRLPipeline(
    info, sampler, mean, std, batch_size=cfg.batch_size, seed=cfg.get("seed", 0),
    steps_per_epoch=cfg.get("steps_per_epoch", 1000), padding=cfg.get("padding", "left"),
    target_returns=tuple(float(t) for t in targets), eval_episodes=eval_episodes, test_episodes=test_episodes,
    process_index=process_index, process_count=process_count,
  )  # fmt: skip
