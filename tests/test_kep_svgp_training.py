"""KEP-SVGP in the one trainer (issue 56 items 2 and 5): the "posterior" rng stream and the `kl` collection in the
steps, the registered "kep_svgp" objective (CE + ksvd.eta x KSVD + kl.eta x scale x KL), evaluation with the
posterior mean or `eval_samples` draws, a run of the training binary's loop with checkpoint and resume, and a few
hundred bf16 training steps of the layer staying finite."""

from __future__ import annotations

import os
import signal

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from primal_jax.attention.kep_svgp import KEP_KSVD_SPEC, KEPSVGPAttention, kl_from_params
from primal_jax.attention.kep_svgp.loss import kep_loss
from primal_jax.cli.config_lookup import load_config
from primal_jax.dotted import set_dotted
from primal_jax.ksvd import KSVD_SPECS
from primal_jax.models.registry import BuiltModel
from primal_jax.training.checkpointing.checkpointer import Checkpointer
from primal_jax.training.config_schema import problems
from primal_jax.training.loop import load_state, train_and_evaluate
from primal_jax.training.metrics import read_metrics
from primal_jax.training.objectives import KEPSVGP, get_objective
from primal_jax.training.state import TrainState
from primal_jax.training.steps import make_eval_step, make_train_step, step_rngs

UEA_CONFIG = "primal_jax/tasks/uea/config.py"
JV_TRAIN = 270  # JapaneseVowels train examples


class TinyKEP(nn.Module):
  """x [B, N, 8] -> logits [B, 3]: one KEP-SVGP layer, mean pooling, a Dense head."""

  eval_samples: int = 1
  sample_posterior: bool = True
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    y = KEPSVGPAttention(
      num_heads=2, low_rank=3, rank_multi=2, eval_samples=self.eval_samples, sample_posterior=self.sample_posterior,
      dtype=self.dtype, name="kep",
    )(x, deterministic=deterministic)  # fmt: skip
    return nn.Dense(3, dtype=self.dtype)(jnp.mean(y, axis=1))


def _batch(seed=0, b=4, n=6):
  rng = np.random.default_rng(seed)
  return {
    "x": rng.normal(size=(b, n, 8)).astype(np.float32),
    "label": rng.integers(0, 3, size=b).astype(np.int32),
    "weight": np.ones(b, np.float32),
  }


def _state(module, tx=None, seed=0):
  params = module.init({"params": jax.random.PRNGKey(seed)}, _batch()["x"], deterministic=True)["params"]
  tx = tx or optax.sgd(0.0)
  return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), jax.random.PRNGKey(7), {}), tx


def test_objective_is_registered_with_the_authors_defaults_and_config_keys():
  objective = get_objective("kep_svgp")
  assert isinstance(objective, KEPSVGP) and (objective.eta_kl, objective.kl_scale) == (1.0, 1.0)
  assert objective.configured(ml_collections.ConfigDict(), {"train": 500}) == objective  # no kl section: authors'
  config = ml_collections.ConfigDict({"kl": {"eta": 0.5, "scale": "dataset"}})
  assert objective.configured(config, {"train": 500}) == KEPSVGP(eta_kl=0.5, kl_scale=1 / 500)
  for bad, match in (({"eta": -1.0}, "kl.eta"), ({"scale": "batch"}, "kl.scale")):
    with pytest.raises(ValueError, match=match):
      objective.configured(ml_collections.ConfigDict({"kl": bad}), {"train": 500})
  with pytest.raises(ValueError, match="config.kl .* applies to task='kep_svgp' only, not task='classification'"):
    get_objective("classification").configured(config, {"train": 500})
  assert KSVD_SPECS["release_kep"] == KEP_KSVD_SPEC  # the authors' KSVD term, by name in configs


def test_config_schema_refuses_bad_kl_keys():
  config = load_config(f"{UEA_CONFIG}:smoke,model=kep_svgp", lock=False)
  assert not [p for p in problems(config) if "kl." in p]
  set_dotted(config, "kl", {"eta": -1.0, "scale": "batch"}, new_leaf=True)
  found = [p for p in problems(config) if "kl." in p]
  assert len(found) == 2 and "--config.kl.eta" in found[0] and "--config.kl.scale" in found[1] and "dataset" in found[1]


