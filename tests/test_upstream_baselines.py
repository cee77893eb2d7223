"""Longformer, YOSO-E and SOFT against their authors' PyTorch code, and in every model family they apply to.

The upstream numbers are the committed tests/data/upstream_<name>.npz, written by tools/upstream_baselines.py
(torch 2.13.0 CPU; transformers 3.3.1 for Longformer; torch is not needed here): one attention layer (the
authors' W_q, W_k, W_v, core, output Linear `ff`) on x [B, N, D] with a padding mask, its output and the input
gradient d sum(out * G) / dx through the upstream's own backward. Our layer gets the same weights.
Tolerance: max relative error 1e-5 (float32 vs float32).
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import numpy_reference as ref
import pytest

from primal_jax.attention import get_attention
from primal_jax.cli.config_lookup import load_config
from primal_jax.errors import ConfigError
from primal_jax.models.registry import build_model

# Compares with float64 NumPy, golden numbers or the Linen layer at float32 tolerances: full float32 matmuls.
pytestmark = pytest.mark.matmul_precision("highest")

DATA = Path(__file__).resolve().parent / "data"
TOL = 1e-5


def _case(name):
  z = np.load(DATA / f"upstream_{name}.npz")
  return {k: z[k] for k in z.files if k != "config_json"}, json.loads(str(z["config_json"]))


def _dense(z, prefix, heads):
  """torch Linear (weight [out, in], bias) -> our DenseGeneral {kernel [D, H, p], bias [H, p]}."""
  w, b = z[f"{prefix}.weight"], z[f"{prefix}.bias"]
  return {"kernel": w.T.reshape(w.shape[1], heads, -1), "bias": b.reshape(heads, -1)}


def _params(z, heads, names=(("query", "W_q"), ("key", "W_k"), ("value", "W_v"))):
  params = {ours: _dense(z, theirs, heads) for ours, theirs in names}
  w, b = z["ff.weight"], z["ff.bias"]
  params["out"] = {"kernel": w.T.reshape(heads, -1, w.shape[0]), "bias": b}
  return params


def _out_and_grad_x(module, params, x, mask, cotangent):
  fn = lambda inp: module.apply({"params": params}, inp, mask=mask)  # noqa: E731
  out, vjp = jax.vjp(jax.jit(fn), jnp.asarray(x))
  return np.asarray(out), np.asarray(vjp(jnp.asarray(cotangent))[0])


@pytest.mark.parametrize("prefix", ["global", "local"])
def test_longformer_matches_transformers(prefix):
  """The Nystromformer LRA code's Longformer (transformers 3.3.1 LongformerSelfAttention; first token global or
  none), padded positions included (their rows: ff's bias, as ours)."""
  arrays, meta = _case("longformer")
  config = meta["cases"][prefix]
  z = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(prefix + "/")}
  assert meta["versions"]["transformers"] == "3.3.1"
  module = get_attention("longformer")(
    num_heads=config["num_head"], window=config["window_size"], num_global=int(config["first_token_view"])
  )
  out, grad_x = _out_and_grad_x(module, _params(z, config["num_head"]), z["x"], z["mask"] > 0, z["cotangent"])
  ref.assert_rel_close(out, z["out"], TOL, "out")
  ref.assert_rel_close(grad_x, z["grad_x"], TOL, "grad_x")


def test_yoso_e_matches_mlpen_yoso():
  """mlpen/YOSO's YOSOEAttention (expectation, its Cumulation backward) with the conv residual."""
  z, meta = _case("yoso")
  config = meta["cases"]["yoso"]
  heads = config["num_head"]
  module = get_attention("yoso_e")(
    num_heads=heads, hash_code_len=config["hash_code_len"], conv_window=config["conv_window"]
  )
  params = _params(z, heads)
  params["conv"] = z["attn.conv.weight"][:, 0, :, 0].T  # [H, 1, K, 1] -> [K, H]
  out, grad_x = _out_and_grad_x(module, params, z["x"], z["mask"] > 0, z["cotangent"])
  ref.assert_rel_close(out, z["out"], TOL, "out")
  ref.assert_rel_close(grad_x, z["grad_x"], TOL, "grad_x")


