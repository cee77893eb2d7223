"""The model and objective registries (`primal_jax.models.registry`, `primal_jax.training.objectives`): the
one registry API, the built-in families as lazy entries, family options in their own types, and a model
family plus an objective registered from this file and trained one step through the train loop."""

from __future__ import annotations

import dataclasses
import types
from typing import ClassVar

import jax.numpy as jnp
import ml_collections
import pytest

from primal_jax.data.core import DatasetInfo
from primal_jax.data.registry import registered_task
from primal_jax.errors import ConfigError
from primal_jax.models.registry import (
  MODELS,
  BuiltModel,
  build_model,
  get_model,
  model_sections,
  register_model,
  registered_model,
  unregister_model,
)
from primal_jax.models.vit import VisionTransformer, VitOptions
from primal_jax.training.objectives import (
  OBJECTIVES,
  Objective,
  Regression,
  Sums,
  get_objective,
  register_objective,
  registered_objective,
  unregister_objective,
)

BUILTIN_MODELS = ("decision_transformer", "lm", "lra", "lra_dual", "timeseries", "vit")


def _builder(model_config, info) -> BuiltModel:
  raise AssertionError("not called")


def test_builtin_families_are_lazy_entries_of_their_own_modules():
  assert tuple(MODELS) == BUILTIN_MODELS
  for name in BUILTIN_MODELS:
    entry = MODELS.lazy_entry(name)
    assert entry is not None and entry.module.startswith("primal_jax.models."), name
    assert entry.target.endswith((":build", ":build_dual"))


def test_timeseries_options_reach_the_module():
  info = types.SimpleNamespace(seq_len=8, num_classes=3)
  section = dict(name="timeseries", layers=("primal",), dim=8, hidden_dim=16, num_heads=2)
  assert build_model(ml_collections.ConfigDict(section), info).module.mask_attention is True
  built = build_model(ml_collections.ConfigDict({**section, "mask_attention": False}), info)
  assert built.module.mask_attention is False and built.input_keys == ("inputs", "mask")


def test_register_get_unregister():
  assert "toy" not in MODELS
  register_model("toy", _builder)
  try:
    assert get_model("toy") is _builder and "toy" in MODELS
    with pytest.raises(ValueError, match="already registered"):
      register_model("toy", lambda c, i: None)
  finally:
    unregister_model("toy")
  assert "toy" not in MODELS
  with pytest.raises(ValueError, match="no model is registered as 'toy'"):
    unregister_model("toy")
  with registered_model("toy", _builder):
    assert MODELS["toy"] is _builder
  assert "toy" not in MODELS


def test_an_unknown_name_lists_the_registered_ones():
  with pytest.raises(ConfigError, match=r"model.name must be one of \['decision_transformer', .*'vit'\], got 'nope'"):
    build_model(ml_collections.ConfigDict({"name": "nope"}), None)
  with pytest.raises(ConfigError, match=r"task must be one of \['classification', .*\], got 'nope'"):
    get_objective("nope")


def test_replacing_a_builtin_gives_it_back():
  original = get_model("lra")
  with registered_model("lra", _builder, replace=True):
    assert get_model("lra") is _builder
  assert get_model("lra") is original
  with pytest.raises(TypeError):
    MODELS["x"] = _builder  # read-only Mapping


def test_a_builder_and_an_objective_are_checked_as_registered():
  with pytest.raises(ValueError, match="must be a callable"):
    register_model("bad", 3)
  with pytest.raises(ValueError, match="instance of"):
    register_objective("bad", Regression)  # the class, not an instance
  assert "bad" not in MODELS and "bad" not in OBJECTIVES


def test_family_options_live_in_their_own_type():
  section = ml_collections.ConfigDict(
    dict(name="vit", dtype="bfloat16", patch_size=4, primal_qk_on_finetune="pretrained", dim=16, layers=["primal"])
  )
  options, body = model_sections(section, VitOptions)
  assert options == VitOptions(patch_size=4, primal_qk_on_finetune="pretrained")
  assert body == {"dim": 16, "layers": ("primal",), "dtype": jnp.bfloat16, "param_dtype": jnp.float32}
  # A key no family type and no body field knows is refused, not stripped.
  bad = ml_collections.ConfigDict(dict(name="vit", patch_size=4, bogus=1))
  info = types.SimpleNamespace(name="img", image_shape=(8, 8, 3), num_classes=2)
  with pytest.raises(ValueError, match="bad model config for 'vit'.*bogus"):
    build_model(bad, info)
  # The ViT's fine-tuning hooks are explicit fields of what its builder returns.
  built = build_model(ml_collections.ConfigDict(dict(name="vit", patch_size=4, dim=16, num_heads=2)), info)
  assert built.adapt_pretrained is VisionTransformer.adapt_pretrained
  assert built.keep_init_on_finetune == built.module.keep_init_on_finetune


@dataclasses.dataclass(frozen=True)
class MeanAbsoluteError(Objective):
  """A test objective: sum(weight * mean_d |pred - target|) / sum(weight)."""

  name: ClassVar[str] = "toy_mae"
  batch_keys: ClassVar[tuple[str, ...]] = ("targets", "weight")
  metric_names: ClassVar[tuple[str, ...]] = ("mse",)  # a known metric name, so "best" has a direction
  selection_metric: ClassVar[str] = "mse"

  def sums(self, outputs, batch) -> Sums:
    per_unit = jnp.mean(jnp.abs(outputs.astype(jnp.float32) - batch["targets"]), axis=-1)
    weight = batch["weight"].astype(jnp.float32)
    return Sums(jnp.sum(per_unit * weight), jnp.sum(weight), {})

  def metrics(self, sums) -> dict[str, float]:
    return {"mse": float(sums["task_loss_sum"]) / max(float(sums["count"]), 1.0)}


def test_objective_register_get_unregister():
  mae = MeanAbsoluteError()
  with registered_objective("toy_mae", mae):
    assert get_objective("toy_mae") is mae and "toy_mae" in OBJECTIVES
  assert "toy_mae" not in OBJECTIVES
  register_objective("toy_mae", mae)
  unregister_objective("toy_mae")
  assert "toy_mae" not in OBJECTIVES


def test_a_family_and_an_objective_registered_here_train_one_step(tmp_path):
  from test_task_training import build_toy_regressor, make_toy_pipeline, regression_config

  from primal_jax.training.loop import train_and_evaluate

  def build(model_config, info) -> BuiltModel:
    return dataclasses.replace(build_toy_regressor(model_config, info), task="toy_mae")

  config = regression_config()
  config.model.name, config.total_steps = "toy_family", 1
  config.log_every_steps, config.eval_every_steps = 1, 1
  with (
    registered_model("toy_family", build),
    registered_objective("toy_mae", MeanAbsoluteError()),
    registered_task("toy_regression", make_toy_pipeline),
  ):
    summary = train_and_evaluate(config, tmp_path, print_fn=lambda _: None)
  assert summary["steps"] == 1 and summary["final"]["validation/mse"] > 0, summary
  assert "toy_family" not in MODELS and "toy_mae" not in OBJECTIVES


def test_dataset_info_is_all_a_builder_reads():
  info = DatasetInfo("t", 3, 2, 8, 8, {"train": 1}, ())
  built = build_model(ml_collections.ConfigDict(dict(name="lra", layers=("softmax",), dim=8, num_heads=2)), info)
  assert built.input_keys == ("inputs", "mask") and built.task == "classification"
  assert built.adapt_pretrained is None and built.keep_init_on_finetune is None
