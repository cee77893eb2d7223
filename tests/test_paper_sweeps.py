"""The sweeps of issue 29's tables: Table 1 (experiments/sweeps/uea.py `table1_all`), Table 2 (experiments/sweeps/
lra.py) and Table 4 (experiments/sweeps/d4rl.py `table4_all`, `table7`) plan every mechanism of the paper's columns x
dataset x seed, every planned model builds at its data's length (a mechanism that cannot honour that length refuses
when called, so building is the check), and every mechanism trains a 3-step smoke run in each family (slow)."""

from __future__ import annotations

import collections
import dataclasses
import json
import types
from pathlib import Path

import jax
import numpy as np
import pytest

from experiments import lra_params
from experiments.engine.runner import run_sweep
from experiments.engine.spec import Sweep, load_sweep, plan, resolve, select
from primal_jax.cli.config_lookup import load_config
from primal_jax.errors import ConfigError
from primal_jax.models.registry import build_model
from primal_jax.tasks.lm import config as lm_config
from primal_jax.tasks.uea import config as uea_config

UEA_SWEEP = "experiments/sweeps/uea.py"
LRA_SWEEP = "experiments/sweeps/lra.py"
D4RL_SWEEP = "experiments/sweeps/d4rl.py"
LM_SWEEP = "experiments/sweeps/lm.py"
VIT_SWEEP = "experiments/sweeps/vit.py"
UEA_SHAPES = {"JapaneseVowels": (12, 9), "BasicMotions": (6, 4)}  # channels, classes
TABLE1 = ["softmax", "linear", "reformer", "longformer", "performer", "yoso_e", "cosformer", "soft", "flowformer"]
TABLE1 += ["primalformer", "primal_plus"]
TABLE2 = ["softmax", "reformer", "performer", "linformer", "nystromformer", "longformer", "yoso_e"]
TABLE2 += ["primalformer", "primal_plus"]
TABLE4 = ["dt", "linear", "reformer", "performer", "cosformer", "flowformer", "primal_dt"]


def _model(run) -> str:
  return dict(item.split("=") for item in run.config.partition(":")[2].split(",") if "=" in item)["model"]


def _only(sweep: Sweep, table: str, **labels) -> Sweep:
  runs = tuple(r for r in sweep.runs if r.cell.table == table and labels.items() <= dict(r.cell.labels).items())
  return dataclasses.replace(sweep, runs=runs)


# --- Table 1 (UEA)


def test_table1_plans_every_mechanism_dataset_seed_and_protocol():
  sweep = load_sweep(UEA_SWEEP)
  runs = [r for r in sweep.runs if r.cell.table == "table1_all"]
  assert len(runs) == 2 * 11 * 5 * 2
  cells = collections.Counter((dict(r.cell.labels)["dataset"], _model(r), r.protocol) for r in runs)
  assert cells == {(d, m, p): 5 for d in UEA_SHAPES for m in TABLE1 for p in ("honest", "release")}
  # The honest column of every seed first, seed-major within it.
  assert [r.protocol for r in runs] == ["honest"] * 110 + ["release"] * 110
  assert [r.seed for r in runs[:44]] == [0] * 22 + [1] * 22
  assert sweep.baselines["table1_all"] == ("model", "Trans.")
  paper = {
    dict(r.cell.labels)["model"]: r.cell.paper for r in runs if dict(r.cell.labels)["dataset"] == "JapaneseVowels"
  }
  trans, primal, plus = uea_config.PAPER_TABLE1["JapaneseVowels"]
  assert (paper["Trans."], paper["PrimalFormer"], paper["Primal.+Trans."]) == (trans, primal, plus)
  assert paper["SOFT"] == paper["Linear"] == 99.2 and paper["Reformer"] == 97.8 and len(paper) == 11
  assert {r.cell.paper for r in runs if dict(r.cell.labels)["dataset"] == "BasicMotions"} == {None}

  planned = plan(sweep.runs)
  assert len(select(planned, ["table1_all"])) == 220
  # The recorded grid (3 seeds) is untouched and shares table1_all's Trans./Primal rows at seeds 0-2.
  recorded = select(planned, ["table1", "table6", "table8", "basicmotions"])
  assert len(recorded) == 108 and len(planned) == 220 + 108 - 36 + 17 + 12  # eta: 20 new, 3 table6's; figure1: 12
  first = load_sweep(f"{UEA_SWEEP}:seeds=2,ablation_seeds=0,figure_seeds=0,protocols=honest")
  assert len(first.runs) == 44 + 12 and {r.protocol for r in first.runs} == {"honest"}  # + 2 seeds of eta
  with pytest.raises(ConfigError, match="protocols"):
    load_sweep(f"{UEA_SWEEP}:protocols=honest+sloppy")