@pytest.mark.parametrize("prefix", ["pool", "conv"])
def test_soft_matches_fudan_soft(prefix):
  """fudan-zvg/SOFT's SoftmaxFreeAttention on a 4 x 6 grid with ratio 2 (its learned conv, or that conv set to
  averaging), against ours on the grid in block-major order: our 6 blocks of 4 consecutive positions are its
  2 x 2 blocks ("conv" with conv_block 4, or "pool" with 6 landmarks)."""
  arrays, meta = _case("soft")
  config = meta["cases"][prefix]
  z = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(prefix + "/")}
  heads, perm, r = config["num_heads"], z["perm"], config["ratio"]
  p = config["dim"] // heads
  weight = z["attn.Qlandmark_op.weight"]  # [p_out, p_in, r, r]
  average = np.eye(p)[:, :, None, None].repeat(r, 2).repeat(r, 3) / r**2
  assert np.array_equal(weight, average) == (prefix == "pool")
  landmarks = dict(landmarks="conv", conv_block=r * r) if prefix == "conv" else dict(num_landmarks=len(perm) // r**2)
  module = get_attention("soft")(num_heads=heads, newton_iterations=config["max_iter"], **landmarks)
  params = _params(z, heads, (("query", "W_q"), ("value", "W_v")))
  params["landmark_norm"] = {"scale": z["attn.Qnorm_act.0.weight"], "bias": z["attn.Qnorm_act.0.bias"]}
  if prefix == "conv":
    params["landmark_conv"] = weight.transpose(2, 3, 1, 0).reshape(r * r, p, p)  # [(ky, kx), p_in, p_out]
  out, grad_x = _out_and_grad_x(module, params, z["x"][:, perm], None, z["cotangent"][:, perm])
  ref.assert_rel_close(out, z["out"][:, perm], TOL, "out")
  ref.assert_rel_close(grad_x, z["grad_x"][:, perm], TOL, "grad_x")


# ============================================================================ model families


OPTIONS = {"longformer": {"window": 4}, "yoso_e": {"hash_code_len": 4}, "soft": {"num_landmarks": 4}}


def _finite_grads(loss_fn, params):
  value, grads = jax.jit(jax.value_and_grad(loss_fn))(params)
  assert np.isfinite(float(value))
  leaves = jax.tree.leaves(grads)
  assert all(np.all(np.isfinite(np.asarray(g))) for g in leaves)
  assert sum(float(jnp.sum(jnp.abs(g))) for g in leaves) > 0
  return value


@pytest.mark.parametrize("name", ["longformer", "yoso_e", "soft"])
def test_lra_classifier_train_step(name):
  """The LRA model (`lra` config, smoke sizes) with every layer `name`, padded batches: finite loss and grads."""
  config = load_config(f"lra:task=listops,model={name},smoke", lock=False)
  config.model.attention[name] = {**config.model.attention.get(name, {}), **OPTIONS[name]}
  info = ml_collections.ConfigDict(dict(seq_len=16, vocab_size=20, num_classes=10))
  built = build_model(config.model, info)
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 20, (2, 16)), jnp.int32)
  mask = jnp.arange(16)[None] < jnp.array([[16], [11]])
  params = jax.jit(built.module.init)(jax.random.key(0), tokens, mask)["params"]

  def loss(p):
    logits = built.module.apply({"params": p}, tokens, mask)
    return -jnp.mean(jax.nn.log_softmax(logits)[:, 0])

  _finite_grads(loss, params)


@pytest.mark.parametrize("name", ["longformer", "yoso_e", "soft"])
def test_vit_forward_and_gradients(name):
  config = load_config(f"vit:model={name},smoke", lock=False)
  config.model.attention[name] = {**config.model.attention.get(name, {}), **OPTIONS[name]}
  info = types.SimpleNamespace(name="toy", num_classes=3, image_shape=(16, 16, 3))
  built = build_model(config.model, info)
  images = jnp.asarray(np.random.default_rng(1).standard_normal((2, 16, 16, 3)), jnp.float32)
  params = jax.jit(built.module.init)(jax.random.key(0), images)["params"]
  _finite_grads(lambda p: jnp.sum(built.module.apply({"params": p}, images) ** 2), params)


