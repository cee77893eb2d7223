"""Every LM-level decode path refuses past its bounds or flags the steps it could not decode (issue 54 item 3;
issue 53 items 4, 8: `pnnx.CausalLM` past `init_cache`, generate's temperature and empty prompt).

Before: `lm.greedy_decode` ran `decode_step` under `lax.scan`, so the refusal past `max_len` never fired and the
steps past it returned token 0 (the argmax of NaN logits); `generation.generate` sampled from NaN logits where a
layer refused (cosFormer past its horizon); `pnnx.CausalLM` decoded past `init_cache(batch, max_len)` by
overwriting the last cache slot (no error, wrong logits); its `generate` accepted temperature -1 or NaN and
raised IndexError on an empty prompt. References: the argmax of the full forward (an independent path).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

import primal_jax.nnx as pnnx
from primal_jax.models import generation as gen
from primal_jax.models.config import TransformerConfig
from primal_jax.models.lm import INVALID_TOKEN, CausalLM, decode_step, greedy_decode, init_cache

VOCAB, MAX_LEN, HORIZON = 16, 16, 8


@functools.cache
def _lm(layers):
  config = TransformerConfig(
    layers=layers, attention={"primal": {"low_rank": 3, "data_dependent": False}, "cosformer": {"horizon": HORIZON}},
    vocab_size=VOCAB, max_len=MAX_LEN, dim=16, hidden_dim=32, num_heads=2, num_classes=VOCAB, dropout_rate=0.0,
  )  # fmt: skip
  model = CausalLM(config)
  params = nn.unbox(model.init(jax.random.key(0), jnp.zeros((1, HORIZON), jnp.int32))["params"])
  leaves, tree = jax.tree.flatten(params)  # larger weights: a continuation that depends on the context
  keys = jax.random.split(jax.random.key(5), len(leaves))
  noise = [x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
  return model, jax.tree.unflatten(tree, noise)


PROMPT = jnp.asarray([[3, 1, 4, 1], [9, 2, 6, 5]], jnp.int32)


def _prefilled(model, params):
  """The cache after positions 0..2 (3 is fed next); jitted, so its position comes back concrete."""
  _, cache = jax.jit(functools.partial(decode_step, model))(params, init_cache(model, 2), PROMPT[:, :3])
  return cache


def _full_argmax(model, params, tokens):
  return np.asarray(jnp.argmax(model.apply({"params": params}, tokens), -1))


def test_greedy_decode_refuses_steps_past_max_len_when_the_position_is_concrete():
  model, params = _lm(("softmax", "primal"))
  cache = _prefilled(model, params)
  with pytest.raises(ValueError, match=r"^steps 20 from cache position 3 feed positions 3\.\.22, past max_len=16; "):
    greedy_decode(model, params, cache, PROMPT[:, 3:], 20)
  with pytest.raises(ValueError, match=r"^steps must be an integer >= 1, got 0$"):
    greedy_decode(model, params, cache, PROMPT[:, 3:], 0)
  model, params = _lm(("softmax", "cosformer"))
  past_horizon = r"^steps 6 from cache position 3 feed positions 3\.\.8, past layer 1 \(cosformer\) horizon=8; ask for"
  with pytest.raises(ValueError, match=past_horizon):
    greedy_decode(model, params, _prefilled(model, params), PROMPT[:, 3:], 6)


def test_greedy_decode_under_jit_flags_the_steps_past_max_len():
  """The issue's case: 20 steps from position 3, max_len 16. Steps feeding positions 3..15 are the full forward's
  argmax; the 7 past it are INVALID_TOKEN (before: 0, a valid id)."""
  model, params = _lm(("softmax", "primal"))
  loop = jax.jit(functools.partial(greedy_decode, model, steps=20), donate_argnums=1)
  out, _ = loop(params, _prefilled(model, params), PROMPT[:, 3:])
  out = np.asarray(out)
  assert out.shape == (2, 20) and (out[:, 13:] == INVALID_TOKEN).all()
  sequence = jnp.concatenate([PROMPT, jnp.asarray(out[:, :12])], axis=1)  # 16 tokens: positions 0..15
  np.testing.assert_array_equal(out[:, :13], _full_argmax(model, params, sequence)[:, 3:])
  assert (out[:, :13] >= 0).all() and len(set(out[:, :13].ravel().tolist())) > 1


def test_greedy_decode_under_jit_flags_a_layer_that_refuses():
  """cosFormer with horizon 8 in a max_len-16 model: steps feeding positions >= 8 are INVALID_TOKEN, and every
  step before is the full forward's argmax (before: arbitrary finite tokens from the layer's blown-up outputs)."""
  model, params = _lm(("softmax", "cosformer"))
  out, _ = jax.jit(functools.partial(greedy_decode, model, steps=9))(params, _prefilled(model, params), PROMPT[:, 3:])
  out = np.asarray(out)
  assert (out[:, 5:] == INVALID_TOKEN).all()  # fed positions 8..11
  sequence = jnp.concatenate([PROMPT, jnp.asarray(out[:, :4])], axis=1)  # 8 tokens: the horizon
  np.testing.assert_array_equal(out[:, :5], _full_argmax(model, params, sequence)[:, 3:])


def test_generate_refuses_a_layers_bound_before_running_and_a_step_whose_logits_are_not_finite():
  model, params = _lm(("softmax", "cosformer"))
  prompts = [[3, 1, 4], [9, 2]]
  greedy = gen.SamplingOptions(temperature=0.0)
  out = gen.generate(model, params, prompts, max_new_tokens=6, options=greedy)  # fed positions <= 7: in the horizon
  for prompt, new in zip(prompts, out, strict=True):
    sequence = jnp.asarray([prompt + new[:-1]], jnp.int32)
    np.testing.assert_array_equal(new, _full_argmax(model, params, sequence)[0, len(prompt) - 1 :])
  with pytest.raises(ValueError, match=r"exceeds the model's layer 1 \(cosformer\) horizon=8 \(it decodes 8 positions"):
    gen.generate(model, params, prompts, max_new_tokens=7, options=gen.SamplingOptions(temperature=0.7))
  # Token 9's embedding NaN: the second prompt's logits are NaN from its first token on (before: tokens sampled
  # from NaN logits); the first prompt never feeds a 9 under greedy decoding here.
  broken = jax.tree.map(lambda x: x, params)
  broken["embed"]["tokens"]["embedding"] = params["embed"]["tokens"]["embedding"].at[9].set(jnp.nan)
  with pytest.raises(ValueError, match=r"^the model's logits after position 1 are not finite for prompts \[1\] "):
    gen.generate(model, broken, prompts, max_new_tokens=3, options=greedy)


# ============================================================================ NNX CausalLM


@functools.cache
def _nnx_lm(attention=None):
  attention = attention or pnnx.SoftmaxAttention
  return pnnx.CausalLM(vocab_size=11, max_len=12, dim=16, num_heads=2, attention=attention, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("attention", ["softmax", "primal"])
def test_nnx_decoding_past_init_cache_is_refused_eagerly_and_nan_under_jit(attention):
  model = _nnx_lm(pnnx.lm.DEFAULT_ATTENTION if attention == "primal" else None)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 11, (2, 6)), jnp.int32)
  full = np.asarray(model(tokens[:, :4]))
  model.init_cache(2, 4)
  np.testing.assert_allclose(model(tokens[:, :4], decode=True), full, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match=r"^decode: tokens at positions 4\.\.4 exceed the cache's max_len=4 "):
    model(tokens[:, 4:5], decode=True)  # before: the softmax cache's last slot overwritten, finite logits
  with pytest.raises(ValueError, match=r"^decode: tokens have batch 1, the cache holds 2 sequences \(init_cache\)"):
    model(tokens[:1, 4:5], decode=True)  # before: broadcast against the batch-2 cache
  model.init_cache(2, 4)
  step = nnx.jit(lambda m, t: m(t, decode=True))
  outs = [np.asarray(step(model, tokens[:, i : i + 1])) for i in range(6)]
  np.testing.assert_allclose(np.concatenate(outs[:4], 1), full, rtol=1e-5, atol=1e-5)
  assert np.isnan(outs[4]).all() and np.isnan(outs[5]).all()


@pytest.mark.parametrize(
  "kwargs,message",
  [
    (dict(temperature=-1.0), r"^temperature must be a finite number >= 0 \(0: greedy\), got -1.0$"),
    (dict(temperature=math.nan), r"^temperature must be a finite number >= 0 \(0: greedy\), got nan$"),
    (dict(temperature=math.inf), r"^temperature must be a finite number >= 0 \(0: greedy\), got inf$"),
    (dict(num_tokens=0), r"^num_tokens must be an integer >= 1, got 0$"),
    (dict(prompt=jnp.zeros((2, 0), jnp.int32)), r"^prompt must be integer token ids \[batch, length\] with length"),
    (dict(prompt=jnp.zeros((3,), jnp.int32)), r"^prompt must be integer token ids \[batch, length\] with length"),
  ],
)
def test_nnx_generate_refuses_bad_arguments_in_one_line(kwargs, message):
  args = dict(prompt=jnp.ones((2, 3), jnp.int32), num_tokens=2, key=jax.random.key(0)) | kwargs
  with pytest.raises(ValueError, match=message):
    _nnx_lm().generate(args.pop("prompt"), args.pop("num_tokens"), **args)


def test_nnx_generate_is_the_full_forward_argmax_and_refuses_non_finite_logits():
  model = _nnx_lm()
  prompt = jnp.asarray([[3, 1, 4], [9, 2, 6]], jnp.int32)
  out = model.generate(prompt, 4)
  np.testing.assert_array_equal(out[:, 3:], jnp.argmax(model(out[:, :-1]), -1)[:, 2:])
  sampled = model.generate(prompt, 4, temperature=gen.MIN_TEMPERATURE, key=jax.random.key(1))  # tiny T: argmax
  np.testing.assert_array_equal(sampled, out)
  broken = pnnx.CausalLM(vocab_size=11, max_len=12, dim=16, num_heads=2, attention=pnnx.SoftmaxAttention,
                         rngs=nnx.Rngs(0))  # fmt: skip
  broken.head.bias.set_value(broken.head.bias.get_value().at[0].set(jnp.nan))
  with pytest.raises(ValueError, match=r"^generate: the logits of sequences \[0, 1\] were not finite"):
    broken.generate(prompt, 3)  # before: token 0 (the argmax of NaN) at every step


def test_nnx_cosformer_cache_past_its_horizon_is_refused_before_decoding():
  cos = _nnx_lm(functools.partial(pnnx.get_attention("cosformer"), horizon=5))
  prompt = jnp.asarray([[3, 1, 4], [9, 2, 6]], jnp.int32)
  assert cos.generate(prompt, 2).shape == (2, 5)  # a cache of 5 positions: the horizon
  with pytest.raises(ValueError, match=r"^CosformerAttention: decoding past horizon=5 \(positions >= the horizon"):
    cos.generate(prompt, 4)  # a cache of 7 positions


# ============================================================================ primal-generate


@pytest.fixture
def lm_workdir(tmp_path):
  """The record of an LM run that saved no checkpoint (config.json only): the refusals come before loading."""
  from primal_jax.cli.config_lookup import load_config

  (tmp_path / "config.json").write_text(load_config("lm:smoke").to_json())
  return tmp_path


@pytest.mark.parametrize(
  "flag,message",
  [
    ("--temperature=nan", "temperature must be a finite number >= 0 (0: greedy), got nan"),
    ("--temperature=-1", "temperature must be a finite number >= 0 (0: greedy), got -1.0"),
    ("--prompt=", "--prompt must not be empty: a causal LM needs at least one byte to condition on"),
    ("--max_new_tokens=0", "--max_new_tokens must be >= 1, got 0"),
  ],
)
def test_generate_cli_refuses_sampling_arguments_in_one_line_before_loading(lm_workdir, capsys, flag, message):
  from primal_jax.cli.generate import main

  with pytest.raises(SystemExit) as exit_info:
    main(["primal-generate", f"--workdir={lm_workdir}", "--prompt=x", flag])
  assert exit_info.value.code == 2
  assert capsys.readouterr().err == f"error: {message}\n"  # before: "holds no checkpoint" for the last two