def test_table1_seeds_adds_seeds_of_the_table1_models_after_every_other_run():
  sweep = load_sweep(UEA_SWEEP)
  ten = load_sweep(f"{UEA_SWEEP}:table1_seeds=10")
  extra = ten.runs[len(sweep.runs) :]
  assert ten.runs[: len(sweep.runs)] == sweep.runs and len(extra) == 3 * 5 * 2
  assert [(r.protocol, r.seed) for r in extra] == [
    (p, s) for p in ("honest", "release") for s in range(5, 10) for _ in "abc"
  ]
  models = {(r.cell.table, dict(r.cell.labels)["dataset"], _model(r)) for r in extra}
  assert models == {("table1_all", "JapaneseVowels", m) for m in ("softmax", "primalformer", "primal_plus")}
  # Seeds 5-9 are new configs; the same cells at seeds 0-4 are table1_all's runs.
  assert len(select(plan(ten.runs), ["table1_all"])) == 220 + 30
  assert load_sweep(f"{UEA_SWEEP}:table1_seeds=5").runs == sweep.runs


def test_eta_table_pairs_each_eta_with_zero_and_reuses_table1_all_at_the_release_eta():
  sweep = load_sweep(UEA_SWEEP)
  runs = [r for r in sweep.runs if r.cell.table == "eta"]
  assert {r.protocol for r in runs} == {"honest"} and len(runs) == 2 * 3 * 5
  assert sweep.baselines["eta"] == ("eta", "0")
  etas = collections.defaultdict(set)
  for r in runs:
    etas[dict(r.cell.labels)["model"]].add((dict(r.cell.labels)["eta"], dict(r.overrides).get("ksvd.eta")))
  assert etas["PrimalFormer"] == {("0", 0.0), ("0.0003", 3e-4), ("0.5 (release)", None)}
  assert etas["Primal.+Trans."] == {("0", 0.0), ("0.2 (release)", None), ("2", 2.0)}
  planned = plan(sweep.runs)
  eta = select(planned, ["eta"])
  assert len(eta) == 30
  shared = [p for p in eta if any(r.cell.table == "table1_all" for r in p.runs)]
  # The release-eta rows are table1_all's JapaneseVowels honest runs of the same model and seed.
  assert len(shared) == 10 and {p.config.ksvd.eta for p in shared} == {0.5, 0.2}
  assert {p.config.ksvd.eta for p in eta} == {0.0, 3e-4, 0.5, 0.2, 2.0}
  # The eta runs come after table1_all's honest column and before its release one.
  order = [(r.cell.table, r.protocol) for r in sweep.runs]
  assert order.index(("eta", "honest")) > max(i for i, o in enumerate(order) if o == ("table1_all", "honest"))
  assert order.index(("eta", "honest")) < order.index(("table1_all", "release"))


def test_figure1_trains_four_arms_that_keep_their_checkpoints():
  sweep = load_sweep(UEA_SWEEP)
  figure = select(plan(sweep.runs), ["figure1"])
  arms = collections.Counter(dict(p.runs[0].cell.labels)["arm"] for p in figure)
  assert arms == {"softmax": 3, "PrimalFormer eta=0": 3, "PrimalFormer eta=0.5": 3, "PrimalFormer eta=3e-4": 3}
  for p in figure:  # runs of their own (no other table's run keeps a checkpoint), honest, JapaneseVowels
    assert len(p.runs) == 1 and p.runs[0].protocol == "honest" and p.config.checkpoint_on_eval
    assert p.config.data.dataset == "JapaneseVowels"
    arm = dict(p.runs[0].cell.labels)["arm"]
    eta = {"softmax": 0.0, "PrimalFormer eta=0": 0.0, "PrimalFormer eta=0.5": 0.5, "PrimalFormer eta=3e-4": 3e-4}[arm]
    layers = ("primal", "primal") if arm.startswith("PrimalFormer") else ("softmax", "softmax")
    assert p.config.ksvd.eta == eta and tuple(p.config.model.layers) == layers
  assert sorted({p.config.seed for p in figure}) == [0, 1, 2]


