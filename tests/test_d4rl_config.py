"""The `d4rl` config (primal_jax/tasks/offline_rl/config.py) and experiments/sweeps/d4rl.py: every model builds, the
smoke run trains and is evaluated by rollouts end to end, and the sweep plans the runs it documents."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")
pytest.importorskip("h5py")

from experiments.engine.spec import load_sweep, plan  # noqa: E402
from primal_jax.cli.config_lookup import load_config  # noqa: E402
from primal_jax.models.registry import build_model  # noqa: E402
from primal_jax.tasks.offline_rl.input_pipeline import RLDatasetInfo  # noqa: E402
from primal_jax.training.loop import train_and_evaluate  # noqa: E402

CONFIG = "d4rl"
INFO = RLDatasetInfo("hopper-medium", 0, 11, 5, 1000, {"train": 10}, (), state_dim=11, act_dim=3, env="hopper")


def test_release_hyper_parameters():
  primal = load_config(f"{CONFIG}:model=primal_dt", lock=False)
  dt = load_config(f"{CONFIG}:model=dt", lock=False)
  assert primal.model.layers == ("gpt2", "gpt2", "primal") and dt.model.layers == ("gpt2",) * 3
  assert (primal.model.dim, primal.model.num_heads, primal.data.context, primal.data.batch_size) == (256, 4, 20, 64)
  assert (primal.optimizer.learning_rate, dt.optimizer.learning_rate) == (1e-3, 1e-4)
  assert (primal.ksvd.eta, dt.ksvd.eta, primal.optimizer.weight_decay, primal.optimizer.warmup_steps) == (
    0.05,
    0.0,
    1e-4,
    10_000,
  )
  assert primal.model.attention.primal.low_rank == 96  # Table 7's best for hopper-medium
  assert load_config(f"{CONFIG}:dataset=medium-replay,env=halfcheetah").model.attention.primal.low_rank == 32
  assert load_config(f"{CONFIG}:low_rank=32").model.attention.primal.low_rank == 32


@pytest.mark.parametrize(
  "model", ["dt", "primal_dt", "linear", "cosformer", "softmax", "performer", "reformer", "flowformer"]
)
def test_every_causal_model_builds_and_predicts_actions(model):
  config = load_config(f"{CONFIG}:model={model},smoke", lock=False)
  built = build_model(config.model, INFO)
  assert built.task == "offline_rl" and built.input_keys[-1] == "mask"
  x = [np.zeros((2, 5, 11), np.float32), np.zeros((2, 5, 3), np.float32), np.zeros((2, 5, 1), np.float32)]
  x += [np.tile(np.arange(5, dtype=np.int32), (2, 1)), np.ones((2, 5), np.int32)]
  variables = built.module.init(jax.random.key(0), *x)
  out = built.module.apply(variables, *x)
  assert out.shape == (2, 5, 3) and np.all(np.abs(np.asarray(out)) <= 1.0)  # tanh actions


@pytest.mark.parametrize("model", ["linformer", "nystromformer"])
def test_models_without_a_causal_form_are_refused(model):
  with pytest.raises(ValueError, match="causal"):  # by the config itself since issue 54 (the registry's metadata)
    config = load_config(f"{CONFIG}:model={model},smoke", lock=False)
    built = build_model(config.model, INFO)
    x = [np.zeros((1, 5, 11), np.float32), np.zeros((1, 5, 3), np.float32), np.zeros((1, 5, 1), np.float32)]
    built.module.init(jax.random.key(0), *x, np.zeros((1, 5), np.int32), np.ones((1, 5), np.int32))


def test_sweep_plans_the_documented_runs():
  sweep = load_sweep("experiments/sweeps/d4rl.py")
  tables = [run.cell.table for run in sweep.runs]
  assert tables.count("hopper_medium") == 9 and tables.count("table4") == 10 and tables.count("table7") == 9
  assert tables.count("table4_all") == 27  # 7 mechanisms and the two learning-rate controls, 3 seeds
  assert tables.count("table4_tuned") == 7 * 2 * 3  # every mechanism at both learning rates, 3 seeds
  assert tables.count("table4_shared") == 7 * 3  # every mechanism at 1e-4: table4_all's runs, none new
  # table 7's s = 96 runs are table4_all's Primal.+DT runs; table4_tuned adds only its five baselines at 1e-3.
  assert len(plan(sweep.runs)) == 52 + 15
  assert all(run.protocol == "rollouts" and ":" in run.config and "short" in run.config for run in sweep.runs)
  wide = [run for run in sweep.runs if run.cell.table in ("table4_all", "table7")]
  assert all(run.config.endswith(",short,wide") for run in wide)


@pytest.mark.slow
def test_smoke_run_trains_and_is_evaluated_by_rollouts(tmp_path):
  config = load_config(f"{CONFIG}:smoke", lock=False)
  summary = train_and_evaluate(config, tmp_path, print_fn=lambda _: None)
  assert summary["steps"] == 20 and summary["test_eval"] == "best_validation"
  test = summary["test_at_best_validation"]
  assert test["step"] in (10, 20) and np.isfinite(test["normalized_score"])
  history = json.loads((tmp_path / "eval_history.json").read_text())
  assert [row["step"] for row in history] == [10, 20]
  for row in history:  # a normalised score is the return on D4RL's hopper scale
    expected = 100 * (row["validation/return"] + 20.272305) / (3234.3 + 20.272305)
    np.testing.assert_allclose(row["validation/normalized_score"], expected, rtol=1e-9)
  assert summary["best_validation"]["normalized_score"] == max(r["validation/normalized_score"] for r in history)


DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_table4_shared_reads_table4_alls_records_by_the_plan():
  """Issue 55 item 1: one learning rate for every mechanism. table4_shared trains nothing: its rows are read by the
  sweep's plan from records that name only table4_all (`experiments.tables.sweeps._rows`' fallback)."""
  from experiments.docs_tables import render_table

  table = render_table("d4rl:table4_shared", DOCS)
  hopper = [line for line in table.splitlines() if line.startswith("| hopper | medium |")]
  assert len(hopper) == 7 and all("learning_rate 0.0001" in line for line in hopper)
  primal = next(line for line in hopper if "| Primal.+DT |" in line)
  assert "| 39.1 ± 3.4 |" in primal  # table4_all's "Primal.+DT (lr 1e-4)" control, seeds 0-2
  paired = render_table("paired:d4rl:table4_shared", DOCS)
  assert "| hopper | medium | Primal.+DT | 128 | 0.0001 | DT | 3 | +1.9 |" in paired
