"""Spectrum analysis (Figure 1): singular values, the induced kernel against float64 NumPy, the CLI on a real run."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import numpy_reference as ref
import pytest
from attention_utils import normal, padding_mask, random_params

from primal_jax.analysis.spectrum import (
  LayerSpectrum,
  attention_matrices,
  components_for,
  explained_variance,
  normalized_decay,
  singular_values,
)
from primal_jax.attention import PrimalAttention, SoftmaxAttention
from primal_jax.attention.shell import SPECTRUM_COLLECTION
from primal_jax.feature_maps import random_feature_projection

# Compares with float64 NumPy or golden numbers at float32 tolerances: full float32 matmuls on every platform.
pytestmark = pytest.mark.matmul_precision("highest")

ROOT = Path(__file__).resolve().parents[1]
B, N, D, H = 3, 10, 8, 2  # p = 4 per head


def test_rank_r_matrix_spectrum_recovers_r():
  rng = np.random.default_rng(0)
  r = 3
  lengths = [12, 8, 5]
  valid = np.arange(12)[None, :] < np.array(lengths)[:, None]  # [B, N]
  matrices = rng.standard_normal((3, 2, 12, 12))  # padded rows/columns hold junk that must not count
  for b, length in enumerate(lengths):
    u, v = rng.standard_normal((2, length, r)), rng.standard_normal((2, r, length))
    matrices[b, :, :length, :length] = u @ v
  sv = singular_values(matrices, valid)
  assert sv.shape == (3, 2, 12)
  assert np.all(sv[..., r:] <= 1e-10 * sv[..., :1]) and np.all(sv[..., r - 1] > 1e-3 * sv[..., 0])
  curves = explained_variance(sv)
  np.testing.assert_allclose(curves[..., r - 1 :], 1.0, atol=1e-12)
  assert np.all(curves[..., r - 2] < 1.0 - 1e-6)
  assert np.all(components_for(curves, 1.0) == r)
  decay = normalized_decay(sv)
  assert np.all(decay[..., 0] == 1.0) and np.all(np.diff(decay, axis=-1) <= 1e-12)

  summary = LayerSpectrum("layer", "primal", sv, valid.sum(-1)).summary()
  assert summary["stats"]["components_99"]["mean"] <= r and summary["num_examples"] == 3
  assert len(summary["explained_variance"]["mean"]) == 12
  # A zero matrix has no energy: its curve is flat at 1 and its decay 0, never NaN.
  assert np.all(explained_variance(np.zeros(4)) == 1.0) and np.all(normalized_decay(np.zeros(4)) == 0.0)


def _numpy_kernel(params, x, mask, *, num_samples, sampling, feature_map, causal):
  """K = phi_q F_X^T F_X phi_k^T per example and head in float64, from SPEC 1-4 (D^-1/2 on both maps)."""
  p64 = ref.to_f64(params)
  p = D // H
  projection = np.asarray(random_feature_projection(jax.random.key(0), p, p), np.float64)
  aware = sampling == "padding_aware"
  out = np.zeros((B, H, N, N))
  for b in range(B):
    valid = mask[b].astype(np.float64) if aware else None
    idx = ref.padding_aware(mask, num_samples)[b] if aware else ref.torch_int_linspace(N, num_samples or 1)
    for h in range(H):
      q = x[b] @ p64["query"]["kernel"][:, h] + p64["query"]["bias"][h]
      k = x[b] @ p64["key"]["kernel"][:, h] + p64["key"]["bias"][h]
      if causal:
        q, k = ref.running_mean(q, valid), ref.running_mean(k, valid)
      if feature_map == "cosine":
        phi_q, phi_k = ref.cosine(q), ref.cosine(k)
      else:
        phi_q, phi_k = ref.softmax_features(q, projection), ref.softmax_features(k, projection)
        d = ref.softmax_normalizer(phi_q, phi_k, valid, causal)
        phi_q, phi_k = phi_q / np.sqrt(d)[:, None], phi_k / np.sqrt(d)[:, None]
      f = np.eye(p) if num_samples is None else np.asarray(x[b, idx, h * p : (h + 1) * p], np.float64)
      out[b, h] = phi_q @ f.T @ f @ phi_k.T
  return out


@pytest.mark.parametrize(
  "kwargs",
  [
    dict(num_samples=6),
    dict(data_dependent=False),
    dict(num_samples=6, sampling="padding_aware", feature_map="softmax_kernel"),
    dict(data_dependent=False, causal=True),
  ],
  ids=["data_dependent", "data_independent", "padding_aware_softmax_kernel", "causal"],
)
def test_induced_kernel_matches_float64_numpy(kwargs):
  module = PrimalAttention(num_heads=H, low_rank=3, **kwargs)
  x, mask = normal(1, (B, N, D)), padding_mask(2, B, N)
  params = random_params(module, x, mask=mask)
  (layer,) = attention_matrices(module, {"params": params}, x, mask=mask)
  assert layer.kind == "primal" and layer.matrices.shape == (B, H, N, N)
  np.testing.assert_array_equal(layer.valid, mask)
  expected = _numpy_kernel(
    params,
    np.asarray(x, np.float64),
    mask,
    num_samples=kwargs.get("num_samples"),
    sampling=kwargs.get("sampling", "release"),
    feature_map=kwargs.get("feature_map", "cosine"),
    causal=kwargs.get("causal", False),
  )
  ref.assert_rel_close(layer.matrices, expected, tol=1e-5, what="induced kernel")

  # Sowing the matrix leaves the layer's output unchanged, and nothing is sown unless asked for.
  plain, state = module.apply({"params": params}, x, mask=mask, mutable=["intermediates"])
  sowing, _ = module.apply({"params": params}, x, mask=mask, mutable=[SPECTRUM_COLLECTION])
  np.testing.assert_array_equal(np.asarray(plain), np.asarray(sowing))
  assert SPECTRUM_COLLECTION not in state


def test_softmax_matrix_is_the_attention_over_real_keys():
  module = SoftmaxAttention(num_heads=H)
  x, mask = normal(3, (B, N, D)), padding_mask(4, B, N)
  params = random_params(module, x, mask=mask)
  (layer,) = attention_matrices(module, {"params": params}, x, mask=mask)
  assert layer.kind == "softmax"
  a = np.asarray(layer.matrices, np.float64)
  np.testing.assert_allclose(a.sum(-1), 1.0, atol=1e-6)
  np.testing.assert_allclose(np.where(mask[:, None, None, :], 0.0, a), 0.0, atol=1e-30)

  p64, x64 = ref.to_f64(params), np.asarray(x, np.float64)
  expected = np.zeros_like(a)
  for b in range(B):
    real = np.flatnonzero(mask[b])
    for h in range(H):
      q = x64[b] @ p64["query"]["kernel"][:, h] + p64["query"]["bias"][h]
      k = x64[b, real] @ p64["key"]["kernel"][:, h] + p64["key"]["bias"][h]
      scores = q @ k.T / np.sqrt(D // H)
      e = np.exp(scores - scores.max(-1, keepdims=True))
      expected[b, h][:, real] = e / e.sum(-1, keepdims=True)
  ref.assert_rel_close(a, expected, tol=1e-5, what="softmax attention")
  _, state = module.apply({"params": params}, x, mask=mask, sow_weights=True, mutable=["intermediates"])
  np.testing.assert_allclose(a, state["intermediates"]["attention_weights"][0], atol=1e-6)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """A 2-step Primal.+Trans. smoke run on real JapaneseVowels: layer 0 softmax, layer 1 Primal."""
  from primal_jax.cli.config_lookup import load_config
  from primal_jax.tasks.uea.aeon_wheel import DatasetFetchError
  from primal_jax.tasks.uea.tfds_dataset import prepare_uea
  from primal_jax.training.loop import train_and_evaluate

  data_dir = tmp_path_factory.mktemp("tfds")
  try:
    prepare_uea("JapaneseVowels", "aeon", data_dir)
  except DatasetFetchError as err:  # no cached copy and no route to PyPI
    pytest.skip(f"JapaneseVowels unavailable: {err}")
  config = load_config("uea:smoke,model=primal_plus", lock=False)
  config.total_steps = 2
  config.data.data_dir = str(data_dir)
  workdir = tmp_path_factory.mktemp("run")
  train_and_evaluate(config, workdir, print_fn=lambda _: None)
  return workdir


def test_cli_writes_figures_and_monotone_curves(tiny_run, tmp_path, capsys):
  from experiments.spectrum import main

  out = tmp_path / "out"
  main(["spectrum", f"--workdir={tiny_run}", f"--out={out}", "--num_examples=12", "--chunk_size=8"])
  for name in ("explained_variance.png", "normalized_decay.png", "spectrum.json", "singular_values.npz"):
    assert (out / name).stat().st_size > 0, name
  result = json.loads((out / "spectrum.json").read_text())
  (run,) = result["runs"]
  assert run["step"] == 2 and run["label"].startswith("primal_plus")
  assert [layer["kind"] for layer in run["layers"]] == ["softmax", "primal"]
  for layer in run["layers"]:
    assert layer["num_examples"] == 12
    curve = np.asarray(layer["explained_variance"]["mean"])
    assert np.all(np.diff(curve) >= -1e-12) and curve.min() >= 0 and abs(curve[-1] - 1) < 1e-9
    decay = np.asarray(layer["normalized_decay"]["mean"])
    assert np.all(np.diff(decay) <= 1e-12) and decay[0] == 1.0 and decay.min() >= 0
    assert 1 <= layer["stats"]["components_90"]["mean"] <= layer["stats"]["components_99"]["mean"]
    assert layer["stats"]["components_99"]["mean"] <= layer["length"]["max"]
  with np.load(out / "singular_values.npz") as arrays:
    assert sorted(arrays) == ["0/encoder/block_0/attention", "0/encoder/block_1/attention"]
    assert arrays["0/encoder/block_1/attention"].shape[:2] == (12, 2)  # smoke model: 2 heads
  table = capsys.readouterr().out
  assert "k90" in table and "block_1" in table and "primal" in table


def test_cli_requires_workdir_and_out(capsys):
  from experiments.spectrum import main

  with pytest.raises(SystemExit) as exit_info:
    main(["spectrum", "--out=/nonexistent"])
  assert exit_info.value.code == 2 and "--workdir" in capsys.readouterr().err