def test_vit_figure1_is_four_arms_of_three_models_sharing_the_tables_runs():
  sweep = load_sweep(VIT_SWEEP)
  planned = plan(sweep.runs)
  figure = select(planned, ["figure1"])
  arms = collections.Counter(dict(r.cell.labels)["arm"] for p in figure for r in p.runs if r.cell.table == "figure1")
  assert arms == {"DeiT": 3, "Primal.+DeiT eta=0.05": 3, "Primal.+DeiT eta=0": 3, "Primal.+DeiT eta=3": 3}
  # figure1's DeiT and eta=0.05 arms are the fashion_mnist runs, seed 0 of eta=0 eta0's; table5_long and
  # table5_8x add 6 each
  assert len(planned) == 12 + 6 + 6
  for p in figure:
    arm = next(dict(r.cell.labels)["arm"] for r in p.runs if r.cell.table == "figure1")
    etas = {"DeiT": 0.0, "Primal.+DeiT eta=0": 0.0, "Primal.+DeiT eta=3": 3.0}
    assert p.config.checkpoint_on_eval and p.config.ksvd.eta == etas.get(arm, 0.05)
  long = select(planned, ["table5_long"])
  assert len(long) == 6 and {p.config.total_steps for p in long} == {12_000}
  assert {(p.config.seed, p.config.model.layers[-1]) for p in long} == {
    (s, m) for s in range(3) for m in ("softmax", "primal")
  }
  eight = select(planned, ["table5_8x"])  # issue 55.3: the same runs at 8x, their own table and run keys
  assert len(eight) == 6 and {p.config.total_steps for p in eight} == {24_000}
  assert {(p.config.seed, p.config.model.layers[-1]) for p in eight} == {
    (s, m) for s in range(3) for m in ("softmax", "primal")
  }
  assert not {p.key for p in eight} & {p.key for p in long}
  assert {p.config.checkpoint_on_eval for p in eight} == {True}
  assert sweep.baselines == {
    "fashion_mnist": ("model", "DeiT"),
    "table5_long": ("model", "DeiT"),
    "table5_8x": ("model", "DeiT"),
    "figure1": ("arm", "Primal.+DeiT eta=0"),  # accuracy of each Figure 1 arm against the arm without KSVD loss
  }


def test_datasets_argument_selects_table1_all_datasets_in_order():
  jv = load_sweep(f"{UEA_SWEEP}:datasets=JapaneseVowels,protocols=honest,ablation_seeds=0")
  assert {dict(r.cell.labels).get("dataset") for r in jv.runs if r.cell.table == "table1_all"} == {"JapaneseVowels"}
  assert len(select(plan(jv.runs), ["table1_all", "eta"])) == 55 + 20
  both = load_sweep(f"{UEA_SWEEP}:datasets=BasicMotions+JapaneseVowels,seeds=1,ablation_seeds=0")
  first = [dict(r.cell.labels)["dataset"] for r in both.runs if r.cell.table == "table1_all"][:12]
  assert first == ["BasicMotions"] * 11 + ["JapaneseVowels"]
  for bad in ("Epilepsy", "JapaneseVowels+JapaneseVowels", ""):
    with pytest.raises(ConfigError, match="datasets must be"):
      load_sweep(f"{UEA_SWEEP}:datasets={bad}")


def test_table1_every_mechanism_builds_at_its_datasets_length():
  """Full-size models at JapaneseVowels' 29 (Reformer: padded to 32) and BasicMotions' 100 steps; the options
  sized for those lengths are the ones the config documents."""
  configs = {}
  for p in select(plan(load_sweep(f"{UEA_SWEEP}:seeds=1,ablation_seeds=0,protocols=honest").runs), ["table1_all"]):
    configs[dict(p.runs[0].cell.labels)["dataset"], _model(p.runs[0])] = p.config
  assert len(configs) == 22
  for (dataset, model), config in configs.items():
    channels, classes = UEA_SHAPES[dataset]
    length = config.data.seq_len or uea_config.SERIES_LENGTH[dataset]
    info = types.SimpleNamespace(seq_len=length, num_classes=classes, num_features=channels, vocab_size=0)
    built = build_model(config.model, info)
    mask = np.arange(length)[None] < uea_config.SERIES_LENGTH[dataset]
    inputs = (np.zeros((2, length, channels), np.float32), np.broadcast_to(mask, (2, length)))
    out = jax.eval_shape(lambda b=built, x=inputs: b.module.init(jax.random.key(0), *x, deterministic=True))
    assert out, (dataset, model)
  reformer = configs["JapaneseVowels", "reformer"]
  assert reformer.data.seq_len == 32 and reformer.model.attention.reformer.chunk_length == 4
  assert configs["BasicMotions", "soft"].model.attention.soft.num_landmarks == 25
  assert configs["JapaneseVowels", "longformer"].model.attention.longformer.window == 16


@pytest.mark.slow
def test_every_table1_mechanism_trains_a_smoke_run(jv_tfds_dir, tmp_path):
  sweep = load_sweep(f"{UEA_SWEEP}:smoke,seeds=1,ablation_seeds=0,protocols=honest,data_dir={jv_tfds_dir}")
  sweep = _only(sweep, "table1_all", dataset="JapaneseVowels")
  report = run_sweep(sweep, tmp_path, print_fn=lambda _: None)
  assert not report["failed"] and len(report["ran"]) == 11
  assert {p.config.total_steps for p in plan(sweep.runs).values()} == {3}
  rows = [row for row in report["rows"] if row.n]
  assert len(rows) == 11 and all(0.0 <= row.mean <= 100.0 for row in rows)


