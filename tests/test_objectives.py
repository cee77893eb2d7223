"""Task objectives against float64 NumPy, the host-side normalisation, the late non-finite check and
mid-epoch resume without reading the consumed batches.

Tolerances: the device sums are float32 over at most a few hundred terms of size O(10), so rtol 1e-5
bounds their rounding (float32 eps 1.2e-7 times the number of terms, with margin); host metrics are
then float64 functions of those sums and inherit the same relative error (exp amplifies an absolute
error of the mean CE, which is below 1e-5 here).
"""

from __future__ import annotations

import math
import types

import jax.numpy as jnp
import numpy as np
import pytest

from primal_jax.training.objectives import OBJECTIVES, get_objective, metric_mode
from primal_jax.training.steps import eval_metrics, example_weights

RTOL = 1e-5


def log_softmax64(logits: np.ndarray) -> np.ndarray:
  z = logits.astype(np.float64)
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def host_sums(objective, batches) -> dict[str, float]:
  """Sums of several batches added on the host, as `evaluate_batches` does."""
  totals: dict[str, float] = {}
  for outputs, batch in batches:
    sums = objective.sums(jnp.asarray(outputs), {k: jnp.asarray(v) for k, v in batch.items()})
    for k, v in {"task_loss_sum": sums.loss, "count": sums.count, **sums.metrics}.items():
      totals[k] = totals.get(k, 0.0) + float(v)
  return totals


def lm_batch(rng, b=4, t=12, vocab=7):
  logits = rng.normal(size=(b, t, vocab)).astype(np.float32) * 3
  targets = rng.integers(0, vocab, (b, t)).astype(np.int32)
  weight = (rng.random((b, t)) < 0.7).astype(np.float32)
  weight[-1] = 0.0  # a padding row
  return logits, {"inputs": targets, "targets": targets, "weight": weight}


def test_next_token_cross_entropy_bits_per_byte_and_perplexity():
  rng = np.random.default_rng(0)
  batches = [lm_batch(rng) for _ in range(3)]
  objective = get_objective("next_token")
  totals = host_sums(objective, batches)
  # float64 reference over all batches at once: mean CE over real targets only.
  logits = np.concatenate([x for x, _ in batches])
  targets = np.concatenate([b["targets"] for _, b in batches])
  weight = np.concatenate([b["weight"] for _, b in batches]).astype(np.float64)
  ce = -np.take_along_axis(log_softmax64(logits), targets[..., None], -1)[..., 0]  # [B, T]
  mean_ce = (ce * weight).sum() / weight.sum()
  accuracy = ((logits.argmax(-1) == targets) * weight).sum() / weight.sum()
  np.testing.assert_allclose(totals["task_loss_sum"], (ce * weight).sum(), rtol=RTOL)
  assert totals["count"] == weight.sum()
  metrics = eval_metrics(objective, {**totals, "ksvd_loss_sum": 0.0, "examples": 1.0})
  np.testing.assert_allclose(metrics["loss"], mean_ce, rtol=RTOL)
  np.testing.assert_allclose(metrics["bits_per_byte"], mean_ce / np.log(2.0), rtol=RTOL)
  np.testing.assert_allclose(metrics["perplexity"], np.exp(mean_ce), rtol=RTOL)
  np.testing.assert_allclose(metrics["accuracy"], accuracy, rtol=RTOL)
  assert set(objective.metric_names) == set(objective.metrics(totals))


def test_uniform_logits_give_log2_of_the_vocabulary():
  """A hand-computed case: uniform logits over 256 bytes cost exactly 8 bits per byte, perplexity 256."""
  objective = get_objective("next_token")
  batch = {"targets": np.zeros((2, 5), np.int32), "weight": np.ones((2, 5), np.float32)}
  totals = host_sums(objective, [(np.zeros((2, 5, 256), np.float32), batch)])
  metrics = objective.metrics(totals)
  assert metrics["bits_per_byte"] == pytest.approx(8.0, rel=1e-6)
  assert metrics["perplexity"] == pytest.approx(256.0, rel=1e-6)


def test_perplexity_of_a_diverged_model_is_inf_not_an_error():
  assert get_objective("next_token").metrics({"task_loss_sum": 1e4, "count": 1.0, "correct_sum": 0.0})[
    "perplexity"
  ] == (math.inf)


@pytest.mark.parametrize("shape", [(4, 6, 3), (5, 2)])  # [b, T, d] sequences and [b, d] examples
def test_masked_mean_squared_error(shape):
  rng = np.random.default_rng(1)
  objective = get_objective("regression")
  batches = []
  for _ in range(3):
    pred = rng.normal(size=shape).astype(np.float32)
    targets = rng.normal(size=shape).astype(np.float32)
    weight = (rng.random(shape[:-1]) < 0.6).astype(np.float32)
    batches.append((pred, {"targets": targets, "weight": weight}))
  totals = host_sums(objective, batches)
  pred = np.concatenate([p for p, _ in batches]).astype(np.float64)
  targets = np.concatenate([b["targets"] for _, b in batches]).astype(np.float64)
  weight = np.concatenate([b["weight"] for _, b in batches]).astype(np.float64)
  per_unit = ((pred - targets) ** 2).mean(-1)  # each real step counts once, whatever d
  mse = (weight * per_unit).sum() / weight.sum()
  np.testing.assert_allclose(objective.metrics(totals)["mse"], mse, rtol=RTOL)
  # Padding (weight 0) never counts, whatever its values.
  pred[weight == 0] = 1e3
  assert np.isclose((weight * ((pred - targets) ** 2).mean(-1)).sum() / weight.sum(), mse)


