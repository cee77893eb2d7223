"""Mixup / CutMix / label smoothing (primal_jax.tasks.vision.label_mixing) and the soft-label classification loss.

Checked against direct float64 NumPy computations of timm's batch-mode `Mixup`: the mixed pixels, the
CutMix box and its corrected lam, smoothed targets that sum to one, padded rows left alone, determinism by
(seed, epoch, batch) including a resumed epoch, identity when switched off, and the objective's soft
cross-entropy (equal to the integer-label loss on one-hot targets).
"""

from __future__ import annotations

import types

import jax.numpy as jnp
import numpy as np
import pytest

from primal_jax.data.core import InputPipeline
from primal_jax.errors import ConfigError
from primal_jax.tasks.vision.input_pipeline import ImageArrays, ImageCollate
from primal_jax.tasks.vision.label_mixing import LabelMixing, label_mixing
from primal_jax.training.objectives import Classification


def _batch(b=6, shape=(8, 8, 2), classes=5, seed=0, pad=0):
  rng = np.random.default_rng(seed)
  weight = np.ones(b, np.float32)
  weight[b - pad :] = 0.0
  return {
    "inputs": rng.normal(size=(b, *shape)).astype(np.float32),
    "label": rng.integers(0, classes, b).astype(np.int32),
    "weight": weight,
    "index": np.arange(b),
  }


def _one_hot_smoothed(label, classes, smoothing):
  out = np.full((len(label), classes), smoothing / classes)
  out[np.arange(len(label)), label] += 1.0 - smoothing
  return out


def test_off_is_none_and_smoothing_alone():
  assert label_mixing(None, 10) is None and label_mixing({}, 10) is None
  assert label_mixing({"mixup_alpha": 0.0, "cutmix_alpha": 0.0, "label_smoothing": 0.0}, 10) is None
  assert label_mixing({"mixup_alpha": 0.8, "prob": 0.0}, 10) is None
  smooth = label_mixing({"label_smoothing": 0.1}, 5)
  batch = _batch()
  out = smooth(batch, np.random.default_rng(0))
  np.testing.assert_array_equal(out["inputs"], batch["inputs"])  # nothing mixed
  np.testing.assert_allclose(out["label_probs"], _one_hot_smoothed(batch["label"], 5, 0.1), rtol=0, atol=1e-7)


@pytest.mark.parametrize(
  "options",
  [{"mixup_alpha": -1.0}, {"prob": 1.5}, {"prob": float("nan")}, {"prob": "often"}, {"label_smoothing": 1.0},
   {"alpha": 1}],
)  # fmt: skip
def test_bad_options_name_the_key(options):
  """A ConfigError (the training binary prints it as one line; issue 26.10: data.mix.prob=1.5 was a traceback)."""
  with pytest.raises(ConfigError, match=r"data\.mix\.?\w* "):
    label_mixing(options, 10)


def test_mixup_matches_numpy():
  mix = LabelMixing(num_classes=5, mixup_alpha=0.8, label_smoothing=0.1)
  batch = _batch()
  kind, lam, _ = mix.draw(np.random.default_rng(7), 8, 8)
  out = mix(batch, np.random.default_rng(7))
  assert kind == "mixup" and 0.0 < lam < 1.0
  x = batch["inputs"].astype(np.float64)
  np.testing.assert_allclose(out["inputs"], lam * x + (1 - lam) * x[::-1], rtol=0, atol=1e-6)
  own, other = _one_hot_smoothed(batch["label"], 5, 0.1), _one_hot_smoothed(batch["label"][::-1], 5, 0.1)
  np.testing.assert_allclose(out["label_probs"], lam * own + (1 - lam) * other, rtol=0, atol=1e-6)
  np.testing.assert_allclose(out["label_probs"].sum(-1), 1.0, rtol=0, atol=1e-6)
  np.testing.assert_array_equal(out["label"], batch["label"])  # accuracy still counts each row's own class


