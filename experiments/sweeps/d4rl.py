r"""Offline-RL sweep on the embedded MuJoCo datasets: paper Tables 4 (every mechanism) and 7 (s of Primal.+DT).

  python -m experiments.sweep --sweep=experiments/sweeps/d4rl.py --workdir=experiments/results/d4rl/sweep \
    --only=table4_all,table7

Tables (`--only=` picks some):
  table4_all: Hopper medium (and HalfCheetah medium with `halfcheetah`) x every column of the paper's Table 4:
    DT, the causal Linear, Reformer, Performer, cosFormer and Flowformer (every layer that mechanism), and
    Primal.+DT, `seeds` seeds each, at the `wide` width (below); with `lr_control`, DT at Primal.+DT's learning
    rate too ("DT (lr 1e-3)": the release trains DT and the baselines at the DT code's 1e-4, Primal.+DT at
    1e-3); with `primal_lr_control`, Primal.+DT at the baselines' learning rate ("Primal.+DT (lr 1e-4)"), so
    every other mechanism has a Primal.+DT row at its own rate (issue 55: Table 4 compared learning rates).
    Paired differences: every row against DT of its dataset, seed by seed.
  table4_tuned: the rows of table4_all, each mechanism at every learning rate of `LR_GRID` (1e-4, the DT code's
    and the baselines', and 1e-3, Primal.+DT's release rate), the rate chosen per mechanism on validation by a
    pilot on seed 0 (`PILOT`: its best-validation score at each rate; one protocol for every mechanism, issue 55),
    seeds 1 and 2 trained at the chosen rate only (the sweep skips the rest), and only the chosen rows paired
    against DT at its chosen rate. Its runs at 1e-4 for DT and the baselines, at 1e-3 for Primal.+DT and the two
    controls are table4_all's (identical configs are trained once); the new ones are the five baselines at 1e-3
    (at most 15 runs per environment, 5 of them the pilot) and, on HalfCheetah, the DT (lr 1e-3) control:
      python -m experiments.sweep --sweep=experiments/sweeps/d4rl.py:halfcheetah \
        --workdir=$PWD/experiments/results/d4rl/sweep --only=table4_tuned
  table4_shared: the rows of table4_all at one shared learning rate, 1e-4 (the DT code's, at which every
    mechanism's runs reach the dataset's own score: the pilot is table4_all itself), Primal.+DT included, so a
    difference is the attention's alone (issue 55). Every run is table4_all's (no new training: the Primal.+DT
    row is its "Primal.+DT (lr 1e-4)" control). Paired differences: every row against DT.
  table7: Primal.+DT with s in {32, 64, 96} on Hopper medium at the `wide` width (its s = 96 runs are
    table4_all's Primal.+DT runs). Paired differences: s = 32 and 64 against s = 96 at the same width.
  hopper_medium: DT and Primal.+DT on Hopper medium at the `short` width (p = 16), `seeds` seeds each, and DT at
    Primal.+DT's learning rate (the recorded runs).
  table4: DT and Primal.+DT on every other embedded dataset (Hopper, HalfCheetah x medium, medium-replay,
    medium-expert) at the `short` width, one seed each unless `seeds4` says otherwise (the recorded runs).

Width: `short` (dim 64 in 4 heads) has a per-head width p = 16, below every s of Table 7 (32 / 64 / 96), so a
larger s adds no rank there (the data-independent W_e, W_r are [H, p, s]: rank <= p). table4_all and table7 use
the `wide` config argument, `short` with dim 128 in 1 head: p = 128 >= 96, so each s of Table 7 is a rank the
layer can reach (the paper's own setting, dim 256 in 4 heads, has p = 64). Cost: one `short,wide` Primal.+DT
step took ~0.3 s and a 10-episode Hopper rollout ~7 s (2 shared CPU cores, 60 timed steps), so a 3,000-step run
with its 3 validation rollouts and 1 test rollout is about 16 min: ~6.5 h for the 24 Hopper runs of table4_all,
as much again for HalfCheetah (longer episodes), ~1.6 h for table7's 6 other runs. The causal Linear,
cosFormer, Flowformer and Performer steps were far slower than that (a [B, T, f, p] prefix sum per position, and
Performer's QR at every call) until commits df105ad and 5a14132 chunked them; runs record their commit.

Mechanism settings (the `d4rl` config; Decision Transformer takes any mechanism with a causal form by name):
Linear, Performer (256 features) and cosFormer in their papers' causal forms; Flowformer in the release's RL
form; Reformer causal: exact attention within each of 2 LSH buckets (Hugging Face's bucket count at 60 tokens)
over 2 hash rounds, rotations drawn once from `hash_seed` (rollouts call the model without the train step's
"redraw" stream, so `rotations="per_call"` cannot run there). Linformer, Nystromformer, YOSO-E and SOFT have no
causal form and are refused ("causal=True is not supported by LinformerAttention (non-causal only)"); the paper's
Table 4 leaves them out too.

Every run uses the "rollouts" protocol: validation env seeds select the evaluation, test env seeds are rolled out
once on it. The paper's numbers (D4RL's own data, the full 100k-step runs) are shown beside ours; the data differ
(our datasets are regenerated from weaker behaviour policies in the -v4 envs), so compare within a row, not across.

Arguments (`--sweep=experiments/sweeps/d4rl.py:seeds=3,halfcheetah`):
  seeds: seeds of table4_all, hopper_medium and table7 (3).  seeds4: seeds of table4 (1).
  halfcheetah: table4_all on HalfCheetah medium as well.  lr_control: the "DT (lr 1e-3)" row of table4_all (on).
  primal_lr_control: the "Primal.+DT (lr 1e-4)" row of table4_all (on).
  full: the release's full-size runs (100k steps) instead of `short` (dim 256 for the `short`-width tables).
  smoke: seconds-long runs, 3 steps each (tests).
"""

