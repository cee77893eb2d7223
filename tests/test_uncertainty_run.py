"""The `uncertainty` family end to end: a smoke run of the one trainer, then its uncertainty evaluation read from
the run's checkpoint (Fashion-MNIST, embedded), and the CIFAR-10 config on TFDS's fake data in the real format."""

from __future__ import annotations

import numpy as np
import pytest

from primal_jax.cli.config_lookup import load_config
from primal_jax.tasks.uncertainty import evaluation, ood
from primal_jax.training.loop import train_and_evaluate

TINY = dict(samples=2, corruption_examples=8, risk_points=5, validation_examples=64)


def _ood(channels: int, size: int) -> np.ndarray:
  digits = np.random.default_rng(0).integers(0, 17, (12, 8, 8)).astype(np.uint8)  # in place of the Debian file
  return ood.resize_digits(digits, size, channels)


def _train(arg: str, workdir, **overrides):
  config = load_config(f"uncertainty:{arg}", lock=False)
  for key, value in overrides.items():
    config[key] = value
  return train_and_evaluate(config, workdir, print_fn=lambda _: None)


@pytest.mark.slow  # ~30 s on a shared 2-core CPU: one smoke training, 10,000 test images evaluated
def test_softmax_smoke_trains_and_evaluates(tmp_path):
  summary = _train("model=softmax,smoke", tmp_path)
  record = evaluation.evaluate_run(tmp_path, evaluation.EvalSettings(**TINY), ood_images=_ood(1, 28))
  assert (
    record["kind"] == "softmax"
    and record["step"] == 4
    and set(record["methods"]) == {"msp", "temperature", "mc_dropout"}
  )
  msp = record["methods"]["msp"]
  # the evaluation's own forward (normalisation, batching) agrees with the trainer's test accuracy on all 10,000
  assert msp["test"]["acc"] == pytest.approx(summary["test_at_best_validation"]["accuracy"], abs=1e-6)
  temperature = record["methods"]["temperature"]
  assert temperature["temperature"] > 0 and temperature["test"]["acc"] == msp["test"]["acc"]  # T keeps the argmax
  assert set(msp["corruptions"]) == {"gaussian_noise", "shot_noise", "gaussian_blur", "contrast", "pixelate"}
  assert set(msp["ood"]) == {"auroc", "aupr_in", "aupr_out", "fpr95"}
  # an ensemble of one model twice is that model
  twice = evaluation.evaluate_ensemble([tmp_path, tmp_path], evaluation.EvalSettings(**TINY), ood_images=_ood(1, 28))
  assert twice["members"] == [0, 0]
  for key in ("acc", "ece", "aurc", "brier"):
    assert twice["methods"]["ensemble"]["test"][key] == pytest.approx(msp["test"][key], abs=1e-6)


@pytest.mark.slow  # ~30 s: one smoke training of the KEP-SVGP ViT
def test_kep_smoke_trains_and_evaluates_one_draw_means_agree(tmp_path):
  _train("model=kep_release,smoke", tmp_path)
  settings = evaluation.EvalSettings(**{**TINY, "samples": 1, "test_examples": 100})
  record = evaluation.evaluate_run(tmp_path, settings, ood_images=_ood(1, 28))
  assert record["kind"] == "kep_release"
  kep, logits = record["methods"]["kep"], record["methods"]["kep_logits"]
  for key in ("acc", "nll", "ece", "auroc"):  # one draw: the mean of probabilities is the softmax of the mean logits
    assert kep["test"][key] == pytest.approx(logits["test"][key], abs=1e-5)
  two = evaluation.evaluate_run(
    tmp_path, evaluation.EvalSettings(**{**TINY, "test_examples": 100}), ood_images=_ood(1, 28)
  )
  assert two["methods"]["kep"]["test"]["nll"] != two["methods"]["kep_logits"]["test"]["nll"]  # two draws: they differ


@pytest.mark.slow  # ~40 s: a CIFAR-10 smoke run (7 blocks) on TFDS's fake data
def test_cifar10_config_trains_and_evaluates_on_tfds_fake_data(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=40):  # the real cifar10 builder, random examples of its features
    config = load_config("uncertainty:model=kep_paper,cifar10,smoke", lock=False)
    config.data.data_dir = str(tmp_path / "tfds")
    assert config.data.dataset == "cifar10" and config.kl.scale == "none" and len(config.model.layers) == 7
    summary = train_and_evaluate(config, tmp_path / "run", print_fn=lambda _: None)
    assert summary["steps"] == 4 and 0 <= summary["test_at_best_validation"]["accuracy"] <= 1
    settings = evaluation.EvalSettings(**{**TINY, "corruption_examples": 4})
    record = evaluation.evaluate_run(tmp_path / "run", settings, ood_images=_ood(3, 32))
  assert record["kind"] == "kep_paper"
  assert record["methods"]["kep"]["test"]["acc"] == pytest.approx(
    summary["test_at_best_validation"]["accuracy"], abs=0.2
  )
