"""The `uncertainty` family (issue 56 item 4): corruptions, the OOD digits, temperature scaling, the evaluation
against `primal_jax.analysis.uncertainty` and independent NumPy references, its configs and its sweep."""

from __future__ import annotations

import numpy as np
import pytest

from primal_jax.analysis import uncertainty as metrics
from primal_jax.cli.config_lookup import load_config
from primal_jax.data.cache import DatasetFetchError, sha256_bytes
from primal_jax.tasks.uncertainty import corruptions, evaluation, ood
from primal_jax.tasks.uncertainty.calibration import fit_temperature, scaled_nll


def _images(n=6, size=12, channels=1, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (n, size, size, channels), dtype=np.uint8)


# --- corruptions


@pytest.mark.parametrize("kind", corruptions.CORRUPTIONS)
def test_corruption_shape_range_determinism_and_severity_monotone(kind):
  images = _images(8, 16, 1)
  distances = []
  for severity in corruptions.SEVERITIES:
    out = corruptions.corrupt(images, kind, severity, seed=3)
    assert out.shape == images.shape and out.dtype == np.uint8
    np.testing.assert_array_equal(out, corruptions.corrupt(images, kind, severity, seed=3))  # seeded
    distances.append(float(np.mean((out.astype(float) - images) ** 2)))
  assert all(d > 0 for d in distances)
  assert np.all(np.diff(distances) > 0), distances  # stronger severity, further away
  if kind in ("gaussian_noise", "shot_noise"):  # another seed, other noise
    assert not np.array_equal(
      corruptions.corrupt(images, kind, 3, seed=3), corruptions.corrupt(images, kind, 3, seed=4)
    )


def test_corruptions_against_independent_references():
  x = _images(3, 10, 3, seed=1)
  f = x.astype(np.float64) / 255
  # contrast: (x - mean) c + mean per image and channel
  mean = f.mean(axis=(1, 2), keepdims=True)
  expected = np.round(np.clip((f - mean) * 0.2 + mean, 0, 1) * 255).astype(np.uint8)
  np.testing.assert_array_equal(corruptions.corrupt(x, "contrast", 3), expected)
  # blur: a constant image stays constant; the taps are a normalised Gaussian
  flat = np.full((1, 9, 9, 1), 77, np.uint8)
  np.testing.assert_array_equal(corruptions.corrupt(flat, "gaussian_blur", 5), flat)
  taps = corruptions.gaussian_kernel(1.0)
  assert taps.size == 7 and abs(taps.sum() - 1) < 1e-12 and taps[3] == taps.max()
  # blur of an impulse = outer product of the taps (away from the borders)
  impulse = np.zeros((1, 15, 15, 1), np.uint8)
  impulse[0, 7, 7, 0] = 255
  blurred = corruptions._gaussian_blur(impulse.astype(float) / 255, 1.0, None)[0, :, :, 0]
  np.testing.assert_allclose(blurred[4:11, 4:11], np.outer(taps, taps), atol=1e-12)
  # gaussian noise: the added noise has the severity's sigma
  grey = np.full((200, 16, 16, 1), 128, np.uint8)
  noise = corruptions.corrupt(grey, "gaussian_noise", 1).astype(float) / 255 - 128 / 255
  assert abs(noise.std() - 0.08) < 0.003
  # pixelate: blocks of equal pixels
  p = corruptions.corrupt(_images(1, 20, 1), "pixelate", 5)[0, :, :, 0]  # 20 -> 5 pixels a side: 4 x 4 blocks
  assert all(np.all(block == block.flat[0]) for block in p.reshape(5, 4, 5, 4).transpose(0, 2, 1, 3).reshape(25, 16))


def test_corruption_refusals():
  with pytest.raises(ValueError, match="kind must be one of"):
    corruptions.corrupt(_images(), "fog", 1)
  with pytest.raises(ValueError, match="severity must be one of"):
    corruptions.corrupt(_images(), "contrast", 6)
  with pytest.raises(ValueError, match="uint8"):
    corruptions.corrupt(_images().astype(np.float32), "contrast", 1)


