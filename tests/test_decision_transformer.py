"""Tests of primal_jax.models.decision_transformer and primal_jax.attention.gpt2.

Parity with the release's PyTorch model is in tests/test_convert.py (shipped case `rl_primal_dt`) and
tests/test_convert_rl.py (synthetic cases, Hugging Face); here: causality, the two masking modes, the
two `get_action`s, the MLP activation option and GPT-2's masking arithmetic.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from primal_jax.attention import SoftmaxAttention, get_attention
from primal_jax.attention.gpt2 import GPT2Attention
from primal_jax.ksvd import RELEASE_SEQUENCE, ksvd_loss_per_sample
from primal_jax.models import DecisionTransformer, TransformerConfig, dt_config
from primal_jax.models.blocks import MlpBlock, TransformerStack
from primal_jax.models.decision_transformer import action_mse, get_action, with_masking

# Compares with float64 NumPy or golden numbers at float32 tolerances: full float32 matmuls on every platform.
pytestmark = pytest.mark.matmul_precision("highest")

STATE, ACT, K, EP = 3, 2, 5, 40
SIZES = dict(num_layers=2, dim=16, num_heads=2, low_rank=4, hidden_dim=24)


def _batch(seed=0, batch=3, k=K):
  rng = np.random.default_rng(seed)
  return dict(
    states=jnp.asarray(rng.standard_normal((batch, k, STATE)), jnp.float32),
    actions=jnp.asarray(rng.uniform(-1, 1, (batch, k, ACT)), jnp.float32),
    returns_to_go=jnp.asarray(rng.uniform(0, 3, (batch, k, 1)), jnp.float32),
    timesteps=jnp.asarray(rng.integers(0, EP - k, (batch, 1)) + np.arange(k), jnp.int32),
  )


def _model(masking="release", primal=True):
  return DecisionTransformer(dt_config(primal, **SIZES), state_dim=STATE, act_dim=ACT, max_ep_len=EP, masking=masking)


@functools.cache
def _params(primal=True):
  b = _batch()
  variables = _model(primal=primal).init(
    jax.random.key(0), b["states"], b["actions"], b["returns_to_go"], b["timesteps"]
  )
  return nn.unbox(variables["params"])


@functools.cache
def _forward(masking, primal=True):
  """Jitted (state, action, return preds, ksvd per sample) of a masking mode."""
  model = _model(masking, primal)

  def run(params, states, actions, rtg, timesteps, mask):
    preds, state = model.apply({"params": params}, states, actions, rtg, timesteps, mask, mutable=["ksvd"])
    return (*preds, ksvd_loss_per_sample(state.get("ksvd", {}), RELEASE_SEQUENCE, allow_empty=not primal))

  return jax.jit(run)


def _run(masking, b, mask, primal=True):
  out = _forward(masking, primal)(_params(primal), b["states"], b["actions"], b["returns_to_go"], b["timesteps"], mask)
  return [np.asarray(o) for o in out]


# ============================================================================ configuration and parameters


def test_dt_config_is_the_paper_model():
  cfg = dt_config()
  assert (cfg.num_layers, cfg.dim, cfg.num_heads, cfg.hidden_dim) == (3, 256, 4, 1024)
  assert cfg.layer_names == ("gpt2", "gpt2", "primal")
  assert cfg.layers[-1].kwargs == {"low_rank": 32, "data_dependent": False}
  assert (cfg.activation, cfg.layer_norm_eps, cfg.init_style) == ("relu", 1e-5, "gpt2")
  assert dt_config(False, num_layers=2).layer_names == ("gpt2", "gpt2")
  assert dt_config(False, num_layers=2, softmax="softmax").layer_names == ("softmax", "softmax")
  with pytest.raises(ValueError, match="num_layers"):
    dt_config(num_layers=0)


def test_with_masking_sets_only_the_primal_layers():
  cfg = dt_config(**SIZES)
  release, aware = with_masking(cfg, "release"), with_masking(cfg, "padding_aware")
  assert release.layers[-1].kwargs["sampling"] == "release" and release.layers[-1].kwargs["mask_outputs"] is False
  assert aware.layers[-1].kwargs["sampling"] == "padding_aware" and aware.layers[-1].kwargs["mask_outputs"] is True
  assert release.layers[0] == cfg.layers[0] and not aware.mask_final
  with pytest.raises(ValueError, match="masking"):
    with_masking(cfg, "left")


def test_parameter_tree_reuses_the_encoder_block_names():
  params = _params()
  assert set(params) == {
    "embed_timestep",
    "embed_return",
    "embed_state",
    "embed_action",
    "embed_ln",
    "transformer",
    "predict_action",
    "predict_state",
    "predict_return",
  }
  assert params["embed_timestep"]["embedding"].shape == (EP, 16)
  block0, block1 = params["transformer"]["block_0"], params["transformer"]["block_1"]
  assert set(block0) == {"norm1", "attention", "norm2", "mlp"} and set(block0["mlp"]) == {"fc_in", "fc_out"}
  assert set(block0["attention"]) == {"query", "key", "value", "out"}
  assert block1["attention"]["We"].shape == (2, 8, 4)  # data-independent [H, p, s]
  assert "final_norm" in params["transformer"]


def test_input_errors_name_the_argument():
  model, b = _model(), _batch()
  args = [b["states"], b["actions"], b["returns_to_go"], b["timesteps"]]
  init = functools.partial(model.init, jax.random.key(0))
  with pytest.raises(ValueError, match="actions must have shape"):
    init(args[0], args[1][:, :, :1], *args[2:])
  with pytest.raises(ValueError, match="states must have shape"):
    init(args[0][..., :2], *args[1:])
  with pytest.raises(ValueError, match="timesteps must be integers"):
    init(*args[:3], args[3].astype(jnp.float32))
  with pytest.raises(ValueError, match="attention_mask must have shape"):
    init(*args, jnp.ones((3, K + 1)))
  with pytest.raises(ValueError, match="masking"):
    model.clone(masking="both").init(jax.random.key(0), *args)


# ============================================================================ causality and padding


@pytest.mark.parametrize("masking", ["release", "padding_aware"])
@pytest.mark.parametrize("primal", [True, False])
def test_action_at_t_never_sees_a_t_or_later_tokens(masking, primal):
  """Perturbing a_t, R_>t, s_>t, a_>t (and their timesteps) leaves the actions predicted at real steps <= t
  bit-identical. Sample 1 is right-padded, sample 2 left-padded; see the next test for the release's leak."""
  b = _batch(1)
  mask = jnp.asarray([[1] * K, [1] * (K - 2) + [0, 0], [0, 0] + [1] * (K - 2)], jnp.int32)
  real = np.asarray(mask, bool)
  checked = [0, 1] if (masking == "release" and primal) else [0, 1, 2]
  base = _run(masking, b, mask, primal)[1]
  for t in range(K):
    got = _run(masking, _perturb_after(b, t), mask, primal)[1]
    for i in checked:
      steps = real[i, : t + 1]
      np.testing.assert_array_equal(got[i, : t + 1][steps], base[i, : t + 1][steps], err_msg=f"t={t}, sample {i}")
    if t < K - 1:
      assert not np.allclose(got[0, t + 1 :], base[0, t + 1 :])  # the perturbation does act