def test_cutmix_box_and_corrected_lam():
  mix = LabelMixing(num_classes=5, cutmix_alpha=1.0)
  batch = _batch(shape=(16, 12, 1))
  for seed in range(20):
    kind, lam, (top, bottom, left, right) = mix.draw(np.random.default_rng(seed), 16, 12)
    out = mix(batch, np.random.default_rng(seed))
    assert kind == "cutmix"
    assert lam == pytest.approx(1.0 - (bottom - top) * (right - left) / (16 * 12), abs=1e-12)
    inside = np.zeros((16, 12), bool)
    inside[top:bottom, left:right] = True
    x = batch["inputs"]
    np.testing.assert_array_equal(out["inputs"][:, inside], x[::-1][:, inside])
    np.testing.assert_array_equal(out["inputs"][:, ~inside], x[:, ~inside])
    expected = lam * np.eye(5)[batch["label"]] + (1 - lam) * np.eye(5)[batch["label"][::-1]]
    np.testing.assert_allclose(out["label_probs"], expected, rtol=0, atol=1e-6)


def test_switch_prob_picks_both():
  mix = LabelMixing(num_classes=3, mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5)
  kinds = [mix.draw(np.random.default_rng(s), 8, 8)[0] for s in range(400)]
  assert 160 <= kinds.count("cutmix") <= 240 and kinds.count("mixup") == 400 - kinds.count("cutmix")


def test_padded_rows_never_mix():
  mix = LabelMixing(num_classes=5, mixup_alpha=1.0)
  batch = _batch(b=7, pad=2)
  out = mix(batch, np.random.default_rng(3))
  _, lam, _ = mix.draw(np.random.default_rng(3), 8, 8)
  x = batch["inputs"].astype(np.float64)
  real = x[:5]
  np.testing.assert_allclose(out["inputs"][:5], lam * real + (1 - lam) * real[::-1], rtol=0, atol=1e-6)
  np.testing.assert_array_equal(out["inputs"][5:], batch["inputs"][5:])


def _pipeline(mix):
  rng = np.random.default_rng(0)
  source = ImageArrays(rng.integers(0, 256, (24, 6, 6, 1), dtype=np.uint8), rng.integers(0, 4, 24))
  info = types.SimpleNamespace(seq_len=36, num_features=1)  # only what InputPipeline reads
  return InputPipeline(
    info=info, sources={"train": source, "test": source}, transform=None, batch_size=6, eval_batch_size=6, seed=5,
    collate=ImageCollate((6, 6, 1), (0.5,), (0.5,)), batch_mix=mix,
  )  # fmt: skip


def test_pipeline_mixes_train_batches_deterministically_and_resumes():
  mix = LabelMixing(num_classes=4, mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1)
  first, again = list(_pipeline(mix).train_batches(1)), list(_pipeline(mix).train_batches(1))
  plain = list(_pipeline(None).train_batches(1))
  assert all("label_probs" in b for b in first) and all("label_probs" not in b for b in plain)
  for a, b in zip(first, again, strict=True):
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
  resumed = list(_pipeline(mix).train_batches(1, start=2))
  for a, b in zip(first[2:], resumed, strict=True):
    np.testing.assert_array_equal(a["inputs"], b["inputs"])  # batch i is mixed by (seed, epoch, i)
  other_epoch = list(_pipeline(mix).train_batches(2))
  assert any(not np.allclose(a["label_probs"], b["label_probs"]) for a, b in zip(first, other_epoch, strict=True))
  assert all("label_probs" not in b for b in _pipeline(mix).eval_batches("test"))  # evaluation is never mixed


def test_soft_cross_entropy_objective():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(4, 5))
  label = np.array([0, 3, 4, 1])
  weight = np.array([1.0, 1.0, 0.5, 0.0])
  objective = Classification()
  hard = objective.sums(jnp.asarray(logits), {"label": jnp.asarray(label), "weight": jnp.asarray(weight)})
  one_hot = {"label": jnp.asarray(label), "weight": jnp.asarray(weight), "label_probs": jnp.eye(5)[label]}
  assert float(objective.sums(jnp.asarray(logits), one_hot).loss) == pytest.approx(float(hard.loss), rel=1e-6)
  probs = rng.dirichlet(np.ones(5), 4)
  log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  expected = float(np.sum(weight * -(probs * log_softmax).sum(-1)))
  soft = objective.sums(
    jnp.asarray(logits), {"label": jnp.asarray(label), "weight": jnp.asarray(weight), "label_probs": jnp.asarray(probs)}
  )
  assert float(soft.loss) == pytest.approx(expected, rel=1e-5)
  with pytest.raises(ValueError, match="label_probs"):
    objective.sums(jnp.asarray(logits), {**one_hot, "label_probs": jnp.ones((4, 3))})