# --- the OOD digits


def test_digits_parse_and_resize():
  rows = [",".join(map(str, [*(np.arange(64) % 17), 3])), ",".join(map(str, [*([16] * 64), 7]))]
  images, labels = ood.parse_digits("\n".join(rows))
  assert images.shape == (2, 8, 8) and labels.tolist() == [3, 7] and images[0, 0, 1] == 1
  out = ood.resize_digits(images, 28, 3)
  assert out.shape == (2, 28, 28, 3) and out.dtype == np.uint8
  assert np.all(out[1] == 255) and np.array_equal(out[..., 0], out[..., 2])  # 16 -> 255; grey repeated
  with pytest.raises(ValueError, match="64 pixels in 0-16"):
    ood.parse_digits("1,2,3")


def test_ood_digits_from_debian(tmp_path):
  """The pinned file itself (skipped where neither apt nor a Debian mirror is reachable)."""
  try:
    images = ood.ood_digits(28, 1, cache_dir=tmp_path)
  except DatasetFetchError as err:
    pytest.skip(f"Debian's python3-sklearn is not reachable here: {err}")
  assert images.shape == (ood.NUM_DIGITS, 28, 28, 1) and images.dtype == np.uint8
  assert images.min() == 0 and images.max() == 255
  raw = (tmp_path / "sklearn_digits" / ood.DIGITS_FILE).read_bytes()
  assert sha256_bytes(raw) == ood.DIGITS_FILES[ood.DIGITS_FILE]
  _, labels = ood.parse_digits(raw.decode())
  assert np.bincount(labels).tolist()[:3] == [178, 182, 177]  # load_digits' class counts


# --- temperature scaling


def test_temperature_scaling_recovers_a_known_temperature():
  rng = np.random.default_rng(0)
  base = rng.normal(0, 3, (20_000, 5))
  labels = np.array([rng.choice(5, p=p) for p in evaluation.softmax(base)])  # labels drawn from softmax(base)
  fitted = fit_temperature(base * 2.5, labels)  # logits 2.5x too sharp: T = 2.5 calibrates them
  assert abs(fitted - 2.5) < 0.1, fitted
  grid = np.linspace(1.5, 3.5, 201)
  assert abs(fitted - grid[np.argmin([scaled_nll(base * 2.5, labels, t) for t in grid])]) < 0.02
  with pytest.raises(ValueError, match="finite"):
    fit_temperature(np.full((2, 3), np.nan), np.array([0, 1]))


# --- the evaluation


def _predictions(n=400, classes=4, seed=0):
  rng = np.random.default_rng(seed)
  logits = rng.normal(0, 2, (n, classes))
  labels = np.where(rng.random(n) < 0.7, logits.argmax(1), rng.integers(0, classes, n))
  return evaluation.softmax(logits), labels


def test_set_metrics_match_the_library_and_a_float64_reference():
  probs, labels = _predictions()
  got = evaluation.set_metrics(probs, labels)
  assert got == metrics.uncertainty_metrics(probs, labels, logits=np.log(probs))
  assert got["nll"] == pytest.approx(-np.mean(np.log(probs[np.arange(len(labels)), labels])), rel=1e-6)
  assert got["acc"] == np.mean(probs.argmax(1) == labels)
  assert got["brier"] == pytest.approx(np.mean(np.sum((probs - np.eye(4)[labels]) ** 2, 1)), rel=1e-12)


def test_ood_metrics_on_known_scores():
  inside, outside = np.array([0.9, 0.8, 0.7, 0.6]), np.array([0.65, 0.5, 0.4, 0.3])
  got = evaluation.ood_metrics(inside, outside)
  pairs = np.mean([[float(a > b) for b in outside] for a in inside])  # AUROC = P(in > out), no ties
  assert got["auroc"] == pytest.approx(pairs) == pytest.approx(15 / 16)
  assert got["fpr95"] == 0.25  # accepting every in-distribution image (TPR 1 >= 0.95) accepts 0.65
  assert evaluation.ood_metrics(inside, outside - 1)["auroc"] == 1.0