@pytest.mark.parametrize(
  ("dataset", "model", "options", "refusal"),
  [
    ("BasicMotions", "reformer", {"chunk_length": 64}, r"sequence length \(100\) must be a multiple of chunk_length"),
    ("JapaneseVowels", "soft", {"num_landmarks": 64}, r"num_landmarks \(64\) must be <= the sequence length \(29\)"),
  ],
)
def test_table1_class_defaults_that_do_not_fit_are_refused(dataset, model, options, refusal):
  """Why `baseline_options` sizes them: the class defaults refuse these lengths (they are not silently changed)."""
  config = load_config(f"uea:dataset={dataset},model={model}", lock=False)
  config.model.attention[model].update(options)
  config.data.seq_len = 0
  channels, classes = UEA_SHAPES[dataset]
  length = uea_config.SERIES_LENGTH[dataset]
  info = types.SimpleNamespace(seq_len=length, num_classes=classes, num_features=channels, vocab_size=0)
  built = build_model(config.model, info)
  inputs = (np.zeros((1, length, channels), np.float32), np.ones((1, length), bool))
  with pytest.raises(ValueError, match=refusal):
    jax.eval_shape(lambda: built.module.init(jax.random.key(0), *inputs, deterministic=True))


# --- Table 2 (LRA)


def test_table2_plans_every_mechanism_task_and_seed():
  sweep = load_sweep(LRA_SWEEP)
  counts = collections.Counter((r.cell.table, _model(r)) for r in sweep.runs)
  expected = {("listops", m): 3 for m in TABLE2}
  expected |= {(t, m): 3 for t in ("image", "pathfinder") for m in ("softmax", "primalformer", "primal_plus")}
  expected |= {(t, m): 3 for t in ("image", "pathfinder") for m in ("linformer", "yoso_e")}
  expected |= {("figure1", "softmax"): 3, ("figure1", "primalformer"): 9, ("listops_release", "primalformer"): 3}
  expected |= {("pathfinder_matched", "primalformer"): 3, ("pathfinder_matched", "linformer"): 6}
  expected |= {(t, m): 3 for t in ("image_long", "image_8x") for m in ("softmax", "primalformer", "primal_plus")}
  expected |= {("image_matched", m): 3 for m in ("primalformer", "primal_plus")} | {("image_matched", "softmax"): 6}
  expected |= {("listops_tuned", m): 6 for m in TABLE2}  # 2 rates x 3 seeds
  expected |= {("pathfinder_tuned", m): 6 for m in ("softmax", "primalformer", "primal_plus", "linformer", "yoso_e")}
  expected |= {("pathfinder_5seeds", "primalformer"): 10, ("pathfinder_5seeds", "linformer"): 5}
  # figure1: the listops runs, 3 at eta 0 and 3 at eta 2; listops_release: 3 on the release's schedule;
  # pathfinder_matched: the pathfinder table's PrimalFormer and Linformer runs and 3 of Linformer at k 16;
  # image_long: 9 new runs; image_matched: the image table's Trans., PrimalFormer and Primal.+Trans. and 3 new;
  # listops_tuned and pathfinder_tuned: their tables' runs at the `short` rate, and 27 and 15 new at the other;
  # pathfinder_5seeds: pathfinder_tuned's PrimalFormer (both rates) and Linformer (1e-4) runs, and seeds 3-4: 6 new;
  # image_8x: 9 new runs
  assert counts == expected and len(plan(sweep.runs)) == 57 + 6 + 3 + 3 + 9 + 3 + 27 + 15 + 6 + 9
  assert {r.protocol for r in sweep.runs} == {"own_validation"}
  assert {r.cell.table for r in sweep.runs if ",short" not in r.config} == {"listops_release"}
  release = [p.config for p in select(plan(sweep.runs), ["listops_release"])]
  assert {(c.total_steps, c.data.batch_size, c.optimizer.learning_rate, c.optimizer.warmup_steps) for c in release} == {
    (5000, 32, 1e-4, 1000)
  }
  assert sorted(c.seed for c in release) == [0, 1, 2]
  # image_long: the `short` Image runs' schedule stretched 4x (warm-up 10% as in `short`), validation every 400
  long = [p.config for p in select(plan(sweep.runs), ["image_long"])]
  short = {(c.data.batch_size, c.optimizer.learning_rate, c.eval_every_steps) for c in long}
  assert short == {(32, 1e-3, 400)} and {(c.total_steps, c.optimizer.warmup_steps) for c in long} == {(3200, 320)}
  assert {c.data.task for c in long} == {"lra_image"} and sorted(c.seed for c in long) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
  # image_8x (issue 55.3): the same stretched 8x, its own run keys
  eight = select(plan(sweep.runs), ["image_8x"])
  assert {(c.config.total_steps, c.config.optimizer.warmup_steps) for c in eight} == {(6400, 640)}
  assert {
    (c.config.data.batch_size, c.config.optimizer.learning_rate, c.config.eval_every_steps) for c in eight
  } == short
  assert sorted(c.config.seed for c in eight) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
  assert not {c.key for c in eight} & {c.key for c in select(plan(sweep.runs), ["image_long"])}
  assert set(sweep.baselines) == {"listops", "image", "pathfinder", "pathfinder_matched", "image_long", "figure1"} | {
    "image_8x",
    "image_matched",
    "listops_tuned",
    "pathfinder_tuned",
    "pathfinder_5seeds",
  }
  figure = select(plan(sweep.runs), ["figure1"])
  arms = {
    (dict(r.cell.labels)["arm"], p.config.ksvd.eta, p.config.seed)
    for p in figure
    for r in p.runs
    if r.cell.table == "figure1"
  }
  assert arms == {
    (a, eta, s)
    for a, eta in (
      ("Trans.", 0.0),
      ("PrimalFormer eta=0.1", 0.1),
      ("PrimalFormer eta=0", 0.0),
      ("PrimalFormer eta=2", 2.0),
    )
    for s in range(3)
  }
  assert all(p.config.get("checkpoint_on_eval", True) and p.config.data.task == "listops" for p in figure)
  papers = {(r.cell.table, dict(r.cell.labels)["model"]): r.cell.paper for r in sweep.runs if r.cell.table != "figure1"}
  assert papers["listops", "Reformer"] == 19.1 and papers["image", "Primal.+Trans."] == 43.9
  assert papers["pathfinder", "Primal.+Trans."] == 74.3 and papers["listops", "YOSO-E"] == 37.3
  other = load_sweep(f"{LRA_SWEEP}:image_baselines=reformer+nystromformer,seeds=1")
  assert {_model(r) for r in other.runs if r.cell.table == "image"} == {
    "softmax",
    "primalformer",
    "primal_plus",
    "reformer",
    "nystromformer",
  }
  for bad in ("softmax+linformer", "linformer", "linformer+linformer", "linformer+soft"):
    with pytest.raises(ConfigError, match="image_baselines"):
      load_sweep(f"{LRA_SWEEP}:image_baselines={bad}")


