"""A user's NNX Transformer, written here around `nnx.MultiHeadAttention` as NNX users write it (not around
our layers), runs unchanged with every registered mechanism substituted in one line, trains, and (causal
mechanisms with a decoding state) decodes token by token equal to its full forward."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from nnx_cases import causal_names, decode_names, names, options

import primal_jax.nnx as pnnx

# Compares with float64 NumPy, golden numbers or the Linen layer at float32 tolerances: full float32 matmuls.
pytestmark = pytest.mark.matmul_precision("highest")

VOCAB, DIM, HEADS, LENGTH, BATCH = 13, 16, 2, 8, 4


# ---- the user's code: nothing below knows about primal_jax --------------------------------------------------
class Block(nnx.Module):
  def __init__(self, dim, heads, *, attention_cls=nnx.MultiHeadAttention, rngs):
    self.ln1 = nnx.LayerNorm(dim, rngs=rngs)
    self.attn = attention_cls(
      num_heads=heads, in_features=dim, qkv_features=dim, dropout_rate=0.1, decode=False, rngs=rngs
    )
    self.ln2 = nnx.LayerNorm(dim, rngs=rngs)
    self.mlp = nnx.Sequential(nnx.Linear(dim, 2 * dim, rngs=rngs), nnx.gelu, nnx.Linear(2 * dim, dim, rngs=rngs))

  def __call__(self, x, mask=None, decode=None):
    x = x + self.attn(self.ln1(x), mask=mask, decode=decode)
    return x + self.mlp(self.ln2(x))


class Model(nnx.Module):
  """Causal LM (`causal=True`: causal mask, decoding) or sequence classifier (padding mask, mean pooling)."""

  def __init__(self, causal, *, attention_cls=nnx.MultiHeadAttention, rngs):
    self.causal = causal
    self.embed = nnx.Embed(VOCAB, DIM, rngs=rngs)
    self.pos = nnx.Embed(LENGTH, DIM, rngs=rngs)
    self.blocks = nnx.List([Block(DIM, HEADS, attention_cls=attention_cls, rngs=rngs) for _ in range(2)])
    self.head = nnx.Linear(DIM, VOCAB, rngs=rngs)
    self.index = nnx.data(None)

  def __call__(self, tokens, padding=None, decode=False):
    start = 0
    if decode:
      start, mask = self.index[...], None
      self.index[...] += tokens.shape[1]
    elif self.causal:
      mask = nnx.make_causal_mask(tokens)
    else:
      mask = nnx.make_attention_mask(padding, padding)
    x = self.embed(tokens) + self.pos(start + jnp.arange(tokens.shape[1]))
    for block in self.blocks:
      x = block(x, mask=mask, decode=decode)
    if not self.causal:
      x = jnp.sum(x * padding[..., None], 1) / jnp.sum(padding, 1, keepdims=True)
    return self.head(x)

  def init_cache(self, batch):
    for block in self.blocks:
      block.attn.init_cache((batch, LENGTH, DIM))
    self.index = nnx.Cache(jnp.array(0, jnp.int32))


def make_train_step(extra_loss):
  @nnx.jit
  def train_step(model, optimizer, tokens, padding, targets):
    def loss_fn(model):
      logits = model(tokens, padding)
      loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
      return loss + extra_loss(model)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  return train_step


# ---- end of the user's code ----------------------------------------------------------------------------------


def data(causal):
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, VOCAB, (BATCH, LENGTH)), jnp.int32)
  padding = np.ones((BATCH, LENGTH), bool)
  padding[1, -2:] = False
  targets = jnp.roll(tokens, -1, 1) if causal else tokens[:, 0]
  return tokens, jnp.asarray(padding), targets


def train(model, causal, extra_loss=lambda model: 0.0, steps=6):
  optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
  step = make_train_step(extra_loss)
  model.train()
  losses = [float(step(model, optimizer, *data(causal))) for _ in range(steps)]
  model.eval()
  assert np.isfinite(losses).all() and losses[-1] < losses[0], losses
  return losses


def test_the_user_model_runs_with_nnx_multi_head_attention():
  for causal in (False, True):
    train(Model(causal, rngs=nnx.Rngs(0)), causal)


def _ksvd(model):  # the only primal_jax line of a user's loss: 0 for a model without Primal layers
  return pnnx.ksvd_regularizer(nnx.state(model, pnnx.KSVDVariable), 0.1, allow_empty=True)


@pytest.mark.parametrize("name", names())
def test_every_mechanism_trains_in_the_user_classifier(name):
  attention = functools.partial(pnnx.get_attention(name), **options(name))
  model = Model(False, attention_cls=attention, rngs=nnx.Rngs(0))
  train(model, False, _ksvd)
  assert bool(pnnx.layer_terms(model)) == (name in ("primal", "kep_svgp"))  # the mechanisms that sow KSVD terms


@pytest.mark.slow
@pytest.mark.parametrize("name", causal_names())
def test_every_causal_mechanism_trains_in_the_user_lm_and_decodes(name):
  attention = functools.partial(pnnx.get_attention(name), causal=True, **options(name, causal=True))
  model = Model(True, attention_cls=attention, rngs=nnx.Rngs(0))
  train(model, True, _ksvd)
  if name not in decode_names():
    with pytest.raises(ValueError, match="not supported"):
      model.init_cache(BATCH)
    return
  tokens, _, _ = data(True)
  full = model(tokens)
  model.init_cache(BATCH)
  step = nnx.jit(lambda model, token: model(token, decode=True))
  decoded = jnp.concatenate([step(model, tokens[:, i : i + 1]) for i in range(LENGTH)], 1)
  np.testing.assert_allclose(decoded, full, rtol=1e-5, atol=1e-5)
  assert len(pnnx.layer_terms(model)) == (2 if name == "primal" else 0)  # decoding left training's terms alone