from __future__ import annotations

from experiments.engine.spec import Cell, Run, Sweep
from primal_jax.tasks.common import parse_config_arg
from primal_jax.tasks.offline_rl.config import WIDE

CONFIG = "d4rl"  # the packaged config (primal_jax/tasks/offline_rl/config.py), by name
SHARED_LR = 1e-4  # table4_shared's rate for every mechanism: the DT code's, the baselines' in the release
LR_GRID = (1e-4, 1e-3)  # table4_tuned's learning rates, the same for every mechanism
PILOT = (0,)  # the seeds that choose table4_tuned's rate (the others train at the chosen rate only)
MODELS = (("DT", "dt"), ("Primal.+DT", "primal_dt"))
# Paper Table 4's columns, (label, model=), in its order.
TABLE4_MODELS = (
  ("DT", "dt"),
  ("Linear", "linear"),
  ("Reformer", "reformer"),
  ("Performer", "performer"),
  ("cosFormer", "cosformer"),
  ("Flowformer", "flowformer"),
  ("Primal.+DT", "primal_dt"),
)
# Paper Table 4 (DT, Primal.+DT) and Table 7 (Primal.+DT at s = 32, 64, 96), D4RL v2 data.
PAPER_TABLE4 = {
  ("hopper", "medium"): (64.2, 74.5),
  ("hopper", "medium-replay"): (79.7, 88.5),
  ("hopper", "medium-expert"): (104.0, 111.5),
  ("halfcheetah", "medium"): (42.4, 43.0),
  ("halfcheetah", "medium-replay"): (34.6, 38.9),
  ("halfcheetah", "medium-expert"): (83.8, 77.8),
}
# Paper Table 4, every column (TABLE4_MODELS order), the medium datasets of table4_all.
PAPER_TABLE4_ALL = {
  ("hopper", "medium"): (64.2, 58.7, 59.9, 59.7, 59.8, 66.9, 74.5),
  ("halfcheetah", "medium"): (42.4, 42.3, 42.2, 42.1, 42.1, 42.2, 43.0),
}
PAPER_TABLE7_HOPPER_MEDIUM = {32: 66.7, 64: 63.1, 96: 73.8}
HEAD_WIDTH = str(WIDE["dim"] // WIDE["num_heads"])  # p of the `wide` runs, a label of their rows
TITLES = {
  "table4_all": f"Table 4, every mechanism (embedded data, per-head width p = {HEAD_WIDTH})",
  "hopper_medium": "Hopper medium (embedded data): DT vs Primal.+DT",
  "table4": "Table 4 on the embedded datasets: DT vs Primal.+DT",
  "table4_tuned": "Table 4, every mechanism at its learning rate chosen on seed 0's validation (of 1e-4, 1e-3)",
  "table4_shared": "Table 4, every mechanism at one shared learning rate (1e-4)",
  "table7": f"Table 7, Hopper medium (embedded data, per-head width p = {HEAD_WIDTH}): s of Primal.+DT",
}


def get_sweep(arg: str | None = None) -> Sweep:
  args = parse_config_arg(
    arg,
    {
      "seeds": 3,
      "seeds4": 1,
      "halfcheetah": False,
      "lr_control": True,
      "primal_lr_control": True,
      "full": False,
      "smoke": False,
    },
  )
  size = "smoke" if args["smoke"] else ("" if args["full"] else "short")
  common = {"checkpoint_on_eval": True}
  if args["smoke"]:
    common.update(total_steps=3, eval_every_steps=3, checkpoint_every_steps=3)

  def run(table: str, env: str, dataset: str, label: str, model: str, seed: int, paper, wide=False, **overrides):
    arg = f"env={env},dataset={dataset},model={model}" + "".join(f",{a}" for a in (size, "wide" if wide else "") if a)
    labels = (("env", env), ("dataset", dataset), ("model", label)) + ((("p", HEAD_WIDTH),) if wide else ())
    labels += tuple((k.rsplit(".", 1)[-1], str(v)) for k, v in overrides.items())
    return Run(f"{CONFIG}:{arg}", Cell(table, labels, paper), seed, "rollouts", {**common, **overrides})

  runs = []
  datasets = [("hopper", "medium")] + ([("halfcheetah", "medium")] if args["halfcheetah"] else [])
  for env, dataset in datasets:
    for seed in range(args["seeds"]):  # seed-major: a partial sweep already fills every cell once
      for (label, model), paper in zip(TABLE4_MODELS, PAPER_TABLE4_ALL[env, dataset], strict=True):
        runs.append(run("table4_all", env, dataset, label, model, seed, paper, wide=True))
      # The release trains DT and the baselines at 1e-4 and Primal.+DT at 1e-3: each model at the other's rate.
      controls = (("lr_control", "DT", "dt", "1e-3"), ("primal_lr_control", "Primal.+DT", "primal_dt", "1e-4"))
      for flag, label, model, lr in controls:
        if args[flag]:
          cell = Cell(
            "table4_all", (("env", env), ("dataset", dataset), ("model", f"{label} (lr {lr})"), ("p", HEAD_WIDTH))
          )
          arg = f"env={env},dataset={dataset},model={model}" + (f",{size}" if size else "") + ",wide"
          runs.append(Run(f"{CONFIG}:{arg}", cell, seed, "rollouts", {**common, "optimizer.learning_rate": float(lr)}))
  for env, dataset in datasets:  # table4_all's runs at 1e-4, one protocol: no new run
    for seed in range(args["seeds"]):
      for (label, model), paper in zip(TABLE4_MODELS, PAPER_TABLE4_ALL[env, dataset], strict=True):
        rate = {"optimizer.learning_rate": SHARED_LR}
        runs.append(run("table4_shared", env, dataset, label, model, seed, paper, wide=True, **rate))
  for seed in range(args["seeds"]):
    for s, paper in PAPER_TABLE7_HOPPER_MEDIUM.items():
      low_rank = {"model.attention.primal.low_rank": s}
      runs.append(run("table7", "hopper", "medium", "Primal.+DT", "primal_dt", seed, paper, wide=True, **low_rank))
  for seed in range(args["seeds"]):
    for i, (label, model) in enumerate(MODELS):
      runs.append(run("hopper_medium", "hopper", "medium", label, model, seed, PAPER_TABLE4["hopper", "medium"][i]))
  for seed in range(args["seeds"]):  # after both models' seeds: the headline comparison fills first
    # The release trains Primal.+DT at lr 1e-3 and DT at the DT code's 1e-4: DT at 1e-3 separates the two changes.
    runs.append(run("hopper_medium", "hopper", "medium", "DT", "dt", seed, None, **{"optimizer.learning_rate": 1e-3}))
  for seed in range(args["seeds4"]):
    for (env, dataset), paper in PAPER_TABLE4.items():
      if (env, dataset) == ("hopper", "medium"):
        continue
      for i, (label, model) in enumerate(MODELS):
        runs.append(run("table4", env, dataset, label, model, seed, paper[i]))
  for env, dataset in datasets:  # after every other table: its new runs (baselines at 1e-3) come last
    for seed in range(args["seeds"]):
      for (label, model), paper in zip(TABLE4_MODELS, PAPER_TABLE4_ALL[env, dataset], strict=True):
        for lr in LR_GRID:
          rate = {"optimizer.learning_rate": lr}
          runs.append(run("table4_tuned", env, dataset, label, model, seed, paper, wide=True, **rate))
  schedule = "smoke runs" if args["smoke"] else ("full runs (100k steps)" if args["full"] else "`short` runs")
  notes = (
    f"{schedule}; see experiments/sweeps/d4rl.py. Values: D4RL normalised score on 10 test episodes; the paper's "
    "column is D4RL's own data (not comparable in level, only in direction)."
  )
  baselines = {"table4_all": ("model", "DT"), "hopper_medium": ("model", "DT"), "table4": ("model", "DT")}
  baselines["table7"] = ("low_rank", "96")  # each s against the paper's s = 96, at the same width
  baselines["table4_tuned"] = ("model", "DT")  # DT at its chosen rate, each row at its own
  baselines["table4_shared"] = ("model", "DT")
  tuned, pilot = {"table4_tuned": "learning_rate"}, {"table4_tuned": PILOT}
  return Sweep(
    tuple(runs),
    titles=TITLES,
    notes=notes,
    value_name="D4RL normalised score",
    baselines=baselines,
    tuned=tuned,
    pilot=pilot,
  )
