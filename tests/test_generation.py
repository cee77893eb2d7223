"""primal_jax.models.generation: greedy = argmax of the full forward, filters vs NumPy, one compile, errors."""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from primal_jax.models import generation as gen
from primal_jax.models.config import TransformerConfig
from primal_jax.models.lm import CausalLM, decode_step, init_cache

VOCAB, MAX_LEN = 16, 24


@functools.cache
def _lm(layers=("softmax", "primal")):
  config = TransformerConfig(
    layers=layers, attention={"primal": {"low_rank": 3, "data_dependent": False}}, vocab_size=VOCAB,
    max_len=MAX_LEN, dim=16, hidden_dim=32, num_heads=2, num_classes=VOCAB,
  )  # fmt: skip
  model = CausalLM(config)
  params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, MAX_LEN), jnp.int32))["params"])
  # Weights a little larger than at init, so the greedy continuation depends on the context (at init the
  # argmax is one token everywhere, which would let a broken decoder pass).
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(5), len(leaves))
  params = jax.tree.unflatten(
    tree, [x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
  )
  return model, params


PROMPTS = [[3, 1, 4, 1, 5], [9], [2, 6, 5, 3, 5, 8, 9, 7, 9]]


@pytest.mark.parametrize("layers", [("softmax", "primal"), ("primal", "primal")])
@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_greedy_generation_is_the_argmax_of_the_full_forward(layers, chunk):
  model, params = _lm(layers)
  greedy = gen.SamplingOptions(temperature=0.0)
  outs = gen.generate(model, params, PROMPTS, max_new_tokens=6, options=greedy, prefill_chunk=chunk)
  assert len({t for new in outs for t in new}) > 1  # a continuation that depends on the context
  for prompt, new in zip(PROMPTS, outs, strict=True):
    assert len(new) == 6
    seq = jnp.asarray([prompt + new], jnp.int32)
    logits = model.apply({"params": params}, seq)  # [1, T, V], the full causal forward
    predicted = np.asarray(jnp.argmax(logits[0], -1))  # position t predicts token t + 1
    np.testing.assert_array_equal(predicted[len(prompt) - 1 : -1], new)
    alone = gen.generate(model, params, [prompt], max_new_tokens=6, options=greedy, prefill_chunk=chunk)
    assert alone[0] == new  # a batch neighbour of another length changes nothing


def _np_filter(logits, top_k, top_p):
  """Reference: per row, keep the top-k values, then the smallest most-probable set reaching top_p."""
  out = np.full_like(logits, -np.inf)
  for r, row in enumerate(logits):
    keep = np.ones(row.shape, bool)
    if top_k:
      keep &= row >= np.sort(row)[-top_k]
    z = np.where(keep, row, -np.inf)
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    order = np.argsort(-z, kind="stable")
    mass = 0.0
    nucleus = np.zeros(row.shape, bool)
    for i in order:
      if mass >= top_p or not keep[i]:
        break
      nucleus[i], mass = True, mass + probs[i]
    out[r] = np.where(nucleus, row, -np.inf)
  return out


@pytest.mark.parametrize("top_k, top_p", [(0, 0.5), (3, 1.0), (4, 0.8), (0, 0.999), (1, 0.3)])
def test_filters_match_numpy(top_k, top_p):
  logits = np.random.default_rng(0).normal(size=(5, 11)).astype(np.float32) * 2
  got = np.asarray(gen.filter_logits(jnp.asarray(logits), top_k, top_p))
  want = _np_filter(logits.astype(np.float64), top_k, top_p)
  np.testing.assert_array_equal(np.isfinite(want), got > -1e30)
  np.testing.assert_array_equal(got[np.isfinite(want)], logits[np.isfinite(want)])


def test_sampling_is_seeded_and_top_k_1_is_greedy():
  model, params = _lm()
  warm = gen.SamplingOptions(temperature=1.5)
  a = gen.generate(model, params, PROMPTS, max_new_tokens=8, options=warm, seed=1)
  assert a == gen.generate(model, params, PROMPTS, max_new_tokens=8, options=warm, seed=1)
  assert a != gen.generate(model, params, PROMPTS, max_new_tokens=8, options=warm, seed=2)
  greedy = gen.generate(model, params, PROMPTS, max_new_tokens=8, options=gen.SamplingOptions(temperature=0.0))
  top1 = gen.generate(model, params, PROMPTS, max_new_tokens=8, options=gen.SamplingOptions(top_k=1), seed=3)
  assert top1 == greedy


def test_one_compile_per_batch_shape(monkeypatch):
  """The step traces once for every prompt length and token count (chex.assert_max_traces)."""
  model, params = _lm()
  options = gen.SamplingOptions(temperature=0.7, top_p=0.9)
  gen._compiled.cache_clear()
  jit = jax.jit
  counted = iter([2, 1])  # prefill: a full chunk and a shorter last chunk; step: once
  monkeypatch.setattr(gen.jax, "jit", lambda f, **kw: jit(chex.assert_max_traces(f, n=next(counted)), **kw))
  for prompts, n in (([[1, 2, 3, 4, 5, 6, 7], [3, 3, 3, 3, 3, 3, 3, 3]], 5), ([[5] * 12, [1] * 9], 9)):
    gen.generate(model, params, prompts, max_new_tokens=n, options=options, prefill_chunk=4)
  gen._compiled.cache_clear()


def test_bad_requests_name_the_argument():
  model, params = _lm()
  ok = gen.SamplingOptions()
  with pytest.raises(ValueError, match="prompts must not be empty"):
    gen.generate(model, params, [[1, 2], []], max_new_tokens=2, options=ok)
  with pytest.raises(ValueError, match="exceeds the model's max_len 24"):
    gen.generate(model, params, [[1] * 20], max_new_tokens=5, options=ok)
  with pytest.raises(ValueError, match="token ids must lie in"):
    gen.generate(model, params, [[1, VOCAB]], max_new_tokens=2, options=ok)
  with pytest.raises(ValueError, match="max_new_tokens"):
    gen.generate(model, params, [[1]], max_new_tokens=0, options=ok)
  for bad in (dict(top_p=0.0), dict(top_p=1.5), dict(temperature=-1.0), dict(temperature=float("nan")), dict(top_k=-1)):
    with pytest.raises(ValueError, match=next(iter(bad))):
      gen.SamplingOptions(**bad)


@pytest.mark.parametrize("layers", [("primal", "primal"), ("softmax", "primal")])
def test_decode_step_past_max_len(layers):
  """Past max_len decode_step raises as the full forward does (issue 18.5: it returned NaN logits silently).

  Under jit the position is traced: the whole chunk that crosses max_len comes out NaN, by design.
  """
  model, params = _lm(layers)
  cache = init_cache(model, 2)
  logits, cache = decode_step(model, params, cache, jnp.ones((2, MAX_LEN - 1), jnp.int32))
  assert bool(jnp.all(jnp.isfinite(logits)))
  with pytest.raises(ValueError, match="max_len"):
    decode_step(model, params, cache, jnp.ones((2, 2), jnp.int32))  # positions 23, 24: 24 is past the end
  logits, _ = jax.jit(functools.partial(decode_step, model))(params, cache, jnp.ones((2, 2), jnp.int32))
  assert bool(jnp.all(jnp.isnan(logits)))
  logits, cache = decode_step(model, params, cache, jnp.ones((2, 1), jnp.int32))  # the last position is fine
  assert bool(jnp.all(jnp.isfinite(logits)))


def test_the_cache_is_donated_to_each_step():
  """The decode step updates the KV cache in place: its input buffers are consumed, not copied."""
  model, params = _lm()
  prefill, step = gen._compiled(model, gen.SamplingOptions(temperature=0.0))
  cache = init_cache(model, 2)
  filled = prefill(params, cache, jnp.ones((2, 3), jnp.int32))
  assert all(leaf.is_deleted() for leaf in jax.tree.leaves(cache))
  _, after = step(params, filled, jnp.ones((2,), jnp.int32), jax.random.key(0))
  assert all(leaf.is_deleted() for leaf in jax.tree.leaves(filled))
  assert int(after["position"]) == 4
