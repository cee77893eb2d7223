"""The usage patterns of Flax's example models, written here (not copied) so CI guards them (issue 53).

lm1b: a Linen decoder whose attention takes `nn.with_logical_partitioning` kernel initialisers, decoded one token
at a time from its cache inside a `lax.while_loop` temperature sampler; wmt: a beam search that gathers every
cache leaf along its leading (batch) axis; the NNX MiniGPT of Flax's docs: a block calling the attention as
`attn(inputs_q=x, is_causal=True, decode=False)` with `kernel_metadata`, trained with `nnx.Optimizer` under
`nnx.jit` with the KSVD term.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx
from jax.sharding import PartitionSpec

import primal_jax.nnx as pnnx
from primal_jax.attention import get_attention
from primal_jax.ksvd import ksvd_loss

VOCAB, LENGTH, WIDTH, HEADS = 11, 6, 8, 2
# One swap per mechanism: what a user passes where the example builds its attention.
LINEN = {
  "softmax": dict(),
  "primal": dict(causal=True, data_dependent=False, low_rank=2),
}


class TinyLM(nn.Module):
  """lm1b's pattern: embed, one pre-norm attention block with partitioned initialisers, logits; `decode` feeds
  one token per call (positions from the cache's own counter, as lm1b's AddPositionEmbs does)."""

  name_: str
  decode: bool = False

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(
      VOCAB, WIDTH, embedding_init=nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed"))
    )(tokens)
    position = self.variable("cache", "position", lambda: jnp.array(0, jnp.int32)) if self.decode else None
    table = self.param(
      "positions", nn.with_logical_partitioning(nn.initializers.normal(0.1), (None, "embed")), (LENGTH, WIDTH)
    )
    if self.decode:  # lm1b's cache_index: the initialising call leaves it at 0
      x = x + jax.lax.dynamic_slice_in_dim(table, position.value, tokens.shape[1])[None]
      if not self.is_initializing():
        position.value = position.value + tokens.shape[1]
    else:
      x = x + table[None, : tokens.shape[1]]
    mask = None if self.decode else nn.make_causal_mask(tokens)
    attention = get_attention(self.name_)(
      num_heads=HEADS,
      kernel_init=nn.with_logical_partitioning(nn.initializers.xavier_uniform(), ("embed", "heads", "kv")),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("heads", "kv")),
      decode=self.decode,
      **LINEN[self.name_],
    )
    x = x + attention(nn.LayerNorm()(x), mask=mask)
    return nn.Dense(
      VOCAB, kernel_init=nn.with_logical_partitioning(nn.initializers.xavier_uniform(), ("embed", "vocab"))
    )(x)


@pytest.fixture(scope="module", params=sorted(LINEN))
def lm(request):
  name = request.param
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, VOCAB, (2, LENGTH)), jnp.int32)
  variables = TinyLM(name).init(jax.random.key(0), tokens)
  return name, nn.unbox(variables["params"]), variables["params"], tokens


def test_lm1b_pattern_partitioned_inits_train_step_with_ksvd(lm):
  name, params, boxed, tokens = lm
  attention = next(v for k, v in boxed.items() if k not in ("Embed_0", "LayerNorm_0", "Dense_0", "positions"))
  boxes = jax.tree.leaves(attention, is_leaf=lambda b: isinstance(b, nn.LogicallyPartitioned))
  assert boxes and all(isinstance(b, nn.LogicallyPartitioned) for b in boxes)  # every attention parameter boxed ...
  assert all(not isinstance(b.value, nn.LogicallyPartitioned) for b in boxes)  # ... once, never twice
  assert attention["query"]["kernel"].names == ("embed", "heads", "kv")

  @jax.jit
  def loss(params):
    logits, state = TinyLM(name).apply({"params": params}, tokens, mutable=["ksvd"])
    task = optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()
    return task + 0.1 * ksvd_loss(state.get("ksvd", {}), allow_empty=True)

  value, grads = jax.value_and_grad(loss)(params)
  assert np.isfinite(float(value)) and all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  if name == "primal":  # the KSVD term is in the loss: it has a gradient on Primal's own parameters
    we = jax.tree.leaves({k: v for k, v in grads.items() if "ttention" in k})
    assert any(float(jnp.abs(g).max()) > 0 for g in we)


def test_lm1b_pattern_decoding_and_sampler_loop_equal_the_full_forward(lm):
  name, params, _, tokens = lm
  full = TinyLM(name).apply({"params": params}, tokens)
  cache = TinyLM(name, decode=True).init(jax.random.key(0), tokens)["cache"]  # as lm1b: the full length

  def step(cache, token):
    logits, updates = TinyLM(name, decode=True).apply({"params": params, "cache": cache}, token, mutable=["cache"])
    return logits[:, 0], updates["cache"]

  steps = []
  for i in range(LENGTH):
    logits, cache = jax.jit(step)(cache, tokens[:, i : i + 1])
    steps.append(logits)
  np.testing.assert_allclose(jnp.stack(steps, 1), full, rtol=1e-5, atol=1e-5)

  # lm1b's temperature sampler: a while_loop carrying the cache; at temperature -> 0 it is greedy, so the
  # sequence it returns is the greedy continuation the full forward gives, token by token.
  def sample(cache, first):
    def body(state):
      i, seq, cache = state
      logits, cache = step(cache, jax.lax.dynamic_slice_in_dim(seq, i, 1, axis=1))
      token = jax.random.categorical(jax.random.key(0), logits / 1e-6).astype(jnp.int32)
      return i + 1, jax.lax.dynamic_update_slice_in_dim(seq, token[:, None], i + 1, axis=1), cache

    seq = jnp.zeros((first.shape[0], LENGTH), jnp.int32).at[:, 0].set(first)
    return jax.lax.while_loop(lambda s: s[0] < LENGTH - 1, body, (0, seq, cache))[1]

  cache = TinyLM(name, decode=True).init(jax.random.key(0), tokens)["cache"]
  sequence = jax.jit(sample)(cache, tokens[:, 0])
  greedy = jnp.argmax(TinyLM(name).apply({"params": params}, sequence), -1)
  np.testing.assert_array_equal(sequence[:, 1:], greedy[:, :-1])


@pytest.mark.parametrize("name", sorted(LINEN))
def test_wmt_pattern_beam_gather_along_axis_zero_of_every_cache_leaf(name):
  """wmt's gather_beams: every non-scalar cache leaf indexed along axis 0 (scalars, e.g. the cache index, kept);
  every such leaf leads with the batch axis, as Flax's (softmax: cached_key/cached_value [B, H, p, L])."""
  batch = 3
  tokens = jnp.asarray(np.random.default_rng(1).integers(1, VOCAB, (batch, LENGTH)), jnp.int32)
  params = nn.unbox(TinyLM(name).init(jax.random.key(0), tokens)["params"])
  cache = TinyLM(name, decode=True).init(jax.random.key(0), tokens)["cache"]
  step = jax.jit(
    lambda cache, t: TinyLM(name, decode=True).apply({"params": params, "cache": cache}, t, mutable=["cache"])
  )
  for i in range(3):
    _, updates = step(cache, tokens[:, i : i + 1])
    cache = updates["cache"]
  assert all(x.ndim == 0 or x.shape[0] == batch for x in jax.tree.leaves(cache))
  order = jnp.array([2, 0, 2])  # beams reordered, one duplicated
  gathered = jax.tree.map(lambda x: x if x.ndim == 0 else x[order], cache)
  out, _ = step(gathered, tokens[order, 3:4])
  full = TinyLM(name).apply({"params": params}, tokens[order, :4])
  np.testing.assert_allclose(out[:, 0], full[:, 3], rtol=1e-5, atol=1e-5)


