"""Flax's contract for `nn.MultiHeadDotProductAttention`, met by every registered Linen mechanism (issue 53).

Leading batch axes (none, one, several) with masks broadcast as Flax's; plain parameters unless the caller's
initialisers are partitioned (and then never boxed twice); Flax's constructor arguments honoured (`normalize_qk`,
the output initialisers, the `*_dot_general` hooks, `attention_fn`), or refused in one line; the dtype rule;
Flax's input errors; softmax's Flax decode (no `causal` field, x64, bounds) and grouped-query attention. The
references: the same layer on the folded batch, Flax's own class on the same weights, and exact identities.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from primal_jax.attention import ATTENTIONS, SoftmaxAttention
from primal_jax.initializers import partitioned_attention_inits

B, N, D, H = 2, 7, 8, 2
# kep_svgp runs at its posterior mean here (`sample_posterior=False`: deterministic, no "posterior" stream), the
# contract being the shell's; its sampling has its own tests (tests/test_kep_svgp.py).
NAMES = sorted(ATTENTIONS)
# Options that make each mechanism run at these tiny shapes (the rest at their defaults).
OPTIONS = {
  "primal": {"low_rank": 2, "num_samples": 4},
  "linformer": {"max_len": N},
  "nystromformer": {"num_landmarks": N, "conv_kernel_size": 3},
  "soft": {"num_landmarks": N},
  "kep_svgp": {"low_rank": 2, "rank_multi": 2, "sample_posterior": False},
}


def layer(name, **kwargs):
  return ATTENTIONS[name](**{"num_heads": H, **OPTIONS.get(name, {}), **kwargs})


def x_of(shape, seed=0, dtype=np.float32):
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


@functools.cache
def params_of(name):
  """Random parameters of mechanism `name` at [B, N, D] (cached: one init per mechanism for the whole file)."""
  module = layer(name)
  variables = jax.eval_shape(module.init, jax.random.key(0), jnp.ones((B, N, D)))
  leaves, tree = jax.tree.flatten(variables["params"])
  rng = np.random.default_rng(1)
  values = [jnp.asarray(rng.uniform(0.2, 1.2, x.shape) if x.ndim == 2 else 0.4 * rng.standard_normal(x.shape), x.dtype)
            for x in leaves]  # fmt: skip
  return jax.tree.unflatten(tree, values)


def run(module, params, *args, **kwargs):
  """module.apply with the parameters and a fixed key for every RNG stream the layer draws from."""
  rngs = {stream: jax.random.key(9) for stream in getattr(module, "rng_streams", tuple)()}
  return module.apply({"params": params}, *args, rngs=rngs, **kwargs)


def boxed(tree) -> list[bool]:
  return [isinstance(v, nn.meta.AxisMetadata) for v in jax.tree.leaves(tree, is_leaf=nn.meta.is_axis_metadata)]


@pytest.mark.parametrize("name", NAMES)
def test_leading_batch_axes_and_masks_as_flax(name):
  """[2, 3, N, D] and [N, D] inputs give the folded batch's outputs; padding [2, 3, N] and Flax masks
  [2, 3, 1, N, N] (and a mask with no batch axes, broadcast) act as on the folded batch."""
  module, params = layer(name), params_of(name)
  x = x_of((2, 3, N, D))
  folded = run(module, params, x.reshape(6, N, D))
  out = run(module, params, x)
  assert out.shape == (2, 3, N, D)
  np.testing.assert_allclose(out.reshape(6, N, D), folded, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(run(module, params, x[1, 2]), folded[5], rtol=1e-5, atol=1e-6)
  pad = np.ones((2, 3, N), bool)
  pad[1, :, -2:] = False
  ref = run(module, params, x.reshape(6, N, D), mask=pad.reshape(6, N))
  out = run(module, params, x, mask=pad)
  np.testing.assert_allclose(out.reshape(6, N, D), ref, rtol=1e-5, atol=1e-6)
  full = nn.make_attention_mask(pad, pad)  # [2, 3, 1, N, N]
  ref = run(module, params, x.reshape(6, N, D), mask=full.reshape(6, 1, N, N))
  out = run(module, params, x, mask=full)
  np.testing.assert_allclose(out.reshape(6, N, D), ref, rtol=1e-5, atol=1e-6)
  everywhere = run(module, params, x, mask=jnp.ones((1, N, N), bool))  # no batch axes: broadcast
  np.testing.assert_allclose(everywhere.reshape(6, N, D), folded, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_parameters_plain_unless_partitioned(name):
  """Plain arrays by default (as Flax's); every parameter boxed with the models' partitioned initialisers; a
  user's partitioned kernel_init (lm1b's) is used as given, never boxed twice; partition_params=True (the NNX
  layer's request) boxes as the partitioned initialisers do."""
  x = jnp.ones((B, N, D))
  plain = jax.eval_shape(layer(name).init, jax.random.key(0), x)["params"]
  assert not any(boxed(plain)), name
  partitioned = jax.eval_shape(layer(name, **partitioned_attention_inits()).init, jax.random.key(0), x)["params"]
  assert all(boxed(partitioned)), name
  assert partitioned["query"]["kernel"].names == ("embed", "heads", "kv")
  assert partitioned["out"]["kernel"].names == ("heads", "kv", "embed")
  asked = jax.eval_shape(layer(name, partition_params=True).init, jax.random.key(0), x)["params"]
  assert jax.tree.map(lambda b: b.names, asked, is_leaf=nn.meta.is_axis_metadata) == jax.tree.map(
    lambda b: b.names, partitioned, is_leaf=nn.meta.is_axis_metadata
  )
  lm1b = nn.with_logical_partitioning(nn.initializers.xavier_uniform(), ("embed", "kv"))
  user = jax.eval_shape(layer(name, kernel_init=lm1b).init, jax.random.key(0), x)["params"]
  assert user["query"]["kernel"].names == ("embed", "kv")  # the user's box, once
  assert not isinstance(user["query"]["kernel"].value, nn.meta.AxisMetadata)
  assert all(boxed(user)), name


@pytest.mark.parametrize("name", ["softmax", "primal", "linear"])
def test_output_initialisers(name):
  """out_kernel_init / out_bias_init set the output projection only (Flax's fallback: kernel_init / bias_init)."""
  module = layer(name, kernel_init=nn.initializers.ones, out_kernel_init=nn.initializers.zeros,
                 out_bias_init=nn.initializers.ones)  # fmt: skip
  x = x_of((B, N, D))
  out, variables = module.init_with_output(jax.random.key(0), x)
  params = variables["params"]
  np.testing.assert_array_equal(params["query"]["kernel"], 1.0)
  np.testing.assert_array_equal(params["out"]["kernel"], 0.0)
  np.testing.assert_array_equal(params["out"]["bias"], 1.0)
  np.testing.assert_array_equal(out, 1.0)


def _scaled(params, factor, names):
  return {k: (jax.tree.map(lambda a: factor * a, v) if k in names else v) for k, v in params.items()}


@pytest.mark.parametrize("name", NAMES)
def test_normalize_qk_makes_the_layer_blind_to_query_and_key_scale(name):
  """normalize_qk=True: LayerNorm of the projected queries and keys ("query_ln", "key_ln", as Flax), so scaling
  their projections by 3 changes nothing. An identity, so checked in float64: float32 rounding moves SOFT's output
  (Newton-Schulz pseudo-inverse) by 3e-5, by more on some CPUs. It is exact up to LayerNorm's epsilon (1e-6), whose
  effect is eps / var(projection over a head): zero-mean query and key kernels keep that variance O(D) (params_of's
  positive kernels put it near 1e-2, where SOFT's float64 output moves by 7e-5); it measures 2e-6 here."""
  with jax.enable_x64(True):
    module = layer(name, normalize_qk=True)
    x = x_of((B, N, D), 2, np.float64)
    variables = jax.eval_shape(module.init, jax.random.key(0), x)
    zero_mean = lambda v: {**v, "kernel": x_of(v["kernel"].shape, 5)}  # noqa: E731
    params = {k: (zero_mean(v) if k in ("query", "key") else v) for k, v in params_of(name).items()}
    params = {**params, **{k: variables["params"][k] for k in variables["params"] if k.endswith("_ln")}}
    params = {k: (jax.tree.map(jnp.ones_like, v) if k.endswith("_ln") else v) for k, v in params.items()}
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)
    qk = {"query", "key"} & set(params)
    assert {f"{k}_ln" for k in qk} <= set(params)
    out = run(module, params, x)
    assert out.dtype == jnp.float64
    np.testing.assert_allclose(run(module, _scaled(params, 3.0, qk), x), out, rtol=0, atol=1e-5)