def test_evaluate_model_on_a_known_predictor():
  probs, labels = _predictions(60, 3)
  images = np.arange(60, dtype=np.uint8).reshape(60, 1, 1, 1)  # image i -> row i of probs
  ood_images = np.full((10, 1, 1, 1), 200, np.uint8)

  def predict(x):
    x = x[:, 0, 0, 0].astype(int)
    return np.where((x < 60)[:, None], probs[np.minimum(x, 59)], np.full((1, 3), 1 / 3))

  sets = evaluation.EvalSets((images, labels), {("contrast", 1): (images[:20], labels[:20])}, ood_images)
  settings = evaluation.EvalSettings(risk_points=4)
  out = evaluation.evaluate_model(predict, sets, settings)
  assert {k: out["test"][k] for k in evaluation.set_metrics(probs, labels)} == evaluation.set_metrics(probs, labels)
  assert out["corruptions"]["contrast"]["1"] == evaluation.set_metrics(probs[:20], labels[:20])
  assert out["ood"] == evaluation.ood_metrics(probs.max(1), np.full(10, 1 / 3))
  risk = metrics.risk_curve(*metrics.confidence_and_correct(probs, labels))
  assert out["test"]["risk_coverage"]["risk"] == [risk[14], risk[29], risk[44], risk[59]]
  assert sum(out["test"]["reliability"]["count"]) == 60
  no_ood = evaluation.evaluate_model(predict, evaluation.EvalSets((images, labels), {}, None), settings)
  assert "ood" not in no_ood and no_ood["test"] == out["test"]  # settings.ood=False: nothing fetched, no OOD


def test_eval_settings_refusals():
  with pytest.raises(ValueError, match="EvalSettings.samples must be an integer >= 1"):
    evaluation.EvalSettings(samples=0)


# --- configs and the sweep


@pytest.mark.parametrize(
  "arg, layers, task",
  [
    ("model=softmax", ("softmax",) * 3, None),
    ("model=primal_plus", ("softmax", "softmax", "primal"), None),
    ("model=kep_paper", ("softmax", "softmax", "kep_svgp"), "kep_svgp"),
    ("model=kep_release,smoke", ("softmax", "softmax", "kep_svgp"), "kep_svgp"),
    ("model=kep_paper,cifar10", ("softmax",) * 6 + ("kep_svgp",), "kep_svgp"),
  ],
)
def test_configs(arg, layers, task):
  from primal_jax.training.config_schema import problems

  config = load_config(f"uncertainty:{arg}")
  assert tuple(config.model.layers) == layers and config.get("task") == task and not problems(config)
  assert evaluation.model_kind(config) == arg.split(",")[0].split("=")[1]
  if "cifar10" in arg:
    assert (config.data.dataset, config.model.dim, config.model.num_heads, config.kl.scale) == (
      "cifar10",
      384,
      12,
      "none",
    )
  with pytest.raises(ValueError, match="model must be one of"):
    load_config("uncertainty:model=deit")


def test_sweep_builds_with_disjoint_ensembles():
  from experiments.engine.spec import load_sweep, plan
  from experiments.sweeps.uncertainty import ensemble_seeds

  sweep = load_sweep("experiments/sweeps/uncertainty.py")
  assert len(plan(sweep.runs)) == 4 * 3 + 3  # four models x 3 seeds, 3 extra ensemble members (M = 2)
  assert [ensemble_seeds(s, 3, 3) for s in range(3)] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]  # disjoint
  assert [(r.cell.table, r.seed) for r in sweep.runs[:6]] == [("models", 0)] * 4 + [
    ("ensemble_members", 3),
    ("models", 1),
  ]
  assert len(plan(load_sweep("experiments/sweeps/uncertainty.py:members=3").runs)) == 4 * 3 + 6
  assert set(sweep.after_run) == {"models", "ensemble_members"}
