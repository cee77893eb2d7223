"""Converters of Decision Transformer state_dicts (the Primal-Attention RL release, Hugging Face transformers).

The shipped golden case `rl_primal_dt` is checked by tests/test_convert.py (`test_shipped_case_parity`);
here: synthetic release cases of other shapes (state/action dims, K, heads, s, n_layer, padding on both
sides) with golden outputs from the independent float64 NumPy reference `reference_dt_numpy`, the
converter's errors, and the Hugging Face `DecisionTransformerModel` converter against the committed
tests/data/hf_dt_small.npz (written by tools/hf_decision_transformer.py; torch is not needed) and,
where torch and transformers import, against a live model.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import reference_dt_numpy as dtref

from primal_jax.convert import rl_case
from primal_jax.convert.cases import load_case, relative_errors, run_case

# Compares with float64 NumPy or golden numbers at float32 tolerances: full float32 matmuls on every platform.
pytestmark = pytest.mark.matmul_precision("highest")

TOL = 1e-5
KSVD_SCALAR_TOL = 2e-5
KSVD_SCALARS = ("ksvd_per_sample", "loss_ksvd")
HF_CASE = Path(__file__).resolve().parent / "data" / "hf_dt_small.npz"


# ============================================================================ synthetic release cases


def _dt_state_dict(rng, *, state_dim, act_dim, dim, heads, s, n_layer, n_inner, max_ep_len, primal=True):
  """A release `DecisionTransformer` state_dict: GPT-2 blocks, the last one Primal (if `primal`)."""
  sd = {}

  def linear(name, fan_in, fan_out):
    bound = 1.0 / np.sqrt(fan_in)
    sd[name + ".weight"] = rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32)
    sd[name + ".bias"] = rng.uniform(-bound, bound, fan_out).astype(np.float32)

  def conv1d(name, fan_in, fan_out):  # transformers Conv1D: weight [in, out]
    sd[name + ".weight"] = (0.2 * rng.standard_normal((fan_in, fan_out))).astype(np.float32)
    sd[name + ".bias"] = (0.1 * rng.standard_normal(fan_out)).astype(np.float32)

  def norm(name):
    sd[name + ".weight"] = (1.0 + 0.1 * rng.standard_normal(dim)).astype(np.float32)
    sd[name + ".bias"] = (0.1 * rng.standard_normal(dim)).astype(np.float32)

  p = dim // heads
  for i in range(n_layer):
    block = f"transformer.h.{i}."
    norm(block + "ln_1")
    if primal and i == n_layer - 1:
      att = block + "attn.att."
      for name in ("query_projection", "key_projection", "out_projection"):
        linear(att + name, dim, dim)
      linear(att + "concate_weight", 2 * s, p)
      for name in ("We", "Wr"):
        sd[att + name] = (rng.standard_normal((heads, p, s)) / np.sqrt(p * s)).astype(np.float32)
      sd[att + "Lambda"] = rng.uniform(0.0, 1.0, (heads, s)).astype(np.float32)
    else:
      conv1d(block + "attn.c_attn", dim, 3 * dim)
      conv1d(block + "attn.c_proj", dim, dim)
    norm(block + "ln_2")
    conv1d(block + "mlp.c_fc", dim, n_inner)
    conv1d(block + "mlp.c_proj", n_inner, dim)
  norm("transformer.ln_f")
  sd["embed_timestep.weight"] = rng.standard_normal((max_ep_len, dim)).astype(np.float32)
  linear("embed_return", 1, dim)
  linear("embed_state", state_dim, dim)
  linear("embed_action", act_dim, dim)
  norm("embed_ln")
  linear("predict_state", dim, state_dim)
  linear("predict_action.0", dim, act_dim)
  linear("predict_return", dim, 1)
  return sd


def _dt_inputs(rng, *, batch, k, state_dim, act_dim, max_ep_len, pads):
  """A batch in the release's format; `pads[b] = (left, right)` padded steps of sample b."""
  mask = np.ones((batch, k), np.int64)
  for b, (left, right) in enumerate(pads):
    mask[b, :left] = 0
    mask[b, k - right :] = 0
  real = mask[..., None] > 0
  start = rng.integers(0, max_ep_len - k, batch)
  inputs = {
    "states": np.where(real, rng.standard_normal((batch, k, state_dim)), 0.3).astype(np.float32),
    "actions": np.where(real, rng.uniform(-1, 1, (batch, k, act_dim)), -10.0).astype(np.float32),
    "rewards": np.where(real, rng.uniform(0, 4, (batch, k, 1)), 0.0).astype(np.float32),
    "returns_to_go": np.where(real, rng.uniform(0, 3, (batch, k, 1)), 0.0).astype(np.float32),
    "timesteps": np.where(mask > 0, start[:, None] + np.arange(k), 0).astype(np.int64),
    "attention_mask": mask,
  }
  for name, steps in (("get_action_long", k + 3), ("get_action_short", max(1, k // 2))):
    inputs[f"{name}/states"] = rng.standard_normal((steps, state_dim)).astype(np.float32)
    acts = rng.uniform(-1, 1, (steps, act_dim)).astype(np.float32)
    acts[-1] = 0.0
    inputs[f"{name}/actions"] = acts
    inputs[f"{name}/rewards"] = np.zeros(steps, np.float32)
    inputs[f"{name}/returns_to_go"] = (3.0 - 0.01 * np.arange(steps, dtype=np.float32))[None]
    inputs[f"{name}/timesteps"] = np.arange(steps, dtype=np.int64)[None]
  return inputs


def _write_dt_case(folder: Path, name: str, *, seed, batch, k, pads, eta=0.05, action_tanh=True, **sizes) -> Path:
  """<name>.npz / .json in the reference folder's format, every array in the one npz (as rl_primal_dt)."""
  rng = np.random.default_rng(seed)
  primal = sizes.pop("primal", True)
  sd = _dt_state_dict(rng, primal=primal, **sizes)
  inputs = _dt_inputs(
    rng,
    batch=batch,
    k=k,
    state_dim=sizes["state_dim"],
    act_dim=sizes["act_dim"],
    max_ep_len=sizes["max_ep_len"],
    pads=pads,
  )
  config = dict(
    state_dim=sizes["state_dim"],
    act_dim=sizes["act_dim"],
    hidden_size=sizes["dim"],
    max_length_K=k,
    max_ep_len=sizes["max_ep_len"],
    action_tanh=action_tanh,
    n_layer=sizes["n_layer"],
    n_head=sizes["heads"],
    n_inner=sizes["n_inner"],
    activation_function="relu",
    low_rank=sizes["s"],
    eta=eta,
  )
  golden = {k_: np.asarray(v, np.float32) for k_, v in dtref.decision_transformer(sd, config, inputs).items()}
  np.savez_compressed(
    folder / f"{name}.npz",
    **sd,
    **inputs,
    **golden,
    param_keys=np.array(list(sd)),
    input_keys=np.array(list(inputs)),
    output_keys=np.array(list(golden)),
  )
  meta = {"case": name, "set": "synthetic", "torch_module": {"class": "DecisionTransformer"}, "config": config}
  meta["outputs"] = {k_: {"shape": list(v.shape), "file": f"{name}.npz"} for k_, v in golden.items()}
  (folder / f"{name}.json").write_text(json.dumps(meta, indent=1))
  return folder / f"{name}.npz"


SYNTHETIC = {
  # Other dims everywhere; left, right and both-sides padding; 2 heads, the Primal block second of two.
  "dt_two_layers": dict(
    seed=11,
    batch=4,
    k=7,
    pads=[(0, 0), (3, 0), (0, 2), (1, 2)],
    state_dim=5,
    act_dim=2,
    dim=24,
    heads=2,
    s=5,
    n_layer=2,
    n_inner=40,
    max_ep_len=50,
    eta=0.3,
  ),
  # Four blocks, 3 heads of width 6, s > p, no tanh on the actions.
  "dt_four_layers": dict(
    seed=12,
    batch=2,
    k=4,
    pads=[(2, 0), (0, 1)],
    state_dim=3,
    act_dim=4,
    dim=18,
    heads=3,
    s=8,
    n_layer=4,
    n_inner=20,
    max_ep_len=30,
    action_tanh=False,
  ),
  # The Primal block alone (n_layer 1).
  "dt_primal_only": dict(
    seed=13,
    batch=3,
    k=5,
    pads=[(0, 0), (4, 0), (0, 4)],
    state_dim=2,
    act_dim=1,
    dim=8,
    heads=1,
    s=3,
    n_layer=1,
    n_inner=16,
    max_ep_len=20,
  ),  # fmt: skip
  # No Primal block: the release's GPT-2 DT (softmax everywhere; no KSVD outputs).
  "dt_softmax_only": dict(
    seed=14,
    batch=2,
    k=3,
    pads=[(1, 0), (0, 1)],
    state_dim=2,
    act_dim=2,
    dim=8,
    heads=2,
    s=2,
    n_layer=2,
    n_inner=12,
    max_ep_len=20,
    primal=False,
  ),  # fmt: skip
}


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory):
  folder = tmp_path_factory.mktemp("dt_cases")
  for name, spec in SYNTHETIC.items():
    _write_dt_case(folder, name, **spec)
  return folder


def _assert_matches(case, ours):
  assert set(ours) == set(case.outputs), sorted(set(ours) ^ set(case.outputs))
  errors = relative_errors(case, ours)
  for key, err in errors.items():
    assert np.all(np.isfinite(ours[key])), key
    tol = KSVD_SCALAR_TOL if key in KSVD_SCALARS else TOL
    assert err <= tol, f"{case.name}/{key}: max rel err {err:.3e} > {tol:.0e}"


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_release_case_matches_numpy_reference(synthetic_dir, name):
  case = load_case(str(synthetic_dir / f"{name}.npz"))
  _assert_matches(case, run_case(case))


def test_synthetic_cases_exercise_what_they_claim(synthetic_dir):
  case = load_case(str(synthetic_dir / "dt_two_layers.npz"))
  mask = case.inputs["attention_mask"]
  assert mask[1, 0] == 0 and mask[2, -1] == 0 and mask[3, 0] == 0 and mask[3, -1] == 0  # left, right, both
  assert {"layer1/escore", "layer1/attn_in"} <= set(case.outputs)
  assert case.inputs["get_action_short/states"].shape[0] < case.meta["config"]["max_length_K"]
  assert "ksvd_per_sample" not in load_case(str(synthetic_dir / "dt_softmax_only.npz")).outputs


def test_softmax_masking_instead_of_gpt2_breaks_parity_only_where_the_release_leaks(synthetic_dir):
  """Why the converter uses "gpt2" layers: with SoftmaxAttention's -1e6 rule the left-padded rows change,
  and the release's mask-blind Primal block carries them into real outputs."""
  case = load_case(str(synthetic_dir / "dt_two_layers.npz"))
  model, params = rl_case.model_from_state_dict(case.params, case.meta["config"])
  layers = tuple("softmax" if spec.attention == "gpt2" else spec for spec in model.config.layers)
  softmax_model = model.clone(config=dataclasses.replace(model.config, layers=layers))
  args = [jnp.asarray(case.inputs[k]) for k in ("states", "actions", "returns_to_go")]
  args += [jnp.asarray(case.inputs["timesteps"], jnp.int32), jnp.asarray(case.inputs["attention_mask"])]
  gpt2 = np.asarray(model.apply({"params": params}, *args)[1])
  soft = np.asarray(softmax_model.apply({"params": params}, *args)[1])
  golden = case.outputs["action_preds"]
  assert np.max(np.abs(gpt2 - golden)) <= TOL * np.max(np.abs(golden))
  assert np.max(np.abs(soft - golden)) > 10 * TOL * np.max(np.abs(golden))  # samples 1 and 3 (left padding)
  np.testing.assert_allclose(soft[[0, 2]], gpt2[[0, 2]], atol=1e-6)  # no left padding: identical


# ============================================================================ converter errors


def _small_sd(**overrides):
  sizes = dict(state_dim=2, act_dim=1, dim=8, heads=2, s=3, n_layer=2, n_inner=8, max_ep_len=10)
  sizes.update(overrides)
  return _dt_state_dict(np.random.default_rng(0), **sizes)


@pytest.mark.parametrize(
  "missing",
  ["transformer.h.0.attn.c_attn.bias", "transformer.h.1.attn.att.Lambda", "embed_ln.weight", "predict_action.0.bias"],
)
def test_missing_key_is_named(missing):
  sd = _small_sd()
  del sd[missing]
  with pytest.raises(KeyError, match=re.escape(f"'{missing}'")):
    rl_case.decision_transformer_params(sd, 2)


def test_converter_errors_name_the_problem():
  with pytest.raises(ValueError, match="not a Decision Transformer"):
    rl_case.decision_transformer_params({"embed_ln.weight": np.ones(2)}, 2)
  with pytest.raises(ValueError, match="num_heads=3"):
    rl_case.decision_transformer_params(_small_sd(), 3)
  with pytest.raises(ValueError, match="4 heads but num_heads=2"):
    rl_case.decision_transformer_params(_small_sd(heads=4), 2)
  sd = _small_sd()
  sd["transformer.h.0.attn.c_attn.weight"] = sd["transformer.h.0.attn.c_attn.weight"][:, :16]
  with pytest.raises(ValueError, match=r"must be \[D, 3D\]"):
    rl_case.decision_transformer_params(sd, 2)


def test_fused_qkv_split_and_layer_names():
  sd = _small_sd()
  params, layers = rl_case.decision_transformer_params(sd, 2)
  assert layers == ["gpt2", ("primal", {"low_rank": 3, "data_dependent": False})]
  attn = params["transformer"]["block_0"]["attention"]
  w = sd["transformer.h.0.attn.c_attn.weight"]
  np.testing.assert_array_equal(attn["key"]["kernel"][:, 1], w[:, 8 + 4 : 8 + 8])  # k = columns D..2D, head 1
  np.testing.assert_array_equal(attn["value"]["bias"][0], sd["transformer.h.0.attn.c_attn.bias"][16:20])
  np.testing.assert_array_equal(attn["out"]["kernel"][1], sd["transformer.h.0.attn.c_proj.weight"][4:8])
  assert set(params["transformer"]["block_1"]) == {"norm1", "attention", "norm2", "mlp"}


# ============================================================================ Hugging Face DecisionTransformerModel


def _hf_case():
  if not HF_CASE.is_file():
    pytest.fail(f"{HF_CASE} is missing: run tools/hf_decision_transformer.py where torch and transformers import")
  z = np.load(HF_CASE)
  meta = json.loads(str(z["config_json"]))
  return (
    meta,
    {str(k): z[str(k)] for k in z["param_keys"]},
    {k: z[k] for k in ("states", "actions", "returns_to_go", "timesteps", "attention_mask")},
    z,
  )


def _hf_outputs(meta, sd, inputs):
  model, params = rl_case.model_from_state_dict(sd, meta, prefix=rl_case.HF_PREFIX)
  args = [jnp.asarray(inputs[k]) for k in ("states", "actions", "returns_to_go")]
  args += [jnp.asarray(inputs["timesteps"], jnp.int32), jnp.asarray(inputs["attention_mask"])]
  return model, [np.asarray(o) for o in model.apply({"params": params}, *args)]


def test_hf_committed_case_matches(tmp_path):
  """The committed transformers outputs, at every real step (padded steps of a softmax-only DT are never read)."""
  meta, sd, inputs, z = _hf_case()
  assert HF_CASE.stat().st_size < 300_000
  model, ours = _hf_outputs(meta, sd, inputs)
  assert model.config.activation == rl_case.HF_ACTIVATIONS[meta["activation_function"]]
  assert {spec.attention for spec in model.config.layers} == {"gpt2"}
  real = inputs["attention_mask"] > 0
  assert not real.all()  # the case has padding
  for name, mine in zip(("state_preds", "action_preds", "return_preds"), ours, strict=True):
    golden = z[name]
    err = np.max(np.abs(mine[real] - golden[real])) / np.max(np.abs(golden[real]))
    assert err <= TOL, f"{name}: max rel err {err:.3e}"


def test_hf_position_row_is_folded_into_embed_ln():
  meta, sd, _, _ = _hf_case()
  params, _ = rl_case.hf_decision_transformer_params(sd, meta["n_head"])
  np.testing.assert_allclose(
    params["embed_ln"]["bias"], sd["embed_ln.bias"] + sd["encoder.wpe.weight"][0], rtol=0, atol=0
  )
  sd = dict(sd)
  del sd["encoder.wpe.weight"]
  with pytest.raises(KeyError, match="encoder.wpe.weight"):
    rl_case.hf_decision_transformer_params(sd, meta["n_head"])


def test_hf_live_model_matches(tmp_path):
  """A fresh random transformers model of another size, run live (only where torch and transformers import)."""
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  import sys

  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  import hf_decision_transformer as tool

  path = tool.write_case(
    tmp_path / "live.npz", seed=5, state_dim=4, act_dim=3, hidden_size=20, n_layer=3, n_head=5, k=6, batch=3
  )
  z = np.load(path)
  meta = json.loads(str(z["config_json"]))
  sd = {str(k): z[str(k)] for k in z["param_keys"]}
  inputs = {k: z[k] for k in ("states", "actions", "returns_to_go", "timesteps", "attention_mask")}
  _, ours = _hf_outputs(meta, sd, inputs)
  real = inputs["attention_mask"] > 0
  for name, mine in zip(("state_preds", "action_preds", "return_preds"), ours, strict=True):
    err = np.max(np.abs(mine[real] - z[name][real])) / np.max(np.abs(z[name][real]))
    assert err <= TOL, f"{name}: max rel err {err:.3e}"