def test_release_left_padding_breaks_causality():
  """The release's quirk (kept for parity): a left-padded query has no real key before it, so GPT-2's masking
  spreads it over FUTURE real keys; the mask-blind Primal layer averages those padded rows into the running
  means of real steps, so a real step's action depends on later tokens. Padding-aware masking removes it."""
  b = _batch(1)
  mask = jnp.asarray([[0, 0] + [1] * (K - 2)] * 3, jnp.int32)
  t = 2  # the first real step
  for masking, leaks in (("release", True), ("padding_aware", False)):
    base, got = _run(masking, b, mask)[1], _run(masking, _perturb_after(b, t), mask)[1]
    assert (np.max(np.abs(got[:, t] - base[:, t])) > 1e-6) == leaks, masking


def _perturb_after(b, t, seed=2):
  """The batch with a_t and every token of steps > t (values and timesteps) changed."""
  rng = np.random.default_rng(seed + t)
  future = (np.arange(K) > t)[None, :, None]
  return dict(
    actions=b["actions"] + jnp.asarray((np.arange(K) >= t)[None, :, None] * rng.normal(size=(3, K, ACT)), jnp.float32),
    states=b["states"] + jnp.asarray(future * rng.normal(size=(3, K, STATE)), jnp.float32),
    returns_to_go=b["returns_to_go"] + jnp.asarray(future * rng.normal(size=(3, K, 1)), jnp.float32),
    timesteps=jnp.where(jnp.asarray(future[..., 0]), (b["timesteps"] + 7) % EP, b["timesteps"]),
  )