class MiniBlock(nnx.Module):
  """The NNX MiniGPT block of Flax's docs, in its own words: attention called with is_causal=True, decode=False."""

  def __init__(self, attention, rngs: nnx.Rngs):
    self.embed = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
    self.mha = attention(
      num_heads=HEADS,
      in_features=WIDTH,
      kernel_metadata={"out_sharding": PartitionSpec(None, "model")},
      bias_metadata={"out_sharding": PartitionSpec("model")},
      rngs=rngs,
    )
    self.norm = nnx.LayerNorm(WIDTH, epsilon=1e-6, rngs=rngs)
    self.out = nnx.Linear(WIDTH, VOCAB, rngs=rngs)

  def __call__(self, tokens):
    x = self.embed(tokens)
    return self.out(self.norm(x + self.mha(inputs_q=x, is_causal=True, decode=False)))


NNX = {
  "softmax": pnnx.SoftmaxAttention,
  "primal": lambda **kw: pnnx.PrimalAttention(low_rank=2, data_dependent=False, **kw),
}


@pytest.mark.parametrize("name", ["softmax", "primal"])
def test_minigpt_pattern_block_trains_under_nnx_jit_with_the_ksvd_term(name):
  # The docs set a ("batch", "model") mesh for the out_sharding metadata; one device here.
  with jax.set_mesh(jax.make_mesh((1, 1), ("batch", "model"), devices=jax.devices()[:1])):
    _minigpt_block_trains(name)


