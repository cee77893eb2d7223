"""Training with the baseline attentions: a Decision Transformer with each of Table 4's causal attentions (a
forward and a training step), and every mechanism trained in bfloat16 for a few hundred steps without a
non-finite loss (the kernelised ones keep their normalisers and running sums in float32).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from attention_utils import normal, random_params
from flax import linen as nn

from primal_jax.attention import get_attention
from primal_jax.models import DecisionTransformer, SequenceClassifier, TransformerConfig, dt_config
from primal_jax.models.decision_transformer import TABLE4_BASELINES, action_mse

STATE, ACT, K = 3, 2, 5


@pytest.mark.slow
@pytest.mark.parametrize("name", TABLE4_BASELINES)
def test_decision_transformer_with_each_table4_attention(name):
  """Every layer `name` (causal): finite actions in [-1, 1], finite gradients reaching the attention's
  projections, and an SGD step that lowers the loss on the batch."""
  options = {"flowformer": {"form": "release"}}.get(name, {})
  config = dt_config(False, softmax=(name, options), num_layers=2, dim=16, num_heads=2, hidden_dim=24)
  assert config.layer_names == (name, name)
  model = DecisionTransformer(config, state_dim=STATE, act_dim=ACT, max_ep_len=20, masking="padding_aware")
  rng = np.random.default_rng(0)
  batch = (
    jnp.asarray(rng.standard_normal((4, K, STATE)), jnp.float32),
    jnp.asarray(rng.uniform(-1, 1, (4, K, ACT)), jnp.float32),
    jnp.asarray(rng.uniform(0, 3, (4, K, 1)), jnp.float32),
    jnp.asarray(np.tile(np.arange(K), (4, 1)), jnp.int32),
    jnp.asarray(np.arange(K)[None] >= np.array([[0], [0], [2], [0]]), jnp.int32),  # one left-padded row
  )
  params = nn.unbox(model.init(jax.random.key(0), *batch)["params"])

  def loss(p):
    _, acts, _ = model.apply({"params": p}, *batch)
    return action_mse(acts, batch[1], batch[4])

  value, grads = jax.jit(jax.value_and_grad(loss))(params)
  assert np.isfinite(float(value))
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
  attention = grads["transformer"]["block_0"]["attention"]
  assert float(jnp.max(jnp.abs(attention["query"]["kernel"]))) > 0, "no gradient reaches the attention"
  stepped = jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)
  assert float(loss(stepped)) < float(value)


def test_decision_transformer_refuses_a_non_causal_attention():
  with pytest.raises(ValueError, match="no causal form"):
    dt_config(False, softmax="linformer")


# ============================================================================ bf16 training

BF16_MECHANISMS = [
  ("linear", {}),
  ("linear", {"form": "release"}),
  ("cosformer", {}),
  ("cosformer", {"form": "release"}),
  ("performer", {"num_features": 16}),
  ("performer", {"num_features": 16, "form": "release"}),
  ("linformer", {"linformer_k": 8}),
  ("nystromformer", {"num_landmarks": 4, "conv_kernel_size": 3}),
  ("nystromformer", {"num_landmarks": 4, "conv_kernel_size": 3, "form": "release"}),
  ("reformer", {"chunk_length": 4}),
  ("flowformer", {}),
]
STEPS, LENGTH = 200, 16


@functools.cache
def _task():
  """A learnable toy task: is token 1 more frequent than token 2 in the (padded) sequence."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 6, (8, LENGTH))
  lengths = rng.integers(LENGTH // 2, LENGTH + 1, 8)
  mask = np.arange(LENGTH)[None] < lengths[:, None]
  tokens = np.where(mask, tokens, 0)
  labels = (np.sum(tokens == 1, 1) > np.sum(tokens == 2, 1)).astype(np.int32)
  return jnp.asarray(tokens, jnp.int32), jnp.asarray(mask), jnp.asarray(labels)


@pytest.mark.slow
@pytest.mark.parametrize(
  "name,options", BF16_MECHANISMS, ids=[f"{n}-{o.get('form', 'paper')}" for n, o in BF16_MECHANISMS]
)
def test_bf16_training_stays_finite(name, options):
  """200 Adam steps (lr 3e-3) of a 1-layer classifier with bf16 activations and parameters: every loss finite,
  and the loss falls."""
  config = TransformerConfig(
    layers=((name, options),),
    vocab_size=6,
    max_len=LENGTH,
    dim=16,
    hidden_dim=32,
    num_heads=2,
    num_classes=2,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    dtype=jnp.bfloat16,
    param_dtype=jnp.float32,
  )
  model = SequenceClassifier(config)
  tokens, mask, labels = _task()
  params = nn.unbox(model.init(jax.random.key(0), tokens, mask)["params"])
  opt = optax.adam(3e-3)

  def loss_fn(p):
    logits = model.apply({"params": p}, tokens, mask).astype(jnp.float32)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))

  @jax.jit
  def run(p, state):
    def step(carry, _):
      p, s = carry
      value, grads = jax.value_and_grad(loss_fn)(p)
      updates, s = opt.update(grads, s, p)
      return (optax.apply_updates(p, updates), s), value

    return jax.lax.scan(step, (p, state), None, length=STEPS)[1]

  losses = np.asarray(run(params, opt.init(params)))
  assert np.all(np.isfinite(losses)), f"{name}: first non-finite loss at step {np.argmin(np.isfinite(losses))}"
  assert losses[-10:].mean() < losses[:10].mean(), (losses[:10].mean(), losses[-10:].mean())


@pytest.mark.parametrize("name", ["linear", "cosformer", "performer", "flowformer"])
def test_bf16_kernel_sums_run_in_float32(name):
  """Long bf16 sequences of large inputs: the key sums reach ~1e5-1e6, past bf16's 8-bit mantissa; the bf16
  layer's output stays within bf16 rounding (3e-2) of the same layer in float32 and is finite."""
  kwargs = {"performer": {"num_features": 16}}.get(name, {})
  n = 2048
  full = get_attention(name)(num_heads=2, causal=name != "performer", **kwargs)
  half = full.clone(dtype=jnp.bfloat16)
  x = normal(0, (1, n, 16), scale=4.0)
  params = random_params(full, x)
  want = np.asarray(full.apply({"params": params}, x), np.float64)
  got = np.asarray(half.apply({"params": params}, jnp.asarray(x, jnp.bfloat16)).astype(jnp.float32), np.float64)
  assert np.all(np.isfinite(got))
  assert np.max(np.abs(got - want)) <= 3e-2 * np.max(np.abs(want)), name


def test_lra_configs_name_the_release_forms():
  """The LRA configs run the baselines the paper took from the release in the release's form, at the release's
  power-of-two padded length; the textbook forms stay available by option."""
  from primal_jax.cli.config_lookup import load_config
  from primal_jax.tasks.lra.config import RELEASE_BASELINES

  for model in ("linear", "cosformer", "linformer", "nystromformer", "performer"):
    config = load_config(f"lra:task=listops,model={model}")
    assert config.model.attention[model].form == "release" and config.data.seq_len == 2048, model
  reformer = load_config("lra:task=text,model=reformer")
  assert reformer.data.seq_len == 4096 and reformer.data.seq_len % 64 == 0
  assert "form" not in load_config("lra:task=listops,model=flowformer").model.attention.flowformer
  assert set(RELEASE_BASELINES) == {"linear", "cosformer", "linformer", "nystromformer", "performer", "reformer"}