def _padded_batch():
  """Sample 0 unpadded, 1 left-padded (2 steps), 2 right-padded (2 steps)."""
  mask = jnp.asarray([[1] * K, [0, 0] + [1] * (K - 2), [1] * (K - 2) + [0, 0]], jnp.int32)
  return _batch(3), mask


def _repad(b, mask, seed):
  """The same batch with other values at the padded steps."""
  rng = np.random.default_rng(seed)
  pad = ~np.asarray(mask, bool)
  out = {}
  for k, v in b.items():
    noise = rng.integers(1, EP - K, v.shape) if k == "timesteps" else rng.normal(size=v.shape) * 5
    where = pad if v.ndim == 2 else pad[..., None]
    out[k] = jnp.asarray(np.where(where, noise, np.asarray(v)), v.dtype)
  return out


def test_padding_aware_real_outputs_ignore_padded_steps():
  b, mask = _padded_batch()
  real = np.asarray(mask, bool)
  base = _run("padding_aware", b, mask)
  other = _run("padding_aware", _repad(b, mask, 4), mask)
  for a, c in zip(base[:3], other[:3], strict=True):
    np.testing.assert_allclose(a[real], c[real], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(base[3], other[3], rtol=1e-5, atol=1e-9)  # KSVD: padded tokens never enter


def test_release_masking_leaks_left_padding_only():
  """The release's quirk, kept for parity: left padding reaches real outputs through the Primal running means."""
  b, mask = _padded_batch()
  base, other = _run("release", b, mask), _run("release", _repad(b, mask, 4), mask)
  np.testing.assert_array_equal(base[1][0], other[1][0])
  np.testing.assert_allclose(base[1][2, :3], other[1][2, :3], rtol=1e-5, atol=1e-6)  # right padding: causal, safe
  assert np.max(np.abs(base[1][1, 2:] - other[1][1, 2:])) > 1e-4  # left padding leaks
  assert base[3][0] == other[3][0] and base[3][1] != other[3][1] and base[3][2] != other[3][2]  # KSVD: all tokens


def test_padding_aware_left_padding_equals_the_unpadded_suffix():
  b, mask = _padded_batch()
  padded = _run("padding_aware", b, mask)
  suffix = {k: v[1:2, 2:] for k, v in b.items()}
  alone = [np.asarray(o) for o in _model("padding_aware").apply({"params": _params()}, *suffix.values())]
  for a, c in zip(padded[:3], alone, strict=True):
    np.testing.assert_allclose(a[1, 2:], c[0], rtol=1e-5, atol=1e-6)


def test_padding_aware_primal_outputs_at_padded_tokens_are_the_bias():
  """mask_outputs=True: a padded token's Primal output carries nothing but the output bias."""
  b, mask = _padded_batch()
  model = _model("padding_aware")
  _, state = model.apply(
    {"params": _params()},
    *b.values(),
    mask,
    capture_intermediates=lambda m, name: name == "__call__" and m.path == ("transformer", "block_1", "attention"),
  )
  out = np.asarray(state["intermediates"]["transformer"]["block_1"]["attention"]["__call__"][0])  # [B, 3K, D]
  pad = ~np.repeat(np.asarray(mask, bool), 3, axis=1)
  bias = np.asarray(_params()["transformer"]["block_1"]["attention"]["out"]["bias"])
  np.testing.assert_allclose(out[pad], np.broadcast_to(bias, out[pad].shape), atol=1e-6)


# ============================================================================ get_action


def _history(steps, seed=5):
  rng = np.random.default_rng(seed)
  actions = rng.uniform(-1, 1, (steps, ACT)).astype(np.float32)
  actions[-1] = 0.0
  return (
    rng.standard_normal((steps, STATE)).astype(np.float32),
    actions,
    (3.0 - 0.1 * np.arange(steps, dtype=np.float32))[None],  # [1, T] as the release passes it
    np.arange(steps)[None],
  )


def test_get_action_uses_the_last_k_steps():
  states, actions, rtg, ts = _history(K + 3)
  model, params = _model(), _params()
  for pad in (True, False):
    got = get_action(model, params, states, actions, rtg, ts, context=K, pad=pad)
    last = model.apply({"params": params}, states[None, -K:], actions[None, -K:], rtg[0, -K:, None][None], ts[:, -K:])
    np.testing.assert_allclose(got, last[1][0, -1], rtol=1e-6, atol=1e-7)


def test_get_action_short_history_release_vs_left_padded():
  states, actions, rtg, ts = _history(2)
  params = _params()
  release = [get_action(_model("release"), params, states, actions, rtg, ts, context=K, pad=p) for p in (False, True)]
  aware = [
    get_action(_model("padding_aware"), params, states, actions, rtg, ts, context=K, pad=p) for p in (False, True)
  ]
  assert np.max(np.abs(release[0] - release[1])) > 1e-5  # the release's Primal layer sees the zero padding
  np.testing.assert_allclose(aware[0], aware[1], rtol=1e-5, atol=1e-6)  # padding-aware: padding is invisible
  np.testing.assert_allclose(aware[0], release[0], rtol=1e-5, atol=1e-6)  # no padding: the modes agree
  with pytest.raises(ValueError, match="context"):
    get_action(_model(), params, states, actions, rtg, ts, context=0)
  with pytest.raises(ValueError, match="actions must have 2 steps"):
    get_action(_model(), params, states, actions[:1], rtg, ts, context=K)


# ============================================================================ training-mode pieces


def test_action_mse_counts_real_steps_only():
  preds, target = jnp.zeros((2, 3, 2)), jnp.ones((2, 3, 2))
  target = target.at[1, 0].set(100.0)
  mask = jnp.asarray([[1, 1, 1], [0, 1, 1]])
  assert float(action_mse(preds, target, mask)) == pytest.approx(1.0)
  assert float(action_mse(preds, jnp.ones((2, 3, 2)))) == pytest.approx(1.0)


def test_dropout_training_step_has_finite_gradients():
  b, mask = _padded_batch()
  model = _model("padding_aware")

  def loss(params):
    (_, acts, _), state = model.apply(
      {"params": params}, *b.values(), mask, deterministic=False, rngs={"dropout": jax.random.key(1)}, mutable=["ksvd"]
    )
    return action_mse(acts, b["actions"], mask) + 0.05 * jnp.mean(ksvd_loss_per_sample(state["ksvd"]))

  grads = jax.jit(jax.grad(loss))(_params())
  leaves = jax.tree.leaves(grads)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
  assert float(jnp.abs(grads["transformer"]["block_1"]["attention"]["Lambda"]).sum()) > 0


# ============================================================================ MLP activation and GPT-2 attention


@pytest.mark.parametrize(
  "activation,exact,fn",
  [
    ("relu", True, lambda h: np.maximum(h, 0)),
    ("gelu", True, lambda h: 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))),
    ("gelu", False, lambda h: np.asarray(jax.nn.gelu(h, approximate=True))),
    ("gelu_tanh", True, lambda h: np.asarray(jax.nn.gelu(h, approximate=True))),
  ],
)
def test_mlp_activation(activation, exact, fn):
  cfg = TransformerConfig(
    layers=("softmax",), dim=4, hidden_dim=6, num_heads=1, activation=activation, exact_gelu=exact
  )
  x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 4)), jnp.float32)
  block = MlpBlock(cfg)
  params = nn.unbox(block.init(jax.random.key(0), x, True)["params"])
  h = np.asarray(x) @ np.asarray(params["fc_in"]["kernel"]) + np.asarray(params["fc_in"]["bias"])
  want = fn(h) @ np.asarray(params["fc_out"]["kernel"]) + np.asarray(params["fc_out"]["bias"])
  np.testing.assert_allclose(block.apply({"params": params}, x, True), want, rtol=1e-5, atol=1e-6)