def test_table2_tuned_tables_train_every_mechanism_on_one_grid_chosen_by_a_seed_0_pilot():
  """Issue 55: one protocol per table. Every row of listops_tuned / pathfinder_tuned is trained at each rate of
  its table's grid (the same for every mechanism), the `short` rate first, whose runs are the plain table's own
  (the same config keys, so nothing is trained twice); seed 0 chooses, Trans. at its chosen rate is the baseline,
  and a row that learns at no rate takes no part (the table's chance level)."""
  sweep = load_sweep(f"{LRA_SWEEP}:image_baselines=linformer+longformer")
  planned = plan(sweep.runs)
  assert dict(sweep.tuned) == {t: "learning_rate" for t in ("listops_tuned", "pathfinder_tuned", "pathfinder_5seeds")}
  assert dict(sweep.pilot) == {"listops_tuned": (0,), "pathfinder_tuned": (0,)}
  for task, grid in (("listops", (1e-3, 3e-3)), ("pathfinder", (1e-4, 1e-3))):
    table = f"{task}_tuned"
    assert sweep.baselines[table] == ("model", "Trans.") and sweep.chance[table] == sweep.chance[task]
    assert table in sweep.shared
    runs = [(p, r) for p in select(planned, [table]) for r in p.runs if r.cell.table == table]
    rates = collections.Counter((dict(r.cell.labels)["model"], p.config.optimizer.learning_rate) for p, r in runs)
    models = {dict(r.cell.labels)["model"] for p, r in runs}
    assert rates == {(m, lr): 3 for m in models for lr in grid}
    assert all(float(dict(r.cell.labels)["learning_rate"]) == p.config.optimizer.learning_rate for p, r in runs)
    plain = {p.key for p in select(planned, [task])}
    at_short = {p.key for p, r in runs if p.config.optimizer.learning_rate == grid[0]}
    assert at_short == plain

    # each run at the second rate is a plain run's config with only the learning rate changed
    def bare(config):
      tree = config.to_dict()
      return tree["optimizer"].pop("learning_rate"), json.dumps(tree, sort_keys=True, default=str)

    plain_configs = {bare(p.config)[1] for p in select(planned, [task])}
    second = [bare(p.config) for p, _ in runs if p.config.optimizer.learning_rate != grid[0]]
    assert len(second) == 3 * len(models) and all(lr == grid[1] and rest in plain_configs for lr, rest in second)
    assert {p.config.total_steps for p, _ in runs} == {p.config.total_steps for p in select(planned, [task])}
  assert len({dict(r.cell.labels)["model"] for r in sweep.runs if r.cell.table == "listops_tuned"}) == 9
  assert {dict(r.cell.labels)["model"] for r in sweep.runs if r.cell.table == "pathfinder_tuned"} == {
    "Trans.",
    "Linformer",
    "Longformer",
    "PrimalFormer",
    "Primal.+Trans.",
  }


