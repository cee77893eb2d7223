"""Every LRA task x model config loads, builds its model, and keeps the release's settings."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from experiments import lra_params
from primal_jax.cli.config_lookup import load_config

CONFIG = "lra"
REFERENCE = Path(
  os.environ.get("PRIMAL_JAX_REFERENCE_DIR", Path(__file__).resolve().parents[1].parent / "shared" / "reference")
)


@pytest.mark.parametrize("task", list(lra_params.LENGTHS))
@pytest.mark.parametrize("model", lra_params.models())
def test_every_config_builds(task, model):
  assert lra_params.count_params(task, model) > 0


def test_release_settings():
  listops = load_config(f"{CONFIG}:task=listops,model=primalformer")
  assert (listops.data.batch_size, listops.total_steps, listops.optimizer.warmup_steps) == (32, 5000, 1000)
  assert (listops.optimizer.name, listops.optimizer.learning_rate, listops.optimizer.schedule) == (
    "adam",
    1e-4,
    "linear",
  )
  assert (listops.model.dim, listops.model.hidden_dim, listops.model.num_heads, listops.model.layers) == (
    64,
    128,
    2,
    ("primal", "primal"),
  )
  primal = listops.model.attention.primal
  assert (primal.low_rank, primal.rank_multi, listops.ksvd.eta, listops.ksvd.spec) == (20, 10, 0.1, "release_lra")
  assert (listops.data.num_train, listops.data.num_validation, listops.data.num_test) == (96000, 2000, 2000)
  plus = load_config(f"{CONFIG}:task=listops,model=primal_plus")
  assert (plus.model.attention.primal.low_rank, plus.ksvd.eta, plus.model.layers) == (30, 0.05, ("softmax", "primal"))
  text = load_config(f"{CONFIG}:task=text,model=primalformer")
  assert (text.data.seq_len, text.total_steps, text.optimizer.warmup_steps, text.ksvd.eta) == (4000, 20000, 8000, 0.05)
  retrieval = load_config(f"{CONFIG}:task=retrieval,model=primalformer")
  assert retrieval.model.name == "lra_dual" and retrieval.ksvd.eta == 0.0
  linear = load_config(f"{CONFIG}:task=listops,model=linear")
  assert linear.ksvd.eta == 0.0  # no Primal layer, no KSVD term
  assert linear.model.layers == ("linear", "linear") and linear.model.attention.linear.dropout_rate == 0.0


@pytest.mark.parametrize("task", list(lra_params.LENGTHS))
def test_short_config_keeps_the_release_model_and_builds(task):
  release = load_config(f"{CONFIG}:task={task},model=primalformer")
  short = load_config(f"{CONFIG}:task={task},model=primalformer,short")
  assert short.model.to_dict() == release.model.to_dict()  # only the schedule and the data shrink
  assert (short.ksvd.eta, short.ksvd.spec) == (release.ksvd.eta, release.ksvd.spec)
  assert 0 < short.optimizer.warmup_steps < short.total_steps < release.total_steps
  assert short.data.batch_size <= release.data.batch_size
  assert short.total_steps % short.eval_every_steps == 0 and short.total_steps // short.eval_every_steps <= 4
  num_params = lra_params.count_config_params(short, task)
  assert num_params == lra_params.count_params(task, "primalformer")


def test_short_composes_with_model_and_smoke():
  pathfinder = load_config(f"{CONFIG}:task=pathfinder,model=softmax,short")
  assert (pathfinder.data.difficulty, pathfinder.data.num_train) == ("easy", 20000)
  # 4-dash paths without distractors at the release's lr: the level a short run learns (README, LRA).
  data, opt = pathfinder.data, pathfinder.optimizer
  assert (data.contour_length, data.num_distractors, opt.learning_rate, pathfinder.total_steps) == (4, 0, 1e-4, 3000)
  release = load_config(f"{CONFIG}:task=pathfinder").data
  assert (release.difficulty, release.contour_length, release.num_distractors) == ("hard", 0, -1)  # the level's own
  assert pathfinder.model.layers == ("softmax", "softmax") and pathfinder.ksvd.eta == 0.0
  plus = load_config(f"{CONFIG}:short,task=image,model=primal_plus")
  assert (plus.model.attention.primal.low_rank, plus.ksvd.eta, plus.data.dataset) == (30, 0.1, "fashion_mnist")
  smoke = load_config(f"{CONFIG}:task=pathfinder,short,smoke")  # smoke wins: seconds, for tests
  assert (smoke.total_steps, smoke.data.num_train) == (4, 64)


def test_param_count_matches_the_release_state_dict():
  """The release's LRA PrimalFormer golden case (vocab 32, length 512): same number of parameters."""
  path = REFERENCE / "lra_primalformer.npz"
  if not path.exists():
    pytest.skip(f"reference vectors not found at {path}")
  case = np.load(path)
  release = sum(case[k].size for k in case.files if k.startswith(("model.", "seq_classifer.")))
  assert lra_params.count_params("listops", "primalformer", seq_len=512) == release


def test_unknown_task_or_model():
  with pytest.raises(ValueError, match="task must be one of"):
    load_config(f"{CONFIG}:task=nope")
  with pytest.raises(
    ValueError,
    match="model must be one of primalformer, primal_plus, cosformer, .*, softmax, yoso_e, got .nope.",
  ):
    lra_params.count_params("listops", "nope")