def test_activation_must_be_known():
  with pytest.raises(ValueError, match="activation"):
    TransformerConfig(activation="swish")


def _gpt2_numpy(q, k, v, token_mask):
  """GPT-2's rule on [B, N, H, p] arrays: future scores replaced by -1e4, (1 - m) * -1e4 added."""
  w = np.einsum("bnhd,bmhd->bhnm", q, k) / math.sqrt(q.shape[-1])
  n = q.shape[1]
  w = np.where(np.tril(np.ones((n, n), bool)), w, -1e4) + (1.0 - token_mask)[:, None, None, :] * -1e4
  w = np.exp(w - w.max(-1, keepdims=True))
  return np.einsum("bhnm,bmhd->bnhd", w / w.sum(-1, keepdims=True), v)


def test_gpt2_attention_masking_arithmetic():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((2, 6, 8)), jnp.float32)
  mask = jnp.asarray([[1] * 6, [0, 0, 0, 1, 1, 1]], jnp.float32)
  gpt2 = GPT2Attention(num_heads=2, causal=True)
  params = nn.unbox(gpt2.init(jax.random.key(0), x)["params"])
  out = np.asarray(gpt2.apply({"params": params}, x, mask=mask))
  soft = np.asarray(SoftmaxAttention(num_heads=2, causal=True).apply({"params": params}, x, mask=mask))
  proj = {
    r: np.einsum("bnd,dhp->bnhp", np.asarray(x), params[r]["kernel"]) + params[r]["bias"]
    for r in ("query", "key", "value")
  }
  heads = _gpt2_numpy(proj["query"], proj["key"], proj["value"], np.asarray(mask))
  want = np.einsum("bnhp,hpd->bnd", heads, params["out"]["kernel"]) + params["out"]["bias"]
  np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
  real_rows = np.asarray([[True] * 6, [False] * 3 + [True] * 3])
  np.testing.assert_allclose(out[real_rows], soft[real_rows], rtol=1e-5, atol=1e-6)  # rows with a real key agree
  assert np.max(np.abs(out[~real_rows] - soft[~real_rows])) > 1e-3  # left-padded rows: GPT-2 sees future keys
  assert get_attention("gpt2") is GPT2Attention
  with pytest.raises(ValueError, match="mask must have shape"):
    gpt2.apply({"params": params}, x, mask=jnp.ones((2, 5)))