def test_table2_pathfinder_5seeds_chooses_on_every_seed_of_five_and_pairs_against_primalformer():
  """The 5-seed follow-up of Pathfinder's Linformer against PrimalFormer: PrimalFormer at both rates of the grid,
  Linformer at 1e-4, seeds 0-4, every seed choosing (no pilot); its seeds 0-2 are pathfinder_tuned's runs (the same
  keys), seeds 3 and 4 the 6 new ones."""
  sweep = load_sweep(LRA_SWEEP)
  planned = plan(sweep.runs)
  table = "pathfinder_5seeds"
  assert sweep.tuned[table] == "learning_rate" and table not in sweep.pilot and table in sweep.shared
  assert sweep.baselines[table] == ("model", "PrimalFormer") and sweep.chance[table] == 50.0
  runs = [(p, r) for p in select(planned, [table]) for r in p.runs if r.cell.table == table]
  cells = collections.Counter((dict(r.cell.labels)["model"], p.config.optimizer.learning_rate) for p, r in runs)
  assert cells == {("PrimalFormer", 1e-4): 5, ("PrimalFormer", 1e-3): 5, ("Linformer", 1e-4): 5}
  assert sorted({r.seed for _, r in runs}) == [0, 1, 2, 3, 4]
  assert all(float(dict(r.cell.labels)["learning_rate"]) == p.config.optimizer.learning_rate for p, r in runs)
  tuned = {p.key for p in select(planned, ["pathfinder_tuned"])}
  assert {p.key for p, r in runs if r.seed < 3} <= tuned and not {p.key for p, r in runs if r.seed >= 3} & tuned
  assert len({p.key for p, _ in runs}) == 15


def test_table2_every_planned_model_builds_at_its_tasks_length():
  planned = plan(load_sweep(f"{LRA_SWEEP}:seeds=1,figure_seeds=0").runs)
  # listops_release's, pathfinder_matched's, image_long's, image_matched's, the tuned tables' second rate, and
  # pathfinder_5seeds' seeds 1-4 (3 configs), image_8x's
  assert len(planned) == 19 + 1 + 1 + 3 + 1 + 9 + 5 + 12 + 3
  for p in planned.values():
    table = p.runs[0].cell.table.removesuffix("_tuned").removesuffix("_5seeds")
    task = {"image_long": "image", "image_8x": "image", "image_matched": "image"}.get(table, table)
    assert p.config.best_metric == "validation/accuracy"  # LRA's own validation split selects
    assert (p.config.data.val_fraction if task == "image" else p.config.data.num_validation) > 0
    assert lra_params.count_config_params(p.config, task) > 0, (task, _model(p.runs[0]))


def _sizes(planned, table: str, task: str) -> tuple[list, dict[str, int]]:
  """The planned runs of `table` and the parameter count of each of its rows (by model label)."""
  matched = select(planned, [table])
  rows = {dict(r.cell.labels)["model"]: p.config for p in matched for r in p.runs if r.cell.table == table}
  return matched, {model: lra_params.count_config_params(config, task) for model, config in rows.items()}


def test_image_matched_trans_has_primalformers_size_and_reuses_the_image_runs():
  matched, size = _sizes(plan(load_sweep(LRA_SWEEP).runs), "image_matched", "image")
  # the records' counts: 15,360 fewer (784 positions where the counter assumes the release's 1,024, x 64)
  assert {m: n - 15_360 for m, n in size.items()} == {
    "Trans. (hidden 331)": 227_225,
    "Trans.": 159_626,
    "PrimalFormer": 227_330,
    "Primal.+Trans.": 193_478,
  }
  assert abs(size["Trans. (hidden 331)"] / size["PrimalFormer"] - 1) < 0.001
  new = [p for p in matched if len(p.runs) == 1]
  assert len(new) == 3 and {p.config.model.hidden_dim for p in new} == {331} and len(matched) == 12
  assert load_sweep(LRA_SWEEP).baselines["image_matched"] == ("model", "Trans. (hidden 331)")


def test_pathfinder_matched_linformer_has_primalformers_size_and_reuses_the_pathfinder_runs():
  planned = plan(load_sweep(LRA_SWEEP).runs)
  matched, size = _sizes(planned, "pathfinder_matched", "pathfinder")
  assert size == {"PrimalFormer": 241_658, "Linformer (k 256)": 1_222_530, "Linformer (k 16)": 239_490}
  assert abs(size["Linformer (k 16)"] / size["PrimalFormer"] - 1) < 0.01
  # 2 x 2 heads x k x 1,024 entries of E, the rest as at k 256
  assert size["Linformer (k 256)"] - size["Linformer (k 16)"] == 2 * 2 * (256 - 16) * 1024
  shared = {p.key for p in matched if len(p.runs) > 1}
  assert shared == {
    p.key for p in select(planned, ["pathfinder"]) if _model(p.runs[0]) in ("linformer", "primalformer")
  }
  assert load_sweep(LRA_SWEEP).baselines["pathfinder_matched"] == ("model", "PrimalFormer")