def _times(factor):
  def dot_general(*args, **kwargs):
    return factor * jax.lax.dot_general(*args, **kwargs)

  return dot_general


@pytest.mark.parametrize("name", NAMES)
def test_dot_general_hooks_drive_the_projections(name):
  """qkv_dot_general / out_dot_general (and the *_cls forms) are the projections' products: a hook that doubles
  the product equals doubled kernels (biases untouched)."""
  params, x = params_of(name), x_of((B, N, D), 3)
  projections = {"query", "key", "value"} & set(params)
  kernels = lambda names: {k: ({**v, "kernel": 2 * v["kernel"]} if k in names else v) for k, v in params.items()}  # noqa: E731
  ref = run(layer(name), kernels(projections), x)
  np.testing.assert_allclose(run(layer(name, qkv_dot_general=_times(2)), params, x), ref, rtol=1e-5)
  cls = layer(name, qkv_dot_general_cls=lambda: _times(2))
  np.testing.assert_allclose(run(cls, params, x), ref, rtol=1e-5)
  ref = run(layer(name), kernels({"out"}), x)
  np.testing.assert_allclose(run(layer(name, out_dot_general=_times(2)), params, x), ref, rtol=1e-5)


def test_softmax_matches_flax_with_its_hooks():
  """The softmax drop-in equals Flax's class on the same weights: default core, attention_fn, normalize_qk,
  force_fp32_for_softmax (weights kept in float32), 4-D inputs with a Flax mask."""
  x = x_of((2, 3, N, D), 4)
  mask = nn.make_causal_mask(jnp.ones((2, 3, N)))
  for kwargs in ({}, {"attention_fn": nn.dot_product_attention}, {"normalize_qk": True}):
    flax = nn.MultiHeadDotProductAttention(num_heads=H, **kwargs)
    params = flax.init(jax.random.key(5), x)["params"]
    expected = run(flax, params, x, mask=mask)
    np.testing.assert_allclose(run(SoftmaxAttention(H, **kwargs), params, x, mask=mask), expected,
                               rtol=1e-5, atol=1e-6)  # fmt: skip
  half = SoftmaxAttention(H, dtype=jnp.bfloat16, force_fp32_for_softmax=True)
  _, state = run(half, params_of("softmax"), x[0], sow_weights=True, mutable=["intermediates"])
  assert state["intermediates"]["attention_weights"][0].dtype == jnp.float32
  assert state["intermediates"]["attention_weights"][0].shape == (3, H, N, N)