def test_step_rngs_have_a_posterior_stream_per_step_and_a_fixed_one_at_eval():
  run = jax.random.PRNGKey(3)
  a, b = (step_rngs(jax.random.fold_in(run, t), True)["posterior"] for t in (0, 1))
  again = step_rngs(jax.random.fold_in(run, 0), True)["posterior"]
  assert np.array_equal(a, again) and not np.array_equal(a, b)
  assert np.array_equal(step_rngs(None, False)["posterior"], step_rngs(None, False)["posterior"])


def test_train_step_adds_the_weighted_kl_and_records_it():
  built = BuiltModel(TinyKEP(), ("x",), task="kep_svgp")
  state, tx = _state(built.module)
  objective = KEPSVGP(eta_kl=0.5, kl_scale=0.01)
  step = jax.jit(make_train_step(built, tx, lambda _: 0.0, eta=0.1, spec=KEP_KSVD_SPEC, objective=objective))
  batch = _batch()
  _, scalars = step(state, batch)
  kl = float(kl_from_params(state.params["kep"], "paper"))  # the KL of the parameters the step saw
  assert kl > 0 and float(scalars["kl_loss"]) == pytest.approx(kl, rel=1e-5)
  # The same apply the step made (its rngs: the run key folded with step 0), through kep_loss: the authors' total.
  logits, cols = built.module.apply(
    {"params": state.params}, batch["x"], deterministic=False,
    rngs=step_rngs(jax.random.fold_in(state.rng, 0), True), mutable=["ksvd", "kl"],
  )  # fmt: skip
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
  ref = kep_loss(ce, cols, eta_ksvd=0.1, eta_kl=0.5, kl_scale=0.01)
  assert float(scalars["loss"]) == pytest.approx(float(ref["total"]), rel=1e-5)
  assert float(scalars["ksvd_loss"]) == pytest.approx(float(ref["ksvd"]), rel=1e-5)
  # A KEP model under another objective is refused, not trained without its KL.
  with pytest.raises(ValueError, match="task='classification' would drop the KL term"):
    make_train_step(built, tx, lambda _: 0.0, eta=0.1, spec=KEP_KSVD_SPEC, objective=get_objective("classification"))(
      state, batch
    )
  # Without a KEP layer the objective is refused, not trained without its KL.
  plain = BuiltModel(nn.Sequential([lambda x, deterministic=True: x.mean(1), nn.Dense(3)]), ("x",))
  pstate, _ = _state(plain.module)
  with pytest.raises(ValueError, match="kl collection holds no KL"):
    make_train_step(plain, tx, lambda _: 0.0, eta=0.0, spec=KEP_KSVD_SPEC, objective=objective)(pstate, batch)


def test_eval_uses_the_posterior_mean_or_eval_samples_draws():
  batch, objective = _batch(1), get_objective("kep_svgp")

  def evaluate(**options):
    built = BuiltModel(TinyKEP(**options), ("x",), task="kep_svgp")
    state, _ = _state(built.module)
    return jax.jit(make_eval_step(built, eta=0.0, spec=KEP_KSVD_SPEC, objective=objective))(state, batch)

  mean, deterministic = evaluate(eval_samples=0), evaluate(sample_posterior=False)
  assert float(mean["task_loss_sum"]) == pytest.approx(float(deterministic["task_loss_sum"]), rel=1e-6)
  sampled, again = evaluate(eval_samples=4), evaluate(eval_samples=4)
  assert float(sampled["task_loss_sum"]) == float(again["task_loss_sum"])  # the eval key is fixed
  assert abs(float(sampled["task_loss_sum"]) - float(mean["task_loss_sum"])) > 1e-6  # draws, not the mean
  kl = float(mean["kl_loss_sum"]) / float(mean["examples"])
  assert kl == pytest.approx(float(sampled["kl_loss_sum"]) / float(sampled["examples"]), rel=1e-6) and kl > 0


def test_bf16_training_of_the_layer_stays_finite():
  """Issue 56 item 5: 300 adam steps of the layer computing in bfloat16 (float32 parameters), with the authors'
  unscaled KL and the release KSVD term, stay finite and lower the loss."""
  module, tx = TinyKEP(dtype=jnp.bfloat16), optax.adam(1e-3)
  state, _ = _state(module, tx)
  batch = _batch(2, b=8)

  def loss_fn(params, key):
    logits, cols = module.apply(
      {"params": params}, batch["x"], deterministic=False, rngs={"posterior": key}, mutable=["ksvd", "kl"]
    )
    ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), batch["label"]).mean()
    return kep_loss(ce, cols, eta_ksvd=1.0, eta_kl=1.0)["total"]

  def body(carry, key):
    params, opt = carry
    loss, grads = jax.value_and_grad(loss_fn)(params, key)
    updates, opt = tx.update(grads, opt, params)
    return (optax.apply_updates(params, updates), opt), loss

  (params, _), losses = jax.jit(lambda c, k: jax.lax.scan(body, c, k))(
    (state.params, state.opt_state), jax.random.split(jax.random.PRNGKey(0), 300)
  )
  losses = np.asarray(losses, np.float64)
  assert np.all(np.isfinite(losses)) and all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(params))
  assert losses[-10:].mean() < 0.5 * losses[:10].mean()