def test_a_table_that_shares_runs_reads_them_by_the_plan():
  """pathfinder_matched's PrimalFormer and Linformer (k 256) rows are the pathfinder table's records; its own
  Linformer (k 16) row sets the Linformer options whole (a mapping override, kept hashable in the Run)."""
  from experiments.docs_tables import render_table

  sweep = load_sweep(LRA_SWEEP)
  assert "pathfinder_matched" in sweep.shared
  k16 = next(r for r in sweep.runs if dict(r.cell.labels).get("model") == "Linformer (k 16)")
  assert hash(k16) == hash(dataclasses.replace(k16))  # hashable, so aggregate can key the plan by run
  assert k16.all_overrides(resolve(k16))["model.attention.linformer"] == {
    "dropout_rate": 0.0,
    "form": "release",
    "linformer_k": 16,
  }
  table = render_table("lra:pathfinder_matched", Path(__file__).resolve().parents[1] / "docs")
  rows = {line.split(" | ")[1]: line for line in table.splitlines() if line.startswith("| Pathfinder")}
  assert set(rows) == {"PrimalFormer", "Linformer (k 256)", "Linformer (k 16)"}
  assert "| 60.3 ± 0.3 | 0.02 / - / 1.2e-05 | 3 of 3 |" in rows["PrimalFormer"]  # the pathfinder table's three records


@pytest.mark.slow
def test_every_listops_mechanism_trains_a_smoke_run(tmp_path):
  sweep = _only(load_sweep(f"{LRA_SWEEP}:smoke,seeds=1"), "listops")
  assert {p.config.total_steps for p in plan(sweep.runs).values()} == {3}
  report = run_sweep(sweep, tmp_path, print_fn=lambda _: None)
  assert not report["failed"] and len(report["ran"]) == 9
  assert all(row.n == 1 for row in report["rows"])


@pytest.mark.slow
def test_figure1_keeps_each_models_spectrum_and_the_arms_need_no_checkpoint(tmp_path):
  import shutil

  from experiments.spectrum import analyze
  from experiments.spectrum_store import store_path

  sweep = _only(load_sweep(f"{LRA_SWEEP}:smoke,seeds=1,figure_seeds=2"), "figure1")
  report = run_sweep(sweep, tmp_path, print_fn=lambda _: None)
  assert not report["failed"] and len(report["ran"]) == 8  # 4 arms x 2 models
  arms = {dict(r.cell.labels)["arm"]: [] for r in sweep.runs}
  for run in sweep.runs:
    arms[dict(run.cell.labels)["arm"]].append(tmp_path / "runs" / next(k for k, p in plan([run]).items()))
  for run_dir in (d for dirs in arms.values() for d in dirs):
    assert store_path(run_dir, "test", 4).exists()
    for path in run_dir.iterdir():  # what a commit keeps: the records and the spectrum
      if path.name not in ("result.json", "summary.json", "provenance.json", "spectrum_test_4.json"):
        shutil.rmtree(path) if path.is_dir() else path.unlink()
  workdirs = [d for dirs in arms.values() for d in dirs]
  labels = [arm for arm, dirs in arms.items() for _ in dirs]
  result = analyze(
    workdirs, tmp_path / "out", labels=labels, num_examples=4, references=["Trans."], print_fn=lambda _: None
  )
  assert {r["source"] for r in result["runs"]} == {"stored"} and [r["seed"] for r in result["runs"]] == [0, 1] * 4
  assert [r["layers"][0]["kind"] for r in result["runs"]] == ["softmax"] * 2 + ["primal"] * 6
  assert len(result["arms"]["paired"]) == 3 * 2 * 2  # 3 arms x 2 layers x (k90, k99) against Trans.


# --- Table 4 (D4RL)