@pytest.mark.parametrize("masking", ["release", "padding_aware"])
def test_token_by_token_decoding_equals_the_full_forward(masking):
  """The DT body decodes one token at a time (softmax key/value caches, the Primal layer's running sums)
  and gives the full forward's hidden states; rollouts may use either (`get_action` runs the full forward)."""
  b = _batch(6, batch=2)
  model, params = _model(masking), _params()
  capture = lambda m, name: name == "__call__" and m.path in (("embed_ln",), ("transformer",))  # noqa: E731
  _, state = model.apply({"params": params}, *b.values(), capture_intermediates=capture)
  tokens = state["intermediates"]["embed_ln"]["__call__"][0]  # [B, 3K, D]
  full = np.asarray(state["intermediates"]["transformer"]["__call__"][0])
  stack = TransformerStack(with_masking(model.config, masking), causal=True, decode=True)
  cache = stack.init(jax.random.key(0), tokens)["cache"]
  step = jax.jit(lambda c, x: stack.apply({"params": params["transformer"], "cache": c}, x, mutable=["cache"]))
  outs = []
  for i in range(tokens.shape[1]):
    out, updated = step(cache, tokens[:, i : i + 1])
    cache = updated["cache"]
    outs.append(np.asarray(out))
  np.testing.assert_allclose(np.concatenate(outs, axis=1), full, rtol=1e-5, atol=1e-5)