def test_classification_cross_entropy_and_accuracy():
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(6, 4)).astype(np.float32)
  label = rng.integers(0, 4, 6).astype(np.int32)
  weight = np.array([1, 1, 1, 1, 0, 0], np.float32)
  objective = get_objective("classification")
  totals = host_sums(objective, [(logits, {"label": label, "weight": weight})])
  ce = -log_softmax64(logits)[np.arange(6), label]
  np.testing.assert_allclose(totals["task_loss_sum"], (ce * weight).sum(), rtol=RTOL)
  assert objective.metrics(totals)["accuracy"] == ((logits.argmax(-1) == label) * weight).sum() / 4


def test_bad_shapes_and_keys_are_clear_errors():
  with pytest.raises(ValueError, match=r"task 'next_token' needs batch keys \['targets', 'weight'\]"):
    get_objective("next_token").sums(jnp.zeros((2, 3, 5)), {"weight": jnp.ones((2, 3))})
  with pytest.raises(ValueError, match="regression needs predictions shaped like targets"):
    get_objective("regression").sums(
      jnp.zeros((2, 3, 4)), {"targets": jnp.zeros((2, 3, 5)), "weight": jnp.ones((2, 3))}
    )
  with pytest.raises(ValueError, match="task must be one of"):
    get_objective("bogus")
  with pytest.raises(ValueError, match="best_metric 'test/bogus'"):
    metric_mode("test/bogus")


def test_selection_metrics_and_directions():
  assert {name: (o.selection_metric, o.selection_mode) for name, o in OBJECTIVES.items()} == {
    "classification": ("accuracy", "max"),
    "regression": ("mse", "min"),
    "next_token": ("bits_per_byte", "min"),
    "offline_rl": ("normalized_score", "max"),  # trained on the action MSE, selected on rollouts
    "kep_svgp": ("accuracy", "max"),  # classification + the KL of KEP-SVGP layers
  }
  assert metric_mode("validation/accuracy") == "max" and metric_mode("test/bits_per_byte") == "min"
  assert metric_mode("validation/normalized_score") == "max"


def test_example_weights_for_per_sequence_terms():
  np.testing.assert_array_equal(example_weights(jnp.array([1.0, 0.0, 1.0])), [1, 0, 1])
  np.testing.assert_array_equal(example_weights(jnp.array([[0.0, 1.0], [0.0, 0.0]])), [1, 0])


# --- the late non-finite check


class FakeCheckpointer:
  directory = "/runs/x/checkpoints"

  def wait_until_finished(self):
    pass

  def latest_step(self):
    return 4

  def last_verified_step(self, before=None):
    return 4


def fake_scalars(loss: float) -> dict[str, float]:
  base = dict(task_loss_sum=loss, count=1.0, correct_sum=1.0, ksvd_loss=0.0, grad_norm=1.0, param_norm=1.0)
  return {"loss": loss, **base, "learning_rate": 1e-3}


def test_pending_scalars_check_one_step_late_and_name_the_bad_step():
  from primal_jax.training.loop import TrainingError, _PendingScalars

  pending = _PendingScalars(get_objective("classification"), FakeCheckpointer())
  pending.push(5, fake_scalars(1.0))
  assert pending.check(all_steps=False) == {}  # step 5 is still running: nothing fetched
  pending.push(6, fake_scalars(float("nan")))
  assert pending.check(all_steps=False)["loss"] == 1.0  # step 5, while 6 runs
  pending.push(7, fake_scalars(float("nan")))
  with pytest.raises(
    TrainingError,
    match=r"loss \(nan\) at step 6;.*Last good checkpoint \(its checksums verified\): step 4 in",
  ):
    pending.check(all_steps=False)


def test_pending_scalars_flush_before_a_save():
  from primal_jax.training.loop import TrainingError, _PendingScalars

  pending = _PendingScalars(get_objective("classification"), FakeCheckpointer())
  pending.push(1, fake_scalars(2.0))
  pending.push(2, fake_scalars(float("inf")))
  with pytest.raises(TrainingError, match="at step 2;"):
    pending.check(all_steps=True)  # a sync point checks the newest step too


# --- mid-epoch resume


def test_train_batches_from_a_start_skip_without_collating():
  from primal_jax.data.core import DatasetInfo, InputPipeline

  collated: list[list[int]] = []

  def collate(items):
    collated.append([position for position, _ in items])
    return {"index": np.array([position for position, _ in items])}

  info = DatasetInfo("toy", 2, 1, 3, 3, types.MappingProxyType({"train": 10}), ("a", "b"))
  source = [{"values": np.zeros((3, 1), np.float32), "label": 0}] * 10
  pipe = InputPipeline(info, {"train": source}, None, batch_size=4, eval_batch_size=4, seed=0, collate=collate)
  whole = [b["index"] for b in pipe.train_batches(1)]
  collated.clear()
  resumed = [b["index"] for b in pipe.train_batches(1, start=2)]
  assert len(whole) == 3 and len(resumed) == 1
  np.testing.assert_array_equal(resumed[0], whole[2])
  assert len(collated) == 1  # only the batch that is used was read and collated
  assert list(pipe.train_batches(1, start=3)) == []
  with pytest.raises(ValueError, match=r"start must be an integer in \[0, steps_per_epoch=3\]"):
    pipe.train_batches(1, start=4)
