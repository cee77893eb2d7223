"""The CV release's `ComboVisionTransformer` converter on cases of other shapes than the shipped one.

The shipped `cv_primal_deit` is checked by tests/test_convert.py (`test_shipped_case_parity`); here:
synthetic release state_dicts (other image sizes, patches, widths, depths, heads, s, rank_multi, several
Primal blocks, and the sampling branch N > s * rank_multi that no shipped case takes) written in the
reference folder's format, with golden outputs from the independent float64 NumPy model
`reference_vit_numpy`; the verify CLI on them; and the converter's refusals.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_vit_numpy as vref

from primal_jax.convert import cli
from primal_jax.convert import vit as convert_vit
from primal_jax.convert.cases import load_case, relative_errors, run_case

# Compares with float64 NumPy or golden numbers at float32 tolerances: full float32 matmuls on every platform.
pytestmark = pytest.mark.matmul_precision("highest")

TOL = 1e-5  # README: max|jax - golden| <= 1e-5 * max|golden| per array


def write_combo_case(folder: Path, name: str, *, seed, image, batch=2, classes=7, eta=0.05, **sizes) -> Path:
  """<name>.npz / .json in the reference folder's format, golden outputs from `reference_vit_numpy`."""
  rng = np.random.default_rng(seed)
  tokens = (image // sizes["patch"]) ** 2 + 1
  sd = vref.random_state_dict(rng, tokens=tokens, classes=classes, channels=3, **sizes)
  inputs = {
    "images": rng.standard_normal((batch, 3, image, image)).astype(np.float32),
    "labels": rng.integers(0, classes, batch).astype(np.int64),
  }
  config = dict(
    img_size=image,
    patch_size=sizes["patch"],
    embed_dim=sizes["dim"],
    depth=sizes["depth"],
    num_heads=sizes["heads"],
    low_rank=sizes["s"],
    rank_multi=sizes["rank_multi"],
    num_ksvd_layer=sizes["num_primal"],
    num_classes=classes,
    eta=eta,
  )
  golden = vref.combo_vision_transformer(sd, config, inputs)
  outputs = {
    k: np.asarray(v).astype(np.int64 if np.issubdtype(np.asarray(v).dtype, np.integer) else np.float32)
    for k, v in golden.items()
  }
  np.savez(
    folder / f"{name}.npz",
    **sd,
    **inputs,
    **outputs,
    param_keys=np.array(list(sd)),
    input_keys=np.array(list(inputs)),
    output_keys=np.array(list(outputs)),
  )
  meta = {
    "case": name,
    "set": "synthetic",
    "torch_module": {"class": "ComboVisionTransformer"},
    "config": config,
    "outputs": {k: {"shape": list(v.shape), "file": f"{name}.npz"} for k, v in outputs.items()},
  }
  (folder / f"{name}.json").write_text(json.dumps(meta, indent=1))
  return folder / f"{name}.npz"


SYNTHETIC = {
  # Sampling branch: N = 37 tokens > s * rank_multi = 12 rows (torch's integer linspace), two Primal blocks.
  "cv_sampled": dict(seed=11, image=24, patch=4, dim=24, depth=3, heads=2, s=3, rank_multi=4, num_primal=2),
  # No sampling, n = N = 17 < s * rank_multi = 20; PrimalFormer-ViT (every block Primal), 3 heads, eta 0.2.
  "cv_all_primal": dict(seed=12, image=16, patch=4, dim=24, depth=2, heads=3, s=4, rank_multi=5, num_primal=2, eta=0.2),
  # Boundary: N = 17 = s * rank_multi exactly (all tokens, no sampling), a larger patch, one Primal block of 4.
  "cv_boundary": dict(seed=13, image=32, patch=8, dim=16, depth=4, heads=4, s=1, rank_multi=17, num_primal=1),
}


@pytest.fixture(scope="module")
def cv_cases(tmp_path_factory):
  folder = tmp_path_factory.mktemp("cv_cases")
  return {name: write_combo_case(folder, name, **spec) for name, spec in SYNTHETIC.items()}


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_combo_case_matches_reference(cv_cases, name):
  case = load_case(str(cv_cases[name]))
  ours = run_case(case)
  assert set(ours) == set(case.outputs)
  errors = relative_errors(case, ours)
  for key, err in errors.items():
    assert err <= TOL, f"{name}/{key}: max rel err {err:.3e}"


def test_synthetic_cases_exercise_what_they_claim(cv_cases):
  sampled = load_case(str(cv_cases["cv_sampled"]))
  indices = sampled.outputs["sampled_indices"]
  assert len(indices) == 12 < 37 and len(np.unique(indices)) == 12 and indices[-1] == 36
  assert {"layer1/escore", "layer2/escore"} <= set(sampled.outputs) and "layer0/escore" not in sampled.outputs
  boundary = load_case(str(cv_cases["cv_boundary"]))
  np.testing.assert_array_equal(boundary.outputs["sampled_indices"], np.arange(17))


def test_verify_cli_on_a_sampled_case(cv_cases):
  report = io.StringIO()
  assert cli.verify(str(cv_cases["cv_sampled"]), 1e-4, out=report)
  assert "layer2/attn_out" in report.getvalue() and "FAIL" not in report.getvalue()


def test_converter_layout():
  """qk rows: q = first D outputs, heads contiguous; the patch Conv2d weight [D, C, P, P] -> [P, P, C, D]."""
  sd = vref.random_state_dict(
    np.random.default_rng(0), dim=8, depth=2, heads=2, patch=2, channels=3, tokens=5, classes=3, s=2, rank_multi=2,
    num_primal=1,
  )  # fmt: skip
  params, layers, sizes = convert_vit.vit_params(sd, 2)
  assert layers == ("softmax", ("primal", {"low_rank": 2, "num_samples": 4, "data_dependent": True}))
  assert sizes == dict(dim=8, hidden_dim=32, patch_size=2, channels=3, num_tokens=5, num_classes=3, image_size=4)
  attn = params["encoder"]["block_1"]["attention"]
  np.testing.assert_array_equal(attn["key"]["kernel"][:, 1], sd["blocks.1.attn.qk.weight"][12:16].T)
  np.testing.assert_array_equal(attn["query"]["bias"][1], sd["blocks.1.attn.qk.bias"][4:8])
  v = params["encoder"]["block_0"]["attention"]["value"]
  np.testing.assert_array_equal(v["kernel"][:, 0], sd["blocks.0.attn.qkv.weight"][16:20].T)
  np.testing.assert_array_equal(params["patch_embed"]["kernel"][1, 0, 2], sd["patch_embed.proj.weight"][:, 2, 1, 0])


@pytest.mark.parametrize(
  "key,message",
  [
    ("dist_token", "distillation token"),
    ("blocks.0.ls1.gamma", "layer scale"),
    ("fc_norm.weight", "global-average-pooling"),
    ("blocks.0.attn.q_norm.weight", "does not know"),
  ],
)
def test_converter_refuses_parts_it_cannot_represent(key, message):
  sd = vref.random_state_dict(
    np.random.default_rng(0), dim=8, depth=1, heads=2, patch=2, channels=3, tokens=5, classes=3, s=2, rank_multi=2,
    num_primal=0,
  )  # fmt: skip
  sd[key] = np.zeros(8, np.float32)
  with pytest.raises(ValueError, match=message):
    convert_vit.vit_params(sd, 2)


def test_converter_checks_heads():
  sd = vref.random_state_dict(
    np.random.default_rng(0), dim=8, depth=1, heads=2, patch=2, channels=3, tokens=5, classes=3, s=2, rank_multi=2,
    num_primal=1,
  )  # fmt: skip
  with pytest.raises(ValueError, match="2 heads but num_heads=4"):
    convert_vit.vit_params(sd, 4)
  del sd["blocks.0.attn.we"]  # now read as a softmax block: its qkv split needs D % H == 0
  sd["blocks.0.attn.qkv.weight"], sd["blocks.0.attn.qkv.bias"] = np.zeros((24, 8), np.float32), np.zeros(24, np.float32)
  with pytest.raises(ValueError, match="not divisible by num_heads=3"):
    convert_vit.vit_params(sd, 3)


REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "cv_primal_deit.npz"


@pytest.mark.parametrize(
  "override,expected",
  [(dict(layer_norm_eps=1e-5), 8.4e-5), (dict(activation="gelu_tanh"), 6.1e-5)],
)
def test_golden_tolerance_catches_the_readme_mistakes(override, expected):
  """The README's sensitivity table: LayerNorm eps 1e-5 or tanh GELU moves the logits by ~1e-4 relative, so the
  tests' 1e-5 tolerance catches both (the correct model is within 2.2e-7)."""
  if not REFERENCE.is_file():
    pytest.skip(f"{REFERENCE} not found")
  case = load_case(str(REFERENCE))
  model, params = convert_vit.model_from_state_dict(case.params, case.meta["config"]["num_heads"], **override)
  images = jnp.asarray(convert_vit.nchw_to_nhwc(case.inputs["images"]))
  logits = np.asarray(jax.jit(model.apply)({"params": params}, images))
  golden = case.outputs["logits"]
  err = np.max(np.abs(logits - golden)) / np.max(np.abs(golden))
  assert err > TOL and err == pytest.approx(expected, rel=0.3)