@pytest.mark.parametrize("name", [n for n in NAMES if not ATTENTIONS[n].softmax_hooks])
def test_softmax_hooks_refused_by_other_cores(name):
  with pytest.raises(ValueError, match="attention_fn is not supported"):
    layer(name, attention_fn=nn.dot_product_attention).init(jax.random.key(0), jnp.ones((B, N, D)))


@pytest.mark.parametrize("name", NAMES)
def test_half_precision_kept_with_dtype_none(name):
  """dtype=None with bfloat16 parameters and inputs computes and returns bfloat16 (Flax's promotion)."""
  module = layer(name, param_dtype=jnp.bfloat16)
  params = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params_of(name))
  x = x_of((B, N, D), 5, jnp.bfloat16)
  out = run(module, params, x)
  assert out.dtype == jnp.bfloat16, name
  ref = run(layer(name), params_of(name), x.astype(jnp.float32))
  assert np.all(np.isfinite(np.asarray(out, np.float32)))
  assert np.linalg.norm(np.asarray(out, np.float32) - ref) <= 0.1 * np.linalg.norm(ref) + 1e-3, name


def test_inputs_v_without_inputs_k_is_refused():
  with pytest.raises(ValueError, match="`inputs_k` cannot be None if `inputs_v` is not None"):
    layer("softmax").init(jax.random.key(0), jnp.ones((B, N, D)), inputs_v=jnp.ones((B, N, D)))


