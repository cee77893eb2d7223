"""Tests of primal_jax.models: classifier families, pooling, two-tower model, causal LM decoding, init, errors."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from primal_jax.ksvd import RELEASE_LRA, KSVDTerms, collect_terms, ksvd_loss
from primal_jax.models import (
  CausalLM,
  DualSequenceClassifier,
  SequenceClassifier,
  TokenEmbedding,
  TokenEncoder,
  TransformerConfig,
  decode_step,
  init_cache,
  make_config,
  model_layers,
  pool,
)
from primal_jax.models.classifier import ClassifierHead
from primal_jax.models.config import stack_name

# Compares with float64 NumPy or golden numbers at float32 tolerances: full float32 matmuls on every platform.
pytestmark = pytest.mark.matmul_precision("highest")

B, N, VOCAB, CLASSES = 2, 12, 11, 3
TINY = dict(
  vocab_size=VOCAB,
  max_len=16,
  dim=16,
  hidden_dim=32,
  num_heads=2,
  attention={"primal": dict(low_rank=3, rank_multi=2)},
  num_classes=CLASSES,
  dropout_rate=0.0,
  attention_dropout_rate=0.0,
)
LM = dict(TINY, attention={"primal": dict(low_rank=3, rank_multi=2, data_dependent=False)})
MODELS = ("primalformer", "primal_plus", "softmax")


def _tokens(seed, shape=(B, N), vocab=VOCAB):
  return jnp.asarray(np.random.default_rng(seed).integers(1, vocab, shape), jnp.int32)


def _mask(pads=(0, 5), length=N):
  return jnp.asarray(np.stack([np.arange(length) < length - k for k in pads]).astype(np.float32))


def _init(model, *args, seed=0):
  """Real initialisation (used where the init itself is tested); jitted, which compiles faster than eager."""
  return nn.unbox(jax.jit(model.init)(jax.random.key(seed), *args))


@functools.cache
def _classifier_variables(config: TransformerConfig):
  """`_variables` of a SequenceClassifier for [B, N] inputs, shared by the tests that use the same config."""
  return _variables(SequenceClassifier(config), _tokens(0), _mask())


def _variables(model, *args, seed=0):
  """Random variables with the shapes `init` gives, without compiling the initialisers (fast tests).

  Weights ~ N(0, 0.3^2), LayerNorm scales 1 + N(0, 0.1^2), Lambda ~ U[0, 1).
  """
  shapes = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), *args)))
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    name = jax.tree_util.keystr(path)
    if name.endswith("['Lambda']"):
      value = rng.uniform(0.0, 1.0, leaf.shape)
    elif name.endswith("['scale']"):
      value = 1.0 + 0.1 * rng.standard_normal(leaf.shape)
    else:
      value = 0.3 * rng.standard_normal(leaf.shape)
    return jnp.asarray(value, leaf.dtype)

  return jax.tree_util.tree_map_with_path(draw, shapes)


def _rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


# ============================================================================ SequenceClassifier families


def test_model_layers_and_stack_name():
  assert model_layers("primalformer", 3) == ("primal", "primal", "primal")
  assert model_layers("primal_plus", 3) == ("softmax", "softmax", "primal")
  assert model_layers("primal_plus", 3, num_primal=2) == ("softmax", "primal", "primal")
  assert model_layers("softmax", 2) == ("softmax", "softmax")
  assert model_layers("performer", 2) == ("performer", "performer")
  assert model_layers("primal_plus", 1) == ("primal",)
  for model in ("primal_plus", "softmax", "performer"):
    assert stack_name(model_layers(model, 3)) == model
  assert stack_name(model_layers("primalformer", 2)) == "primalformer"
  assert stack_name(("primal", "softmax")) == "primal+softmax"


@pytest.mark.parametrize("family,num_layers", [("primalformer", 2), ("primal_plus", 3), ("softmax", 2)])
def test_classifier_forward_and_ksvd_collection(family, num_layers):
  config = make_config(family, num_layers, **TINY)
  model = SequenceClassifier(config)
  tokens, mask = _tokens(0), _mask()
  variables = _classifier_variables(config)
  assert set(variables) == {"params"}, "init must not return sown collections"
  logits, state = jax.jit(lambda v: model.apply(v, tokens, mask, mutable=["ksvd", "intermediates"]))(variables)
  assert logits.shape == (B, CLASSES) and logits.dtype == jnp.float32
  assert np.all(np.isfinite(logits))
  encoder_out = state["intermediates"]["encoder_out"][0]
  assert encoder_out.shape == (B, N, TINY["dim"])
  np.testing.assert_array_equal(encoder_out[1, N - 5 :], 0.0)  # release: final LN output times the mask

  primal_blocks = {f"block_{i}" for i, name in enumerate(config.layer_names) if name == "primal"}
  assert len(primal_blocks) == {"primalformer": num_layers, "primal_plus": 1, "softmax": 0}[family]
  terms = collect_terms(state.get("ksvd", {}))
  assert len(terms) == len(primal_blocks)
  assert all(isinstance(t, KSVDTerms) for t in terms)
  if primal_blocks:
    assert set(state["ksvd"]["body"]["encoder"]) == primal_blocks
    for t in terms:
      assert t.energy_e_sq.shape == (B, TINY["num_heads"]) and t.count.shape == (B,)
      np.testing.assert_array_equal(t.count, N)  # release sampling: every position enters the means
  else:
    assert "ksvd" not in state or not jax.tree.leaves(state["ksvd"])
    assert float(ksvd_loss(state.get("ksvd", {}), RELEASE_LRA, allow_empty=True)) == 0.0


def test_classifier_dropout():
  config = make_config("primalformer", 2, **dict(TINY, dropout_rate=0.2, attention_dropout_rate=0.2))
  model = SequenceClassifier(config)
  tokens, mask = _tokens(1), _mask()
  variables = _classifier_variables(make_config("primalformer", 2, **TINY))  # same shapes
  apply = jax.jit(lambda rng: model.apply(variables, tokens, mask, deterministic=False, rngs={"dropout": rng}))
  eval_1 = jax.jit(lambda: model.apply(variables, tokens, mask, deterministic=True))()
  # deterministic=True switches every dropout off: equal to the same model without dropout (rate 0).
  no_dropout = SequenceClassifier(make_config("primalformer", 2, **TINY))
  eval_0 = jax.jit(lambda: no_dropout.apply(variables, tokens, mask, deterministic=False))()
  np.testing.assert_allclose(eval_1, eval_0, rtol=1e-6, atol=1e-6)
  # "rbg" keys: the dropout wiring does not depend on the PRNG, and they compile 2x faster than threefry.
  key = lambda seed: jax.random.key(seed, impl="rbg")
  train_a, train_a2, train_b = apply(key(7)), apply(key(7)), apply(key(8))
  np.testing.assert_array_equal(train_a, train_a2)  # same dropout key, same output
  assert not np.allclose(train_a, eval_1, atol=1e-4)
  assert not np.allclose(train_a, train_b, atol=1e-4)
  with pytest.raises(Exception, match="dropout"):
    model.apply(variables, tokens, mask, deterministic=False)


# ============================================================================ pooling


def test_pool_against_numpy():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((3, 5, 4)).astype(np.float32)
  mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 1, 0, 1, 1]], np.float32)
  np.testing.assert_allclose(pool(x, mask, "mean"), x.mean(axis=1), rtol=1e-6)
  np.testing.assert_allclose(pool(x, None, "mean"), x.mean(axis=1), rtol=1e-6)
  expected = np.stack([x[b][mask[b] > 0].mean(axis=0) for b in range(3)])
  np.testing.assert_allclose(pool(x, mask, "masked_mean"), expected, rtol=1e-6)
  np.testing.assert_allclose(pool(x, mask > 0, "masked_mean"), expected, rtol=1e-6)  # boolean mask
  np.testing.assert_array_equal(pool(x, mask, "cls"), x[:, 0])
  # All-padding row: zeros instead of NaN.
  np.testing.assert_array_equal(pool(x, np.zeros_like(mask), "masked_mean"), 0.0)


# ============================================================================ DualSequenceClassifier


def test_dual_classifier_shares_encoder_and_builds_head_input():
  config = make_config("primal_plus", 2, **dict(TINY, pooling="masked_mean"))
  model = DualSequenceClassifier(config)
  ta, tb = _tokens(2), _tokens(3)
  ma, mb = _mask((0, 4)), _mask((3, 0))
  params = _variables(model, ta, tb, ma, mb)["params"]
  assert set(params) == {"body", "head"}  # one encoder subtree for both documents
  assert set(params["body"]) == {"embed", "encoder"}
  assert params["head"]["hidden"]["kernel"].shape == (4 * config.dim, config.hidden_dim)

  @jax.jit
  def manual(p, t_1, t_2, m_1, m_2):
    """Encodes each document with the shared `body`, pools, and applies `head` to [u, v, u*v, u-v]."""
    encode = lambda t, m: pool(TokenEncoder(config).apply({"params": p["body"]}, t, m), m, config.pooling)
    u, v = encode(t_1, m_1), encode(t_2, m_2)
    features = jnp.concatenate([u, v, u * v, u - v], -1)
    return ClassifierHead(config, 4 * config.dim).apply({"params": p["head"]}, features), u, v

  apply = jax.jit(lambda p, *args: model.apply({"params": p}, *args))
  logits_ab, logits_ba = apply(params, ta, tb, ma, mb), apply(params, tb, ta, mb, ma)
  manual_ab, u, v = manual(params, ta, tb, ma, mb)
  manual_ba, v2, u2 = manual(params, tb, ta, mb, ma)
  # The same encoder on the same document: bit-equal on a CPU; on a GPU the two calls in one program may be
  # fused into different kernels (seen on an H200: 7.7e-7 relative), so equal to float32 rounding.
  np.testing.assert_allclose(u, u2, rtol=2e-6, atol=1e-7)
  np.testing.assert_allclose(logits_ab, manual_ab, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(logits_ba, manual_ba, rtol=1e-5, atol=1e-6)
  assert not np.allclose(logits_ab, logits_ba, atol=1e-4)

  # A head that weighs u and v alike and ignores u - v is symmetric: the swap then changes nothing.
  d = config.dim
  kernel = params["head"]["hidden"]["kernel"]
  sym = kernel.at[d : 2 * d].set(kernel[:d]).at[3 * d :].set(0.0)
  sym_params = {**params, "head": {**params["head"], "hidden": {**params["head"]["hidden"], "kernel": sym}}}
  sym_ab, sym_ba = apply(sym_params, ta, tb, ma, mb), apply(sym_params, tb, ta, mb, ma)
  np.testing.assert_allclose(sym_ab, sym_ba, rtol=1e-5, atol=1e-6)
  # ... and restoring only the u - v block brings the asymmetry back.
  asym = sym.at[3 * d :].set(kernel[3 * d :])
  asym_params = {**params, "head": {**params["head"], "hidden": {**params["head"]["hidden"], "kernel": asym}}}
  asym_ab, asym_ba = apply(asym_params, ta, tb, ma, mb), apply(asym_params, tb, ta, mb, ma)
  assert not np.allclose(asym_ab, asym_ba, atol=1e-4)


# ============================================================================ CausalLM


@functools.cache
def _lm(family):
  """(model, params, tokens, jitted full forward), shared by the causality and decoding tests."""
  model = CausalLM(make_config(family, 2, **LM))
  tokens = _tokens(4)
  params = _variables(model, tokens)["params"]
  return model, params, tokens, jax.jit(lambda t: model.apply({"params": params}, t))


@pytest.mark.parametrize("family", MODELS)
def test_causal_lm_is_causal(family):
  model, params, tokens, forward = _lm(family)
  logits = forward(tokens)
  assert logits.shape == (B, N, VOCAB)
  for t in (0, 5, N - 2):
    changed = tokens.at[:, t + 1 :].set((tokens[:, t + 1 :] + 3) % VOCAB)
    other = forward(changed)
    np.testing.assert_allclose(other[:, : t + 1], logits[:, : t + 1], rtol=1e-6, atol=1e-6, err_msg=f"t={t}")
    assert not np.allclose(other[:, t + 1], logits[:, t + 1], atol=1e-4)


@pytest.mark.parametrize("family", ["primalformer", "primal_plus"])
def test_decode_equals_full_forward(family):
  """Token by token, and a prefix chunk then tokens, reproduce the full causal forward."""
  model, params, tokens, forward = _lm(family)
  expected = np.asarray(forward(tokens))
  step = jax.jit(lambda cache, chunk: decode_step(model, params, cache, chunk))

  for chunks in ([1] * N, [4] + [1] * (N - 4)):
    cache, outs, start = init_cache(model, B), [], 0
    for size in chunks:
      logits, cache = step(cache, tokens[:, start : start + size])
      outs.append(logits)
      start += size
    got = np.concatenate(outs, axis=1)
    assert _rel(got, expected) <= 1e-5, f"{family} {chunks}: {_rel(got, expected):.2e}"
    assert int(cache["position"]) == N


def test_primal_cache_independent_of_max_len():
  shapes = {}
  for max_len in (16, 40):
    model = CausalLM(make_config("primal_plus", 2, **dict(LM, max_len=max_len)))
    shapes[max_len] = jax.tree.map(lambda x: x.shape, init_cache(model, B))
  primal_16, primal_40 = (shapes[m]["decoder"]["block_1"]["attention"] for m in (16, 40))
  p = LM["dim"] // LM["num_heads"]
  assert primal_16 == primal_40 == {"sum_q": (B, 2, p), "sum_k": (B, 2, p), "count": (B,)}
  softmax_16, softmax_40 = (shapes[m]["decoder"]["block_0"]["attention"] for m in (16, 40))
  assert softmax_16["cached_key"] == (B, 2, p, 16) and softmax_40["cached_key"] == (B, 2, p, 40)


def test_causal_lm_rejects_data_dependent_primal():
  model = CausalLM(make_config("primalformer", 1, **TINY))  # the Primal option data_dependent=True
  with pytest.raises(ValueError, match="data_dependent"):
    jax.eval_shape(model.init, jax.random.key(0), _tokens(0))


# ============================================================================ release ("torch") initialisation


def test_torch_init_style_linears_and_primal_parameters():
  config = make_config("primal_plus", 2, **TINY)
  assert config.init_style == "torch"  # the default
  params = _init(SequenceClassifier(config), _tokens(0), _mask())["params"]
  d, hid, s = config.dim, config.hidden_dim, config.layers[-1].kwargs["low_rank"]
  fan_in = {"query": d, "key": d, "value": d, "out": d, "combine": 2 * s, "fc_in": d, "fc_out": hid}
  layers = {}
  for i in range(config.num_layers):
    block = params["body"]["encoder"][f"block_{i}"]
    for name, sub in {**block["attention"], **block["mlp"]}.items():
      if name in fan_in:
        layers[f"block_{i}/{name}"] = (sub, fan_in[name])
  layers["head/hidden"] = (params["head"]["hidden"], d)
  layers["head/logits"] = (params["head"]["logits"], hid)
  assert {"block_0/value", "block_1/combine", "block_1/out", "block_1/fc_out"} <= set(layers)
  for name, (sub, fan) in layers.items():
    bound = 1.0 / math.sqrt(fan)
    for leaf in ("kernel", "bias"):
      w = np.asarray(sub[leaf])
      assert np.all(np.abs(w) <= bound), f"{name}.{leaf} outside +-1/sqrt({fan})"
      if w.size >= 64:  # U(-b, b): the extremes come close to the bound
        assert np.max(np.abs(w)) > 0.8 * bound, f"{name}.{leaf} too narrow for U(+-1/sqrt({fan}))"

  primal = params["body"]["encoder"]["block_1"]["attention"]
  heads, n = config.num_heads, s * config.layers[-1].kwargs["rank_multi"]
  for name in ("We", "Wr"):
    w = np.asarray(primal[name])
    assert w.shape == (heads, n, s)
    flat = w.reshape(heads, n * s).astype(np.float64)
    np.testing.assert_allclose(flat @ flat.T, np.eye(heads), atol=1e-5, err_msg=f"{name}: rows of [H, n*s]")
    # Not per-head orthonormal columns (W[h]^T W[h] = I_s, what nn.initializers.orthogonal would give).
    assert abs(np.trace(w[0].T @ w[0]) - 1.0) < 1e-5
  assert not np.allclose(primal["We"], primal["Wr"])
  lam = np.asarray(primal["Lambda"])
  assert lam.shape == (heads, s) and np.all(lam >= 0.0) and np.all(lam < 1.0)
  assert len(np.unique(lam)) == lam.size


def test_torch_init_style_embeddings():
  """Release LRA Embeddings: both tables N(0, 0.02); tolerance 3% on the std (>= 32k draws each: ~0.4% noise)."""
  config = make_config("primalformer", 2, vocab_size=512, max_len=1024)
  tables = nn.unbox(
    TokenEmbedding(config).init(jax.random.key(0), _tokens(0, (1, 4)), jnp.arange(4)[None], deterministic=True)
  )["params"]
  for name, rows in (("tokens", 512), ("positions", 1024)):
    e = np.asarray(tables[name]["embedding"])
    assert e.shape == (rows, config.dim)
    assert abs(e.std() / 0.02 - 1.0) < 0.03, f"{name} std {e.std():.5f}"
    assert abs(e.mean()) < 0.02 * 0.03


def test_token_embedding_values_and_table_gradients_against_numpy():
  """Tokens and positions looked up per token; the tables' gradients are the float64 scatter-sums of the
  output cotangent over every (batch, position) that read a row. Tolerance 1e-6 relative (float32 sums of 6)."""
  config = make_config("primalformer", 1, vocab_size=VOCAB, max_len=16, dim=8, dropout_rate=0.0)
  tokens, positions = _tokens(3, (6, 10)), jnp.arange(10)[None]
  module = TokenEmbedding(config)
  params = nn.unbox(module.init(jax.random.key(1), tokens, positions, deterministic=True))["params"]
  cotangent = np.random.default_rng(4).normal(size=(6, 10, 8))
  out, vjp = jax.vjp(lambda p: module.apply({"params": p}, tokens, positions, deterministic=True), params)
  (grads,) = vjp(jnp.asarray(cotangent, jnp.float32))
  token_table = np.asarray(params["tokens"]["embedding"], np.float64)
  position_table = np.asarray(params["positions"]["embedding"], np.float64)
  np.testing.assert_allclose(out, token_table[np.asarray(tokens)] + position_table[None, :10], rtol=1e-6, atol=1e-7)
  expected_tokens = np.zeros_like(token_table)
  np.add.at(expected_tokens, np.asarray(tokens).ravel(), cotangent.reshape(-1, 8))
  expected_positions = np.zeros_like(position_table)
  expected_positions[:10] = cotangent.sum(axis=0)
  np.testing.assert_allclose(grads["tokens"]["embedding"], expected_tokens, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(grads["positions"]["embedding"], expected_positions, rtol=1e-6, atol=1e-6)


# ============================================================================ argument errors


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(model="transformer"), "model must be one of primalformer, primal_plus, cosformer, .*, softmax, yoso_e, got"),
    (dict(num_layers=0), "num_layers"),
    (dict(dim=30, num_heads=4), "dim=30 must be divisible by num_heads=4"),
    (dict(pooling="max"), "pooling"),
    (dict(init_style="jax"), "init_style"),
  ],
)
def test_make_config_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    make_config(**kwargs)


def test_config_layer_names_checked():
  with pytest.raises(ValueError, match="layers"):
    TransformerConfig(layers=("primal", "nope"))
  with pytest.raises(ValueError, match="layers"):
    TransformerConfig(layers=())


@pytest.mark.parametrize(
  "tokens,mask,match",
  [
    (jnp.ones((N,), jnp.int32), None, "tokens must have rank 2"),
    (jnp.ones((B, 17), jnp.int32), None, "tokens length 17 exceeds max_len=16"),
    (jnp.ones((B, N), jnp.float32), None, "tokens must be integer"),
    (jnp.ones((B, N), jnp.int32), jnp.ones((B, N - 1)), "mask must have the shape of tokens"),
    (jnp.ones((B, N), jnp.int32), jnp.ones((N,)), "mask must have the shape of tokens"),
  ],
)
def test_classifier_input_errors(tokens, mask, match):
  model = SequenceClassifier(make_config("primalformer", 1, **TINY))
  with pytest.raises(ValueError, match=match):
    jax.eval_shape(model.init, jax.random.key(0), tokens, mask)


def test_lm_and_dual_input_errors():
  """Raised while tracing (eval_shape: nothing is compiled)."""
  init = lambda model, *args: jax.eval_shape(model.init, jax.random.key(0), *args)
  lm = CausalLM(make_config("softmax", 1, **LM))
  with pytest.raises(ValueError, match="tokens must have rank 2"):
    init(lm, jnp.ones((N,), jnp.int32))
  with pytest.raises(ValueError, match="exceeds max_len"):
    init(lm, jnp.ones((1, 17), jnp.int32))
  with pytest.raises(ValueError, match="integer"):
    init(lm, jnp.ones((1, 4), jnp.float32))
  dual = DualSequenceClassifier(make_config("primalformer", 1, **TINY))
  t = jnp.ones((B, N), jnp.int32)
  with pytest.raises(ValueError, match="mask"):
    init(dual, t, t, jnp.ones((B, N)), jnp.ones((B, N + 1)))
  with pytest.raises(ValueError, match="tokens must have rank 2"):
    init(dual, t, t[0])


# ============================================================================ training step and bfloat16


def test_jitted_train_step_gradients_reach_every_parameter():
  config = make_config("primalformer", 2, **TINY)
  model = SequenceClassifier(config)
  tokens, mask = _tokens(5), _mask()
  labels = jnp.array([0, 2])
  params = _classifier_variables(config)["params"]

  def loss_fn(p, eta):
    logits, state = model.apply({"params": p}, tokens, mask, mutable=["ksvd"])
    ce = jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, labels[:, None], -1)[:, 0])
    reg = ksvd_loss(state["ksvd"], RELEASE_LRA)
    return ce + eta * reg, (ce, reg)

  grad_fn = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
  (loss, (ce, reg)), grads = grad_fn(params, 0.1)
  assert np.isfinite(loss) and float(reg) > 0.0
  np.testing.assert_allclose(loss, ce + 0.1 * reg, rtol=1e-6)
  flat = jax.tree_util.tree_flatten_with_path(grads)[0]
  assert len(flat) == len(jax.tree.leaves(params))
  for path, g in flat:
    assert np.all(np.isfinite(g)), jax.tree_util.keystr(path)
  for i in range(config.num_layers):
    attn = grads["body"]["encoder"][f"block_{i}"]["attention"]
    for name in ("We", "Wr", "Lambda"):
      assert np.max(np.abs(attn[name])) > 0.0, f"block_{i}/{name}: zero gradient"
  # Lambda enters only the regulariser: without it its gradient is exactly zero.
  _, grads_ce = grad_fn(params, 0.0)
  for i in range(config.num_layers):
    np.testing.assert_array_equal(grads_ce["body"]["encoder"][f"block_{i}"]["attention"]["Lambda"], 0.0)


def test_bfloat16_forward():
  family = "primal_plus"  # both attention kinds
  config32 = make_config(family, 2, **TINY)
  config16 = TransformerConfig(**{**config32.__dict__, "dtype": jnp.bfloat16})
  tokens, mask = _tokens(6), _mask()
  params = _classifier_variables(config32)["params"]
  logits16, state = jax.jit(
    lambda p: SequenceClassifier(config16).apply({"params": p}, tokens, mask, mutable=["ksvd"])
  )(params)
  assert logits16.dtype == jnp.bfloat16
  assert np.all(np.isfinite(np.asarray(logits16, np.float32)))
  logits32 = jax.jit(lambda p: SequenceClassifier(config32).apply({"params": p}, tokens, mask))(params)
  assert _rel(np.asarray(logits16, np.float32), logits32) < 0.1  # bf16 keeps ~3 significant digits
  for terms in collect_terms(state["ksvd"]):  # the objective's statistics stay float32
    assert terms.energy_e_sq.dtype == jnp.float32


@pytest.mark.parametrize("field", ["dtype", "param_dtype"])
@pytest.mark.parametrize("bad", ["bf16", "int32", jnp.int32, np.int8, "float", bool])
def test_config_refuses_dtypes_it_cannot_run(field, bad):
  """Issue 26.11: param_dtype="bf16" or an integer dtype was accepted and failed at the first init."""
  with pytest.raises(ValueError, match=rf"{field} must be one of float32, bfloat16, float16, float64 .*got"):
    make_config("primalformer", 1, **TINY, **{field: bad})


@pytest.mark.parametrize(
  "given, expected",
  [("float32", jnp.float32), ("bfloat16", jnp.bfloat16), (np.float16, jnp.float16), (np.dtype("float32"), jnp.float32)],
)
def test_config_dtypes_by_name_or_type_are_one_value(given, expected):
  config = make_config("primalformer", 1, **TINY, dtype=given, param_dtype=given)
  assert config.dtype is expected and config.param_dtype is expected
  assert config == make_config("primalformer", 1, **TINY, dtype=expected, param_dtype=expected)


def test_low_rank_beyond_the_head_width_warns_for_data_independent_weights():
  """Data-independent W_e, W_r are [H, p, s]: for s > p their rank is p, so e = phi(q) W_e spans at most p
  directions and the s - p extra ones add parameters and KSVD terms, no rank. Warned (the D4RL configs use
  s = 96 at p = 64, Table 7's setting), not refused; data-dependent layers are bounded by n, not p."""
  independent = {"primal": {"low_rank": 20, "data_dependent": False}}
  with pytest.warns(UserWarning, match=r"layer 0: low_rank s=20 exceeds the head width p=16 .*rank <= 16"):
    config = TransformerConfig(layers=("primal",), attention=independent, dim=32, num_heads=2, vocab_size=8)
  tokens = jnp.ones((1, 4), jnp.int32)
  params = nn.unbox(jax.jit(SequenceClassifier(config).init)(jax.random.key(0), tokens, jnp.ones((1, 4)))["params"])
  paths = jax.tree_util.tree_leaves_with_path(params)
  (we,) = [np.asarray(v, np.float64) for path, v in paths if jax.tree_util.keystr(path).endswith("['We']")]
  assert we.shape == (2, 16, 20) and [np.linalg.matrix_rank(w) for w in we] == [16, 16]
  import warnings

  with warnings.catch_warnings():
    warnings.simplefilter("error")
    TransformerConfig(layers=("primal",), attention={"primal": {"low_rank": 16, "data_dependent": False}}, dim=32,
                      num_heads=2)  # fmt: skip
    TransformerConfig(layers=("primal",), attention={"primal": {"low_rank": 20}}, dim=32, num_heads=2)
