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


def test_singular_values_match_the_zero_padded_full_svd():
  """The per-example real sub-matrix SVD equals float64 SVD of the whole matrix with padding zeroed (1e-10)."""
  rng = np.random.default_rng(1)
  valid = rng.random((4, 9)) < 0.6  # not prefixes: real positions anywhere
  valid[0] = True
  valid[1] = False  # an example with no real position: all zeros, never NaN
  square = rng.standard_normal((4, 3, 9, 9))
  zeroed = square * valid[:, None, :, None] * valid[:, None, None, :]
  np.testing.assert_allclose(singular_values(square, valid), np.linalg.svd(zeroed, compute_uv=False), atol=1e-10)
  wide = rng.standard_normal((4, 3, 9, 5))  # cross attention: only rows are masked
  np.testing.assert_allclose(
    singular_values(wide, valid), np.linalg.svd(wide * valid[:, None, :, None], compute_uv=False), atol=1e-10
  )
  with pytest.raises(ValueError, match="valid must be"):
    singular_values(square, valid[:, :5])


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
  # Each run records its seed and arm; one arm of one model: a summary with no std and nothing to pair.
  assert run["seed"] == 0 and run["arm"] == run["label"]
  arms = result["arms"]
  assert list(arms["summary"]) == [run["label"]] and arms["paired"] == [] and arms["references"] == [run["label"]]
  block = arms["summary"][run["label"]]["block_1"]
  assert block["n"] == 1 and block["seeds"] == [0] and block["components_90"]["std"] is None
  assert block["components_90"]["mean"] == run["layers"][1]["stats"]["components_90"]["mean"]


def _reseeded(run: Path, seed: int, to: Path) -> Path:
  """A copy of `run` whose config names another seed (the same weights: a stand-in for a model of that seed)."""
  import shutil

  shutil.copytree(run, to)
  config = json.loads((to / "config.json").read_text())
  config["seed"] = seed
  (to / "config.json").write_text(json.dumps(config))
  return to


def test_cli_pairs_arms_of_several_models_by_seed(tiny_run, tmp_path):
  from experiments.spectrum import main

  other = _reseeded(tiny_run, 1, tmp_path / "seed1")
  out = tmp_path / "out"
  runs = [f"--workdir={tiny_run}", f"--workdir={other}"]
  flags = ["--num_examples=4", "--chunk_size=4", "--reference=b", f"--out={out}"]
  main(["spectrum", *flags, *runs, "--label=a", "--label=a", *runs[::-1], "--label=b", "--label=b"])
  record = json.loads((out / "spectrum.json").read_text())
  assert [(r["arm"], r["seed"]) for r in record["runs"]] == [("a", 0), ("a", 1), ("b", 1), ("b", 0)]
  summary = record["arms"]["summary"]
  assert summary["a"]["block_0"]["seeds"] == [0, 1] and summary["b"]["block_1"]["n"] == 2
  # The same weights under both seeds: std over models 0, and every paired difference exactly 0 (no finding).
  assert summary["a"]["block_1"]["components_99"]["std"] == 0.0
  paired = record["arms"]["paired"]
  assert {(p["arm"], p["reference"], p["layer"]) for p in paired} == {("a", "b", "block_0"), ("a", "b", "block_1")}
  assert all(p["n"] == 2 and p["mean"] == 0.0 and p["verdict"] == "unresolved" for p in paired)
  assert (out / "explained_variance.png").stat().st_size > 0


