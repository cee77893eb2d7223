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
    gen.generate(model, params, [[1] * 20], max_new_tokens=6, options=ok)
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
  _, after = step(params, filled, jnp.ones((2,), jnp.int32), jax.random.split(jax.random.key(0), 2))
  assert all(leaf.is_deleted() for leaf in jax.tree.leaves(filled))
  assert int(after["position"]) == 4


@pytest.mark.parametrize("temperature", [gen.MIN_TEMPERATURE, 2e-38, 1e-37, 1e-30, 1e-6])
def test_tiny_temperatures_sample_the_argmax(temperature):
  """Issue 26.5: logits / temperature overflowed to inf (two infs: NaN) and sampled token 0, not the argmax."""
  logits = jnp.asarray([[6.9, 7.0, 0.5, -2.0], [-1.0, -3.0, 2.0, 1.9], [5.0, 4.0, 3.0, 4.999]], jnp.float32)
  options = gen.SamplingOptions(temperature=temperature, top_p=0.9)
  for seed in range(4):
    keys = jax.random.split(jax.random.key(seed), 3)
    np.testing.assert_array_equal(gen.sample_token(logits, keys, options), [1, 2, 0])


@pytest.mark.parametrize("temperature", [1e-45, 1e-40, 1.1e-38])
def test_temperatures_below_the_smallest_normal_float32_are_refused(temperature):
  with pytest.raises(ValueError, match=r"temperature must be 0 \(greedy\) or >= 1.17"):
    gen.SamplingOptions(temperature=temperature)


def test_sampling_matches_the_softmax_of_logits_over_temperature():
  """Per-row keys sample each row from softmax(logits / T): frequencies against float64 NumPy (4000 draws)."""
  logits = np.asarray([[0.0, 1.0, 2.0, -1.0], [3.0, 0.5, 0.5, 0.0]], np.float32)
  options = gen.SamplingOptions(temperature=1.7)
  keys = jax.random.split(jax.random.key(0), (4000, 2))
  draws = np.asarray(jax.vmap(lambda k: gen.sample_token(jnp.asarray(logits), k, options))(keys))  # [4000, 2]
  z = logits.astype(np.float64) / 1.7
  want = np.exp(z - z.max(-1, keepdims=True))
  want /= want.sum(-1, keepdims=True)
  for row in range(2):
    freq = np.bincount(draws[:, row], minlength=4) / len(draws)
    np.testing.assert_allclose(freq, want[row], atol=0.03)  # > 4 standard errors of 4000 draws


@pytest.mark.parametrize("layers", [("softmax", "primal"), ("primal", "primal")])
def test_a_sampled_row_is_what_the_prompt_gives_alone(layers):
  """Issue 26.5: one key for the whole batch made a row depend on its neighbours and its place in the batch."""
  model, params = _lm(layers)
  warm = gen.SamplingOptions(temperature=1.5, top_p=0.95)
  batch = gen.generate(model, params, PROMPTS, max_new_tokens=8, options=warm, seed=7)
  assert len({tuple(new) for new in batch}) == 3
  for prompt, new in zip(PROMPTS, batch, strict=True):
    assert gen.generate(model, params, [prompt], max_new_tokens=8, options=warm, seed=7) == [new]
  assert gen.generate(model, params, PROMPTS[::-1], max_new_tokens=8, options=warm, seed=7) == batch[::-1]
  # Several samples of one prompt: one seed per prompt; each row is still what its seed gives alone.
  twice = gen.generate(model, params, [PROMPTS[0]] * 2, max_new_tokens=8, options=warm, seed=[7, 8])
  assert twice[0] == batch[0] and twice[1] != twice[0]
  assert twice[1] == gen.generate(model, params, [PROMPTS[0]], max_new_tokens=8, options=warm, seed=8)[0]


def test_seeds_are_checked():
  model, params = _lm()
  ok = gen.SamplingOptions()
  for bad in (2**63, -(2**63) - 1, 1.5, True, [1, 2]):
    with pytest.raises(ValueError, match="seed"):
      gen.generate(model, params, [[1]], max_new_tokens=1, options=ok, seed=bad)


@pytest.mark.parametrize("layers", [("softmax", "primal"), ("primal", "primal")])
def test_a_prompt_of_max_len_tokens_gets_one_new_token(layers):
  """Issue 26.5: the last new token is never fed back, so prompt + new tokens may be max_len + 1 long."""
  model, params = _lm(layers)
  greedy = gen.SamplingOptions(temperature=0.0)
  prompt = [int(t) for t in np.random.default_rng(0).integers(0, VOCAB, MAX_LEN)]
  for cut, new in ((MAX_LEN, 1), (MAX_LEN - 1, 2), (MAX_LEN - 3, 4)):
    (out,) = gen.generate(model, params, [prompt[:cut]], max_new_tokens=new, options=greedy)
    seq = jnp.asarray([(prompt[:cut] + out)[:MAX_LEN]], jnp.int32)
    predicted = np.asarray(jnp.argmax(model.apply({"params": params}, seq)[0], -1))
    np.testing.assert_array_equal(predicted[cut - 1 :], out[-(MAX_LEN - cut + 1) :])
  for cut, new in ((MAX_LEN, 2), (MAX_LEN - 1, 3), (MAX_LEN + 1, 0 + 1)):
    with pytest.raises(ValueError, match=f"exceeds the model's max_len {MAX_LEN}"):
      gen.generate(model, params, [[1] * cut], max_new_tokens=new, options=greedy)