def test_softmax_decode_as_flax():
  """decode=True with no `causal` field: token by token equals Flax's decode on the same weights (which masks to
  the cache index), and the full causal forward; under x64 too; another batch or past the cache is refused
  (ValueError eagerly, NaN outputs under jit)."""
  x = x_of((B, N, D), 6)
  flax = nn.MultiHeadDotProductAttention(num_heads=H, decode=True)
  ours = SoftmaxAttention(H, decode=True)
  variables = flax.init(jax.random.key(0), x)
  params = variables["params"]
  expected = run(SoftmaxAttention(H, causal=True), params, x)
  cache_f, cache_o = variables["cache"], ours.init(jax.random.key(0), x)["cache"]
  for t in range(N):
    y_f, state_f = flax.apply({"params": params, "cache": cache_f}, x[:, t : t + 1], mutable=["cache"])
    y_o, state_o = ours.apply({"params": params, "cache": cache_o}, x[:, t : t + 1], mutable=["cache"])
    cache_f, cache_o = state_f["cache"], state_o["cache"]
    np.testing.assert_allclose(y_o, y_f, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y_o[:, 0], expected[:, t], rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="past the cache"):
    ours.apply({"params": params, "cache": cache_o}, x[:, :1], mutable=["cache"])
  step = jax.jit(lambda c, t: ours.apply({"params": params, "cache": c}, t, mutable=["cache"])[0])
  assert np.all(np.isnan(step(cache_o, x[:, :1])))
  with pytest.raises(ValueError, match="batch"):
    ours.apply({"params": params, "cache": cache_o}, x[:1, :1], mutable=["cache"])
  with jax.enable_x64(True):
    cache = ours.init(jax.random.key(0), x)["cache"]
    y, _ = ours.apply({"params": params, "cache": cache}, x[:, :1], mutable=["cache"])
    np.testing.assert_allclose(y[:, 0], expected[:, 0], rtol=1e-5, atol=1e-6)