def _lm_config_with(name: str):
  """The lm smoke config with every layer `name`: the `lm` config refuses a mechanism it cannot also decode
  (longformer) or train causally (yoso_e, soft) by name (tests/test_config_validation.py), so the model-level
  behaviour is reached through the layers."""
  config = load_config("lm:smoke", lock=False)
  config.model.layers = (name,) * len(config.model.layers)
  return config


def test_causal_longformer_in_the_lm_is_causal():
  config = _lm_config_with("longformer")
  config.model.attention["longformer"] = {**config.model.attention.get("longformer", {}), "window": 4}
  info = ml_collections.ConfigDict(dict(seq_len=12, vocab_size=17, num_classes=0))
  built = build_model(config.model, info)
  tokens = jnp.asarray(np.random.default_rng(2).integers(1, 17, (2, 12)), jnp.int32)
  params = jax.jit(built.module.init)(jax.random.key(0), tokens)["params"]
  forward = jax.jit(lambda t: built.module.apply({"params": params}, t))
  logits = np.asarray(forward(tokens))
  for t in (0, 5, 10):
    other = np.asarray(forward(tokens.at[:, t + 1 :].set((tokens[:, t + 1 :] + 3) % 17)))
    np.testing.assert_allclose(other[:, : t + 1], logits[:, : t + 1], rtol=1e-6, atol=1e-6, err_msg=f"t={t}")
  _finite_grads(lambda p: jnp.mean(built.module.apply({"params": p}, tokens) ** 2), params)


def test_causal_longformer_in_the_decision_transformer():
  pytest.importorskip("gymnasium")
  from primal_jax.tasks.offline_rl.input_pipeline import RLDatasetInfo

  config = load_config("d4rl:model=longformer,smoke", lock=False)
  config.model.attention["longformer"] = {**config.model.attention.get("longformer", {}), "window": 4}
  info = RLDatasetInfo("hopper-medium", 0, 11, 5, 1000, {"train": 10}, (), state_dim=11, act_dim=3, env="hopper")
  built = build_model(config.model, info)
  x = [np.zeros((2, 5, 11), np.float32), np.zeros((2, 5, 3), np.float32), np.zeros((2, 5, 1), np.float32)]
  x = [a + np.random.default_rng(i).standard_normal(a.shape).astype(np.float32) for i, a in enumerate(x)]
  x += [np.tile(np.arange(5, dtype=np.int32), (2, 1)), np.ones((2, 5), np.int32)]
  params = jax.jit(built.module.init)(jax.random.key(0), *x)["params"]
  forward = jax.jit(lambda *inputs: built.module.apply({"params": params}, *inputs))
  out = np.asarray(forward(*x))
  assert out.shape == (2, 5, 3)
  changed = [a.copy() for a in x]
  changed[0][:, 3:] += 1.0  # states after step 2 never change the actions predicted at steps <= 2
  np.testing.assert_allclose(np.asarray(forward(*changed))[:, :3], out[:, :3], atol=1e-6)
  assert not np.allclose(np.asarray(forward(*changed))[:, 3], out[:, 3], atol=1e-4)
  _finite_grads(lambda p: jnp.mean(built.module.apply({"params": p}, *x) ** 2), params)


@pytest.mark.parametrize("name", ["yoso_e", "soft"])
def test_non_causal_mechanisms_are_refused_by_causal_models(name):
  with pytest.raises(ConfigError, match="has no causal form"):  # by the config, before anything is built
    load_config(f"lm:model={name},smoke", lock=False)
  config = _lm_config_with(name)  # and by the model, built another way
  built = build_model(config.model, ml_collections.ConfigDict(dict(seq_len=8, vocab_size=17, num_classes=0)))
  with pytest.raises(ValueError, match="causal"):
    built.module.init(jax.random.key(0), jnp.ones((1, 8), jnp.int32))