def test_cli_refuses_arms_it_cannot_pair_before_computing(tiny_run, tmp_path, capsys):
  from experiments.spectrum import main

  other = _reseeded(tiny_run, 1, tmp_path / "seed1")
  out = tmp_path / "out"
  cases = [
    (
      [f"--workdir={tiny_run}", "--label=a", f"--workdir={other}", "--label=b", "--reference=a"],
      "FATAL --label=a: 1 model(s)",
    ),
    (
      [f"--workdir={tiny_run}", "--label=a", f"--workdir={other}", "--label=a", "--reference=z"],
      "FATAL --reference=z: no",
    ),
    ([f"--workdir={tiny_run}", "--reference=a", "--nopaired"], "FATAL --reference asks for pairing"),
  ]
  for args, message in cases:
    with pytest.raises(SystemExit) as exit_info:
      main(["spectrum", f"--out={out}", *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith(message) and err.count("\n") == 1, err
  assert not out.exists()  # refused before anything was computed or written


def test_one_model_per_arm_without_a_reference_pairs_nothing(tiny_run, tmp_path):
  from experiments.spectrum import analyze

  other = _reseeded(tiny_run, 1, tmp_path / "seed1")
  result = analyze([tiny_run, other], tmp_path / "out", labels=["a", "b"], num_examples=4, print_fn=lambda _: None)
  assert result["arms"]["paired"] is None and [r["seed"] for r in result["runs"]] == [0, 1]
  origin = result["provenance"]  # what produced the record
  assert origin["commit"] and origin["argv"] and origin["devices"]["platform"] == "cpu" and origin["versions"]["jax"]


def test_cli_requires_workdir_and_out(capsys):
  from experiments.spectrum import main

  with pytest.raises(SystemExit) as exit_info:
    main(["spectrum", "--out=/nonexistent"])
  assert exit_info.value.code == 2 and "--workdir" in capsys.readouterr().err


# --- Figure 1 over several models per arm (experiments.spectrum_arms) on hand-made runs of known values

T_975_2 = 4.302652729911275  # Student-t 97.5% quantile, 2 degrees of freedom (3 pairs), from tables


def _layer(block: int, kind: str, k90: float, k99: float) -> dict:
  curve = [0.6, 0.9, 1.0] if block == 0 else [0.8, 1.0, 1.0]
  return {
    "name": f"encoder/block_{block}/attention",
    "kind": kind,
    "length": {"mean": 6.0, "max": 8},
    "explained_variance": {"mean": curve, "std": [0.1, 0.05, 0.0]},
    "normalized_decay": {"mean": [1.0, 0.5, 0.1], "std": [0.0, 0.1, 0.05]},
    "stats": {"components_90": {"mean": k90, "std": 0.5}, "components_99": {"mean": k99, "std": 0.5}},
  }


def _run(arm: str, seed, k90: tuple, k99: tuple, kinds=("softmax", "softmax")) -> dict:
  """A run of spectrum.json with two layers (blocks 0 and 1): each model's mean over examples is k90[i], k99[i]."""
  layers = [_layer(i, kind, a, b) for i, (kind, a, b) in enumerate(zip(kinds, k90, k99, strict=True))]
  return {"label": arm, "arm": arm, "seed": seed, "step": 10, "workdir": f"/runs/{arm}/{seed}", "layers": layers}


def _hand_runs() -> list[dict]:
  """softmax (seeds 0, 1, 2) and eta=0.5 (the same seeds, listed out of order, so pairing by position would err).

  block_0, eta=0.5 - softmax by seed: 90%: 2-4, 4-5, 3-6 = -2, -1, -3; 99%: 7-10, 9.5-12, 11-14 = -3, -2.5, -3.
  """
  primal = ("softmax", "primal")
  return [
    _run("softmax", 0, (4, 1), (10, 2)),
    _run("softmax", 1, (5, 1), (12, 2)),
    _run("softmax", 2, (6, 1), (14, 2)),
    _run("eta=0.5", 2, (3, 1), (11, 2), primal),
    _run("eta=0.5", 0, (2, 1), (7, 2), primal),
    _run("eta=0.5", 1, (4, 1), (9.5, 2), primal),
  ]


def test_arm_summary_is_mean_and_sample_std_over_models():
  from experiments.spectrum_arms import summarize_arms

  arms = summarize_arms(_hand_runs())
  assert list(arms) == ["softmax", "eta=0.5"] and list(arms["softmax"]) == ["block_0", "block_1"]
  softmax, eta = arms["softmax"]["block_0"], arms["eta=0.5"]["block_0"]
  assert softmax["n"] == 3 and softmax["seeds"] == [0, 1, 2] and eta["seeds"] == [2, 0, 1]
  assert eta["kind"] == "softmax" and arms["eta=0.5"]["block_1"]["kind"] == "primal"
  # By hand: mean(4, 5, 6) = 5, std = sqrt((1 + 0 + 1) / 2) = 1; mean(10, 12, 14) = 12, std = sqrt(8 / 2) = 2.
  tol = dict(rtol=0, atol=1e-12)
  np.testing.assert_allclose([softmax["components_90"]["mean"], softmax["components_90"]["std"]], [5, 1], **tol)
  np.testing.assert_allclose([softmax["components_99"]["mean"], softmax["components_99"]["std"]], [12, 2], **tol)
  # mean(3, 2, 4) = 3, std 1; mean(11, 7, 9.5) = 9.1666..., std = sqrt((1.8333^2 + 2.1667^2 + 0.3333^2) / 2).
  np.testing.assert_allclose([eta["components_90"]["mean"], eta["components_90"]["std"]], [3, 1], **tol)
  dev = np.array([11, 7, 9.5]) - 27.5 / 3
  np.testing.assert_allclose(eta["components_99"]["std"], np.sqrt((dev**2).sum() / 2), **tol)
  # Identical values: std exactly 0; one model: std None (never NaN).
  assert arms["softmax"]["block_1"]["components_90"]["std"] == 0.0
  (one,) = summarize_arms([_run("a", 0, (3, 1), (4, 2))])["a"]["block_0"]["components_90"]["values"]
  assert one == 3.0 and summarize_arms([_run("a", 0, (3, 1), (4, 2))])["a"]["block_0"]["components_90"]["std"] is None


def test_paired_differences_by_seed_against_the_reference():
  from experiments.spectrum_arms import arms_section

  section = arms_section(_hand_runs(), ["softmax"])
  assert section["references"] == ["softmax"] and section["confidence"] == 0.95
  found = {(p["arm"], p["reference"], p["layer"], p["stat"]): p for p in section["paired"]}
  assert set(found) == {
    ("eta=0.5", "softmax", b, s) for b in ("block_0", "block_1") for s in ("components_90", "components_99")
  }
  # 90%, block_0: differences -2, -1, -3: mean -2, std 1, half-width t * 1 / sqrt(3) = 2.484: contains 0.
  k90 = found[("eta=0.5", "softmax", "block_0", "components_90")]
  half = T_975_2 * 1 / np.sqrt(3)
  np.testing.assert_allclose(
    [k90["mean"], k90["std"], k90["low"], k90["high"]], [-2, 1, -2 - half, -2 + half], atol=1e-9
  )
  assert k90["n"] == 3 and k90["verdict"] == "unresolved"
  # 99%, block_0: differences -3, -2.5, -3: mean -17/6, std sqrt(1/12), interval below zero: fewer components.
  k99 = found[("eta=0.5", "softmax", "block_0", "components_99")]
  std = np.sqrt(((-3 + 17 / 6) ** 2 * 2 + (-2.5 + 17 / 6) ** 2) / 2)
  half = T_975_2 * std / np.sqrt(3)
  expected = [-17 / 6, std, -17 / 6 - half, -17 / 6 + half]  # [-3.550, -2.116]
  np.testing.assert_allclose([k99["mean"], k99["std"], k99["low"], k99["high"]], expected, atol=1e-9)
  assert k99["verdict"] == "lower" and k99["high"] < 0
  # block_1: all differences 0: a zero-width interval at 0 is no finding.
  assert found[("eta=0.5", "softmax", "block_1", "components_90")]["verdict"] == "unresolved"

  # The default reference is the first arm; two references compare each pair once.
  assert arms_section(_hand_runs(), [])["references"] == ["softmax"]
  third = [_run("eta=0", s, (5, 1), (12, 2)) for s in (0, 1, 2)]
  both = arms_section(_hand_runs() + third, ["softmax", "eta=0"])["paired"]
  pairs = {(p["arm"], p["reference"]) for p in both}
  assert pairs == {("eta=0.5", "softmax"), ("eta=0", "softmax"), ("eta=0.5", "eta=0")}
  # Not asked: no pairing, and one model per arm is fine.
  single = arms_section([_run("a", 0, (3, 1), (4, 2)), _run("b", 0, (2, 1), (4, 2))], None)
  assert single["paired"] is None and single["summary"]["b"]["block_0"]["n"] == 1
  assert arms_section([_run("a", 0, (3, 1), (4, 2))], [])["paired"] == []  # one arm: nothing to pair


@pytest.mark.parametrize(
  "change, references, message",
  [
    (lambda runs: runs[:4], ["softmax"], "--label=eta=0.5: 1 model(s) in block_0"),
    (
      lambda runs: [*runs[:5], _run("eta=0.5", 3, (4, 1), (9.5, 2), ("softmax", "primal"))],
      ["softmax"],
      "seeds [0, 2, 3]",
    ),
    (
      lambda runs: [*runs[:5], _run("eta=0.5", 0, (4, 1), (9.5, 2), ("softmax", "primal"))],
      ["softmax"],
      "a seed twice",
    ),
    (lambda runs: [*runs[:5], _run("eta=0.5", None, (4, 1), (9.5, 2), ("softmax", "primal"))], ["softmax"], "no seed"),
    (lambda runs: runs, ["nope"], "--reference=nope: no such arm"),
    (lambda runs: [*runs[:5], _run("eta=0.5", 1, (4, 1), (9.5, 2))], ["softmax"], "--label=eta=0.5: its models differ"),
  ],
  ids=["one_model", "other_seeds", "seed_twice", "no_seed", "unknown_reference", "mixed_kinds"],
)
def test_arms_refuse_what_cannot_be_paired(change, references, message):
  from experiments.spectrum_arms import PairingError, arms_section

  with pytest.raises(PairingError) as err:
    arms_section(change(_hand_runs()), references)
  assert message in str(err.value) and "\n" not in str(err.value)


def test_curves_over_models_pad_and_take_the_sample_std():
  from experiments.spectrum_arms import curve_over_models

  mean, std = curve_over_models([[0.5, 1.0], [0.7, 0.9, 1.0]], pad=1.0)  # the first extended with 1
  np.testing.assert_allclose(mean, [0.6, 0.95, 1.0], atol=1e-12)
  np.testing.assert_allclose(std, [np.sqrt(0.02), np.sqrt(0.005), 0.0], atol=1e-12)  # ddof=1: 0.2^2 / 2, 0.1^2 / 2
  np.testing.assert_array_equal(curve_over_models([[1.0, 0.5]], pad=0.0)[1], [0.0, 0.0])


def test_docs_tables_render_the_arms_and_their_paired_differences(tmp_path, monkeypatch):
  from experiments import docs_tables
  from experiments.spectrum import plot_explained_variance, plot_normalized_decay
  from experiments.spectrum_arms import arms_section
  from experiments.tables import common

  runs = _hand_runs()
  folder = tmp_path / "spectrum_trial"
  folder.mkdir()
  record = {"split": "test", "num_examples": 8, "runs": runs, "arms": arms_section(runs, ["softmax"])}
  (folder / "spectrum.json").write_text(json.dumps(record))
  monkeypatch.setattr(common, "RESULTS", tmp_path)
  text = docs_tables.render_table("spectrum_arms:trial", tmp_path)
  lines = text.splitlines()
  assert "| softmax | block_0 | softmax | 3 | 0, 1, 2 | 5.00 ± 1.00 | 12.00 ± 2.00 |" in lines
  assert "| eta=0.5 | block_1 | primal | 3 | 2, 0, 1 | 1.00 ± 0.00 | 2.00 ± 0.00 |" in lines
  # -2 ± 2.484 and -2.833 ± 0.717 (the numbers of the test above, to two decimals), raw. Holm over the table's 4
  # comparisons: sd 1.0 and 0.2887 give p 0.0742 and 0.00344 (t = -3.46 and -17.0 on 2 df), block_1's p = 1 (no
  # spread, mean 0). The 99% one ranks first: level 1 - 0.05 / 4, t_{0.99375, 2} = 8.8602, half 8.8602 * 0.2887 /
  # sqrt 3 = 1.477, adjusted p 4 * 0.00344 = 0.0138: fewer. The 90% one ranks second: t_{1 - 0.05 / 6, 2} = 7.6488,
  # half 4.415, adjusted p max(0.0138, 3 * 0.0742) = 0.223: unresolved.
  holm_90, holm_99 = "[-6.42, +2.42] | unresolved", "[-4.31, -1.36] | fewer"
  row = f"| eta=0.5 | softmax | block_0 | 3 | -2.00 [-4.48, +0.48] | {holm_90} | -2.83 [-3.55, -2.12] | {holm_99} |"
  assert row in lines
  zero = "+0.00 [+0.00, +0.00] | [+0.00, +0.00] | unresolved"
  assert f"| eta=0.5 | softmax | block_1 | 3 | {zero} | {zero} |" in lines
  assert "4 comparisons (both energy levels) are one family, Holm-corrected" in text
  assert "paired by seed" in text and "(spectrum_trial/spectrum.json)" in text
  # The per-run table still renders (now naming each run's seed); a record without arms is refused by name.
  assert "| eta=0.5 (seed 2) | 10 | 3.00 / 11.00 | 1.00 / 2.00 |" in docs_tables.render_table(
    "spectrum:trial", tmp_path
  )
  (folder / "spectrum.json").write_text(json.dumps({k: v for k, v in record.items() if k != "arms"}))
  with pytest.raises(ValueError, match="no arms section"):
    docs_tables.render_table("spectrum_arms:trial", tmp_path)
  # The figures take several models per arm (one panel per arm).
  plot_explained_variance(runs, tmp_path / "ev.png")
  plot_normalized_decay(runs, tmp_path / "decay.png")
  assert (tmp_path / "ev.png").stat().st_size > 0 and (tmp_path / "decay.png").stat().st_size > 0