@pytest.mark.parametrize("name", ["softmax", "primal"])
def test_minigpt_pattern_block_trains_with_the_model_axis_over_two_devices(name):
  # Primal's per-head vmap once met q sharded on 'model' and unsharded W_e, W_r here ("inconsistent axis specs").
  with jax.set_mesh(jax.make_mesh((1, 2), ("batch", "model"), devices=jax.devices()[:2])):
    _minigpt_block_trains(name)


def _minigpt_block_trains(name):
  model = MiniBlock(NNX[name], nnx.Rngs(0))
  assert model.mha.query["kernel"].get_metadata()["out_sharding"] == PartitionSpec(None, "model")
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, VOCAB, (2, LENGTH)), jnp.int32)
  optimizer = nnx.Optimizer(model, optax.adam(3e-2), wrt=nnx.Param)

  @nnx.jit
  def train_step(model, optimizer, tokens):
    def loss_fn(model):
      logits = model(tokens)
      task = optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()
      return task + pnnx.ksvd_regularizer(model, 0.1, allow_empty=True)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  losses = [float(train_step(model, optimizer, tokens)) for _ in range(5)]
  assert all(np.isfinite(losses)) and losses[-1] < losses[0]
  assert (len(pnnx.layer_terms(model)) == 1) == (name == "primal")
  # Causal, as the docs' generate_step needs: a position's logits ignore the tokens after it.
  other = tokens.at[:, 4:].set(0)
  np.testing.assert_allclose(model(tokens)[:, :4], model(other)[:, :4], rtol=1e-6, atol=1e-6)


def test_data_independent_primal_decodes_with_flaxs_decode_flag_alone():
  """Flax's wmt decoder self-attention: decode=True and no causal field, a causal mask in the full forward. A
  data-independent cosine Primal layer maps each x_i alone, so it honours that mask and decodes a token at a time
  with no state (its cache counts the tokens, batch-leading, for beam searches): equal to the full forward. Every
  other Primal form still decodes its causal form only."""
  from primal_jax.attention import PrimalAttention

  x = jax.random.normal(jax.random.key(3), (3, 6, 8))
  full = PrimalAttention(num_heads=2, data_dependent=False, low_rank=2)
  params = full.init(jax.random.key(0), x)["params"]
  expected = full.apply({"params": params}, x, mask=nn.make_causal_mask(jnp.ones((3, 6))))
  dec = full.clone(decode=True)
  cache = dec.init(jax.random.key(0), x)["cache"]
  assert all(leaf.shape[0] == 3 for leaf in jax.tree.leaves(cache))
  step = jax.jit(lambda c, x_t: dec.apply({"params": params, "cache": c}, x_t, mutable=["cache"]))
  outs = []
  for t in range(6):
    out, updates = step(cache, x[:, t : t + 1])
    cache = updates["cache"]
    outs.append(out)
  np.testing.assert_allclose(jnp.concatenate(outs, axis=1), expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(cache["count"], [6.0, 6.0, 6.0])
  # Another batch than the cache's is refused by both decoding forms (shapes are static, so under jit too).
  for layer in (dec, full.clone(decode=True, causal=True)):
    variables = {
      "params": layer.init(jax.random.key(0), x)["params"],
      "cache": layer.init(jax.random.key(0), x)["cache"],
    }
    with pytest.raises(ValueError, match=r"the chunk's batch \(1\) differs from the cache's \(3\)"):
      jax.jit(lambda v, x_t, layer=layer: layer.apply(v, x_t, mutable=["cache"]))(variables, x[:1, :1])
  with pytest.raises(ValueError, match=r"decode=True needs causal=True \(PrimalAttention decodes its causal form"):
    PrimalAttention(num_heads=2, low_rank=2, num_samples=4, decode=True).init(jax.random.key(0), x)