def _smoke(data_dir, **overrides):
  config = load_config(f"{UEA_CONFIG}:smoke,model=kep_svgp", lock=False)
  config.data.data_dir = data_dir
  config.update(total_steps=4, log_every_steps=1, checkpoint_every_steps=2, task="kep_svgp")
  config.ksvd.update(eta=0.1, spec="release_kep")
  set_dotted(config, "model.attention.kep_svgp", {"low_rank": 3, "rank_multi": 2}, new_leaf=True)
  set_dotted(config, "kl", {"eta": 0.5, "scale": "dataset"}, new_leaf=True)
  for key, value in overrides.items():
    set_dotted(config, key, value, new_leaf=True)
  return config


def _run(config, workdir, kill_at_step=None):
  lines = []

  def print_fn(line):
    lines.append(line)
    if kill_at_step is not None and line.startswith(f"step {kill_at_step}/"):
      os.kill(os.getpid(), signal.SIGTERM)

  return train_and_evaluate(config, workdir, print_fn=print_fn), lines


@pytest.fixture(scope="module")
def kep_run(jv_tfds_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("kep_straight")
  config = _smoke(jv_tfds_dir)
  summary, _ = _run(config, workdir)
  return config, workdir, summary


def test_training_binary_trains_kep_svgp_with_its_kl(kep_run):
  config, workdir, summary = kep_run
  assert summary["steps"] == 4 and not summary["preempted"]
  train = read_metrics(workdir, dedupe=True, prefix="train")
  assert [m["step"] for m in train] == [1, 2, 3, 4]
  for record in train:
    s = record["scalars"]
    assert np.isfinite(s["loss"]) and s["kl_loss"] > 0 and s["ksvd_loss"] > 0
    # loss = CE + ksvd.eta x KSVD + kl.eta x (1 / train examples) x KL (float32 on device)
    assert s["loss"] == pytest.approx(s["task_loss"] + 0.1 * s["ksvd_loss"] + 0.5 / JV_TRAIN * s["kl_loss"], rel=1e-5)
  test = read_metrics(workdir, dedupe=True, prefix="test")[-1]["scalars"]
  _, state = load_state(config, workdir)  # the KL of the final parameters, summed over both KEP layers
  layers = [node for _, node in _kep_params(nn.unbox(jax.device_get(state.params)))]
  assert len(layers) == 2
  kl = sum(float(kl_from_params(node, "paper")) for node in layers)
  assert test["kl_loss"] == pytest.approx(kl, rel=1e-5) and np.isfinite(test["loss"])
  assert Checkpointer(workdir / "checkpoints").latest_step() == 4


def _kep_params(tree, path=()):
  """(path, params) of every KEP-SVGP layer in a params tree (the dicts holding `log_lambda`)."""
  if "log_lambda" in tree:
    yield path, tree
    return
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from _kep_params(value, (*path, key))


def test_kep_svgp_sigterm_then_resume_is_bit_identical(kep_run, tmp_path):
  config, straight_dir, straight = kep_run
  summary, lines = _run(config, tmp_path, kill_at_step=2)
  assert summary["preempted"] and Checkpointer(tmp_path / "checkpoints").latest_step() == 2
  summary, lines = _run(config, tmp_path)
  assert any("resumed from step 2" in line for line in lines) and summary["final"] == straight["final"]
  ours = [(m["step"], m["scalars"]) for m in read_metrics(tmp_path, dedupe=True, prefix="train")]
  assert ours == [(m["step"], m["scalars"]) for m in read_metrics(straight_dir, dedupe=True, prefix="train")]
  for a, b in zip(
    jax.tree.leaves(load_state(config, tmp_path)[1].params),
    jax.tree.leaves(load_state(config, straight_dir)[1].params),
    strict=True,
  ):
    np.testing.assert_array_equal(a, b)