def test_table4_plans_every_mechanism_at_a_head_width_above_every_s():
  sweep = load_sweep(D4RL_SWEEP)
  runs = [r for r in sweep.runs if r.cell.table == "table4_all"]
  counts = collections.Counter((dict(r.cell.labels)["model"], _model(r)) for r in runs)
  assert set(m for _, m in counts) == set(TABLE4) and set(counts.values()) == {3} and len(runs) == 9 * 3
  assert sweep.baselines["table4_all"] == ("model", "DT")
  # HalfCheetah adds its table4_all (27), table4_tuned (42) and table4_shared (21) runs
  assert len(load_sweep(f"{D4RL_SWEEP}:halfcheetah").runs) == len(sweep.runs) + 27 + 42 + 21
  planned = plan(sweep.runs)
  assert len(select(planned, ["table4_all"])) == 27 and len(select(planned, ["table7"])) == 9
  # table7's s = 96 runs are table4_all's Primal.+DT runs; table4_tuned adds its baselines at 1e-3 (15).
  assert len(planned) == 27 + 6 + 9 + 10 + 15
  for p in select(planned, ["table4_all", "table7"]):
    model = p.config.model
    assert model.dim // model.num_heads >= 96 >= model.attention.primal.low_rank
    assert p.config.total_steps == 3000 and p.runs[0].protocol == "rollouts"
  table7 = {p.config.model.attention.primal.low_rank for p in select(planned, ["table7"])}
  assert table7 == {32, 64, 96}
  lr = {dict(r.cell.labels)["model"]: resolve(r).optimizer.learning_rate for r in runs}
  assert lr == {**{label: 1e-4 for label in lr}, "Primal.+DT": 1e-3, "DT (lr 1e-3)": 1e-3, "Primal.+DT (lr 1e-4)": 1e-4}


def test_table4_every_mechanism_builds_and_acts():
  pytest.importorskip("gymnasium")
  from primal_jax.tasks.offline_rl.input_pipeline import RLDatasetInfo

  planned = select(plan(load_sweep(f"{D4RL_SWEEP}:seeds=1").runs), ["table4_all"])
  assert len(planned) == 9
  for p in planned:
    context = p.config.data.context
    info = RLDatasetInfo(
      "hopper-medium", 0, 11, context, 1000, {"train": 10}, (), state_dim=11, act_dim=3, env="hopper"
    )
    built = build_model(p.config.model, info)
    x = [np.zeros((2, context, 11), np.float32), np.zeros((2, context, 3), np.float32)]
    x += [np.zeros((2, context, 1), np.float32), np.tile(np.arange(context, dtype=np.int32), (2, 1))]
    x += [np.ones((2, context), np.int32)]
    out = jax.eval_shape(lambda b=built, x=x: b.module.apply(b.module.init(jax.random.key(0), *x), *x))
    assert out.shape == (2, context, 3), _model(p.runs[0])


@pytest.mark.slow
def test_every_table4_mechanism_trains_a_smoke_run(tmp_path):
  pytest.importorskip("gymnasium")
  pytest.importorskip("mujoco")
  sweep = _only(load_sweep(f"{D4RL_SWEEP}:smoke,seeds=1,lr_control=false,primal_lr_control=false"), "table4_all")
  assert {p.config.total_steps for p in plan(sweep.runs).values()} == {3}
  report = run_sweep(sweep, tmp_path, print_fn=lambda _: None)
  assert not report["failed"] and len(report["ran"]) == 7
  assert all(row.n == 1 and np.isfinite(row.mean) for row in report["rows"])


# --- the LM eta table


def test_lm_eta_table_adds_only_the_calibrated_runs_and_pairs_with_eta_zero():
  from experiments.sweeps import lm

  sweep = load_sweep(LM_SWEEP)
  eta = [r for r in sweep.runs if r.cell.table == "eta"]
  assert len(eta) == 2 * 3 * 3 and sweep.baselines["eta"] == ("eta", "0") and not sweep.higher_is_better
  planned = plan(sweep.runs)
  new = [p for p in select(planned, ["eta"]) if all(r.cell.table == "eta" for r in p.runs)]
  assert len(planned) == 15 + 6 and len(new) == 6  # eta 0 and 0.1 are the eta0 and enwiki tables' runs
  assert sorted({(p.config.model.layers, p.config.ksvd.eta) for p in new}) == sorted(
    {(lm_config.get_config("model=primal_plus").model.layers, 6e5), (lm_config.get_config().model.layers, 1e3)}
  )
  # Calibrated from the committed 2-step records: eta x (ratio at eta 0.1 / 0.1) is within 0.08-0.12.
  for model, value in lm.ETA_CALIBRATED.items():
    record = json.loads(Path(f"experiments/results/lm/eta_calibration/{model}/summary.json").read_text())
    start = record["ksvd_ratio"]["start"]
    assert start["eta"] == lm.RELEASE_ETA and start["step"] == 1
    assert 0.08 <= value * start["ratio"] / start["eta"] <= 0.12
  # The docs table states those step-1 ratios from the same records.
  from experiments.tables.sweeps import lm_eta

  text = lm_eta(Path("docs"))
  for model in lm.ETA_CALIBRATED:
    start = json.loads(Path(f"experiments/results/lm/eta_calibration/{model}/summary.json").read_text())["ksvd_ratio"]
    assert f"{model} {start['start']['ratio']:.2g} at eta 0.1 (" in text
