r"""Offline RL on D4RL-style MuJoCo datasets: Decision Transformer (DT) and Primal.+DT (paper Tables 4 and 7).

  python -m experiments.main --config=d4rl:env=hopper,dataset=medium,model=primal_dt,short \
    --workdir=/tmp/dt_hopper_medium

The release's setting (bashes/run_primal_dt.sh and the DT code's defaults): 3 layers, dim 256, 4 heads
(GPT-2 body, ReLU, n_inner 4 * dim), context K = 20, batch 64, AdamW with weight decay 1e-4, linear warm-up over
10k steps then constant, gradient clipping 0.25, dropout 0.1, reward scale 1000, 10 x 10k steps; Primal.+DT: the
last layer causal Primal-Attention with data-independent weights, eta 0.05, lr 1e-3 (DT: lr 1e-4, the DT code's).
s per dataset: the script sweeps s in {32, 64, 96}; the defaults below are Table 7's best per (env, dataset).
Rollouts are conditioned on the DT code's targets (hopper 3600 / 1800, halfcheetah 12000 / 6000, walker2d
5000 / 2500) on D4RL and Minari data, and on the dataset's best return (rounded up to 100) on the embedded data,
whose returns are far lower than D4RL's; the first target's `normalized_score` (D4RL's 100 (R - random) /
(expert - random)) is the selection metric.

Paper, Table 4 (D4RL v2 data, normalised score, 3 seeds; DT -> Primal.+DT):
  medium-expert: halfcheetah 83.8 -> 77.8, hopper 104.0 -> 111.5, walker2d 107.7 -> 108.9
  medium:        halfcheetah 42.4 -> 43.0, hopper 64.2 -> 74.5,  walker2d 70.6 -> 77.9
  medium-replay: halfcheetah 34.6 -> 38.9, hopper 79.7 -> 88.5,  walker2d 62.9 -> 76.8
  average 72.2 -> 77.5.  Table 7 (Primal.+DT, s = 32 / 64 / 96), e.g. hopper-medium 66.7 / 63.1 / 73.8.

Data (`data.source`): "embedded" (default: datasets regenerated here in the MuJoCo -v4 envs from the committed
behaviour policies, `experiments/results/d4rl/`; NOT D4RL's data, scores are not comparable with Table 4),
"d4rl" (`--config.data.path=hopper-medium-v2.hdf5` or `--config.data.data_dir=DIR`), "minari"
(`--config.data.minari_id=mujoco/hopper/medium-v0`). Rollouts always run in the gymnasium -v4 env.

Arguments (`--config=d4rl:env=hopper,dataset=medium,model=dt,short`):
  env: hopper | halfcheetah | walker2d.  dataset: medium | medium-replay | medium-expert | expert.
  model: dt | primal_dt | any registered attention with a causal form (every layer, as Table 4's baselines:
    linear, reformer, performer, cosformer, flowformer; Flowformer in the release's form, the release's
    RL `Flowformer_attention`, which ignores the step mask; the others in their papers' causal forms).
  low_rank: s of the Primal layer (0: Table 7's best for the dataset).
  short: dim 64, 3,000 steps (warm-up 500), evaluated every 1,000: about 20 minutes on 2 CPU cores.
  wide: dim 128 in 1 head (WIDE), after `short`: a per-head width p = 128 at least Table 7's largest s (96), so
    every s of Table 7 adds rank (`short` has p = 16, the release p = 64, below s = 96); composes with `short`.
  smoke: a seconds-long run (tests, CI).
"""

from __future__ import annotations

import ml_collections

from primal_jax.tasks.common import base_config, check_model_arg, optimizer, parse_config_arg, run_controls