def test_grouped_query_attention():
  """num_kv_heads=1: equal to full multi-head attention whose key/value heads are copies; the decode cache holds
  H_kv heads (H / H_kv times smaller) and decodes the full forward."""
  heads, x = 4, x_of((B, N, D), 7)
  gqa = SoftmaxAttention(heads, num_kv_heads=1, causal=True)
  params = gqa.init(jax.random.key(1), x)["params"]
  params = {**params, "key": jax.tree.map(lambda a: a + 0.3, params["key"])}
  full = {**params, **{n: jax.tree.map(lambda a: jnp.repeat(a, heads, axis=-2), params[n]) for n in ("key", "value")}}
  expected = run(SoftmaxAttention(heads, causal=True), full, x)
  np.testing.assert_allclose(run(gqa, params, x), expected, rtol=1e-5, atol=1e-6)
  dec = gqa.clone(decode=True)
  cache = dec.init(jax.random.key(0), x)["cache"]
  assert cache["cached_key"].shape == (B, 1, D // heads, N)
  for t in range(N):
    y, state = dec.apply({"params": params, "cache": cache}, x[:, t : t + 1], mutable=["cache"])
    cache = state["cache"]
    np.testing.assert_allclose(y[:, 0], expected[:, t], rtol=1e-5, atol=1e-6)


KV_HEADS = 4  # H = 4 query heads in 2 groups of 2 (D = 8: head width 2)
# The causal, decodable form of each mechanism that decodes (its own options for it).
DECODE = {
  "softmax": {}, "gpt2": {}, "linear": {}, "performer": {}, "flowformer": {},
  "cosformer": {"horizon": N}, "primal": {"data_dependent": False},
}  # fmt: skip


def _repeat_heads(params, names, group):
  return {k: (jax.tree.map(lambda a: jnp.repeat(a, group, axis=-2), v) if k in names else v) for k, v in params.items()}


def _grouped_params(module, x):
  """The layer's initial parameters, each shifted by a ramp (no two heads of a kernel or a bias alike)."""
  params = module.init({"params": jax.random.key(1), "redraw": jax.random.key(2)}, x)["params"]
  return jax.tree.map(lambda a: a + 0.1 * jnp.arange(a.size, dtype=a.dtype).reshape(a.shape) / a.size, params)


@pytest.mark.parametrize("name", NAMES)
def test_num_kv_heads_equals_repeated_heads_or_is_refused(name):
  """num_kv_heads=2 of 4 heads: equal to the layer with 4 key/value heads whose kernels repeat each shared head
  (the definition of grouped-query attention); a decoding mechanism decodes its full causal forward from a cache
  whose key/value state is per key/value head (half the size where the state is of keys and values alone);
  a mechanism whose keys are its queries refuses it in one line naming the argument."""
  grouped = layer(name, num_heads=KV_HEADS, num_kv_heads=2)
  x = x_of((B, N, D), 8)
  if not ATTENTIONS[name].supports_kv_groups:
    with pytest.raises(ValueError, match=r"^num_kv_heads=2 \(< num_heads=4\) is not supported by .*: its keys are"):
      grouped.init(jax.random.key(0), x)
    return
  params = _grouped_params(grouped, x)
  kv = {"key", "value"} & set(params)
  assert all(params[k]["kernel"].shape[-2] == 2 for k in kv)
  full = layer(name, num_heads=KV_HEADS)
  np.testing.assert_allclose(run(grouped, params, x), run(full, _repeat_heads(params, kv, 2), x), rtol=1e-5,
                             atol=1e-6)  # fmt: skip
  if name not in DECODE:
    return
  options = {"causal": True, **DECODE[name]}
  causal = grouped.clone(**options)
  params = _grouped_params(causal, x)  # Primal's causal form has data-independent weights of other shapes
  expected = run(causal, params, x)
  np.testing.assert_allclose(expected, run(full.clone(**options), _repeat_heads(params, kv, 2), x), rtol=1e-5,
                             atol=1e-6)  # fmt: skip
  dec = causal.clone(decode=True)
  cache = dec.init(jax.random.key(0), x)["cache"]
  ungrouped = full.clone(decode=True, **options).init(jax.random.key(0), x)["cache"]
  heads = {k: (v.shape, ungrouped[k].shape) for k, v in cache.items() if v.ndim > 1}
  kv_only = ATTENTIONS[name].native_kv_groups or getattr(ATTENTIONS[name], "kv_only_state", False)
  shrunk = {k for k, (g, u) in heads.items() if g != u}
  assert all(g[:1] + g[2:] == u[:1] + u[2:] and 2 * g[1] == u[1] for k, (g, u) in heads.items() if k in shrunk)
  if kv_only:
    assert shrunk == set(heads), heads  # every head-carrying leaf per key/value head
  elif name == "primal":
    assert shrunk == {"sum_k"}, heads  # the query sums stay per query head
  else:
    assert not shrunk, heads  # flowformer: its flows sum queries too, a state per query head
  step = jax.jit(lambda c, x_t: dec.apply({"params": params, "cache": c}, x_t, mutable=["cache"]))
  for t in range(N):
    y, state = step(cache, x[:, t : t + 1])
    cache = state["cache"]
    np.testing.assert_allclose(y[:, 0], expected[:, t], rtol=2e-5, atol=2e-6)