# Table 7's best s per (env, dataset) at eta = 0.05.
BEST_LOW_RANK = {
  ("halfcheetah", "medium-expert"): 96,
  ("hopper", "medium-expert"): 64,
  ("walker2d", "medium-expert"): 96,
  ("halfcheetah", "medium"): 64,
  ("hopper", "medium"): 96,
  ("walker2d", "medium"): 64,
  ("halfcheetah", "medium-replay"): 32,
  ("hopper", "medium-replay"): 64,
  ("walker2d", "medium-replay"): 96,
}
NUM_LAYERS = 3
# `wide`: the width and heads of Table 4's all-mechanism runs and Table 7's s sweep (per-head width 128 >= 96).
WIDE = dict(dim=128, num_heads=1)
# Table 4's baselines that the release's RL code holds run in its form (the others have no release code).
BASELINE_OPTIONS = {"flowformer": {"flowformer": {"form": "release"}}}


def dt_layers(model: str, num_layers: int = NUM_LAYERS) -> tuple[str, ...]:
  """dt: GPT-2 attention everywhere; primal_dt: the last layer Primal; another name: that attention everywhere."""
  if model == "dt":
    return ("gpt2",) * num_layers
  if model == "primal_dt":
    return ("gpt2",) * (num_layers - 1) + ("primal",)
  return (model,) * num_layers


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = parse_config_arg(
    arg,
    {
      "env": "hopper",
      "dataset": "medium",
      "model": "primal_dt",
      "low_rank": 0,
      "short": False,
      "wide": False,
      "smoke": False,
    },
  )
  env, dataset, model = args["env"], args["dataset"], args["model"]
  options_of = {"primal": {"data_dependent": False}, **{k: v for o in BASELINE_OPTIONS.values() for k, v in o.items()}}
  check_model_arg(model, "decision_transformer", ("dt", "primal_dt"), options_of)  # a causal form, or refused now
  low_rank = args["low_rank"] or BEST_LOW_RANK.get((env, dataset), 64)
  config = base_config(task="offline_rl")
  config.data = dict(
    task="d4rl",
    env=env,
    dataset=dataset,
    source="embedded",
    path="",
    data_dir="",
    minari_id="",
    size=0,  # embedded: transitions per level (0: the default, 100k)
    dataset_seed=0,
    context=20,
    batch_size=64,
    reward_scale=1000.0,
    padding="left",
    max_ep_len=1000,
    steps_per_epoch=10_000,
    target_returns=(),  # (): the DT code's targets (D4RL, Minari); embedded data: its best return (input_pipeline.py)
    eval_episodes=10,
    test_episodes=10,
    seed=0,
  )
  config.model = dict(
    name="decision_transformer",
    layers=dt_layers(model),
    attention=dict(primal=dict(low_rank=low_rank, data_dependent=False), **BASELINE_OPTIONS.get(model, {})),
    dim=256,
    num_heads=4,
    dropout_rate=0.1,
    attention_dropout_rate=0.1,
    masking="padding_aware",
    dtype="float32",
    param_dtype="float32",
  )
  config.ksvd = dict(eta=0.05 if "primal" in config.model.layers else 0.0, spec="release_sequence")
  config.optimizer = optimizer(
    "adamw",
    1e-3 if "primal" in config.model.layers else 1e-4,
    warmup_steps=10_000,
    end_lr_factor=1.0,
    weight_decay=1e-4,
    grad_clip_norm=0.25,
  )
  run_controls(
    config,
    num_epochs=10,
    total_steps=100_000,
    log_every_steps=500,
    eval_every_steps=10_000,  # eval_every_epochs is unused while it is set
    checkpoint_every_steps=10_000,
    best_metric="validation/normalized_score",
    test_eval="best_validation",
    checkpoint_on_eval=True,
  )

  if args["short"]:
    config.data.update(steps_per_epoch=1_000)
    config.model.update(dim=64)
    config.optimizer.update(warmup_steps=500)
    config.update(total_steps=3_000, log_every_steps=200, eval_every_steps=1_000, checkpoint_every_steps=1_000)
  if args["wide"]:
    config.model.update(WIDE)
  if args["smoke"]:
    config.data.update(size=2_000, batch_size=8, context=5, steps_per_epoch=10, eval_episodes=2, test_episodes=2)
    config.model.update(dim=32, num_heads=2)
    config.model.attention.primal.update(low_rank=4)
    config.optimizer.update(warmup_steps=0)
    config.update(total_steps=20, log_every_steps=5, eval_every_steps=10, checkpoint_every_steps=10)
  return config
