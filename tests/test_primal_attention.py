"""Tests of primal_jax.attention.PrimalAttention against a float64 NumPy forward (SPEC 1-5)."""

import functools
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest
from absl.testing import parameterized
from attention_utils import apply, normal, padding_mask, random_params, to_numpy
from flax import linen as nn
from jax.test_util import check_grads

from primal_jax.attention import ATTENTIONS, PrimalAttention, SoftmaxAttention, get_attention, primal_head
from primal_jax.feature_maps import cosine_feature_map, softmax_kernel_feature_map
from primal_jax.initializers import partitioned_attention_inits
from primal_jax.ksvd import PAPER, RELEASE_LRA, RELEASE_SEQUENCE, KSVDSpec, collect_terms, ksvd_loss, ksvd_objective
from primal_jax.sampling import padding_aware_positions, release_sample_indices

# Compares with float64 NumPy or golden numbers at float32 tolerances: full float32 matmuls on every platform.
pytestmark = pytest.mark.matmul_precision("highest")

B, N, D, H, S, NS = 3, 10, 16, 2, 3, 6
P = D // H

# name -> (PrimalAttention kwargs, use a padding mask)
CONFIGS = {
  "data_dependent": (dict(num_samples=NS), False),
  "data_dependent_repeated_rows": (dict(num_samples=14), False),  # n > N (release LRA)
  "data_independent": (dict(data_dependent=False), False),
  "causal": (dict(data_dependent=False, causal=True), False),
  "softmax_kernel": (dict(num_samples=NS, feature_map="softmax_kernel"), False),
  "causal_softmax_kernel": (dict(data_dependent=False, causal=True, feature_map="softmax_kernel"), False),
  "masked_release": (dict(num_samples=NS), True),
  "masked_release_unmasked_outputs": (dict(num_samples=NS, mask_outputs=False), True),
  "masked_padding_aware": (dict(num_samples=NS, sampling="padding_aware"), True),
  "causal_masked_release": (dict(data_dependent=False, causal=True), True),
  "causal_masked_padding_aware": (dict(data_dependent=False, causal=True, sampling="padding_aware"), True),
  "softmax_kernel_padding_aware": (dict(num_samples=NS, feature_map="softmax_kernel", sampling="padding_aware"), True),
  "narrow_qkv_and_out": (dict(data_dependent=False, qkv_features=8, out_features=5), False),
}


def _module(**kwargs):
  return PrimalAttention(num_heads=H, low_rank=S, **kwargs)


def _setup(name, seed=0):
  kwargs, masked = CONFIGS[name]
  module = _module(**kwargs)
  x = normal(seed, (B, N, D))
  mask = padding_mask(seed, B, N) if masked else None
  params = random_params(module, x, seed, mask)
  return module, kwargs, x, mask, params


def _reference(kwargs, params, x, mask, x_k=None):
  projection = None
  if kwargs.get("feature_map") == "softmax_kernel":
    p = params["query"]["kernel"].shape[-1]
    projection = np.asarray(jax.random.normal(jax.random.key(kwargs.get("feature_seed", 0)), (p, p), jnp.float32))
  return ref.primal_layer(
    to_numpy(params),
    x,
    x_k,
    num_heads=H,
    low_rank=S,
    num_samples=kwargs.get("num_samples") if kwargs.get("data_dependent", True) else None,
    causal=kwargs.get("causal", False),
    feature_map=kwargs.get("feature_map", "cosine"),
    projection=projection,
    padding=mask,
    sampling=kwargs.get("sampling", "release"),
    mask_outputs=kwargs.get("mask_outputs", True),
  )


@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_matches_numpy(name):
  """Output, e/r scores and the KSVD loss equal an independent float64 forward (rel. error < 1e-5)."""
  module, kwargs, x, mask, params = _setup(name)
  out, escore, rscore, ksvd = apply(module, params, x, mask)
  out_ref, e_ref, r_ref, we_x, wr_x = _reference(kwargs, params, x, mask)
  ref.assert_rel_close(out, out_ref, 1e-5, "out")
  ref.assert_rel_close(escore, e_ref, 1e-5, "escore")
  ref.assert_rel_close(rscore, r_ref, 1e-5, "rscore")
  aware = kwargs.get("sampling") == "padding_aware" and mask is not None
  p64 = to_numpy(params)
  for spec in (RELEASE_SEQUENCE, RELEASE_LRA, PAPER):
    j = ref.layer_j(
      e_ref,
      r_ref,
      p64["Lambda"],
      p64["We"],
      p64["Wr"],
      we_x,
      wr_x,
      convention=spec.convention,
      trace=spec.trace,
      reduction=spec.reduction,
      valid=mask if aware else None,
    )
    (terms,) = collect_terms(ksvd)
    ref.assert_rel_close(ksvd_objective(terms, spec), j, 1e-5, f"J {spec}")
    ref.assert_rel_close(ksvd_loss(ksvd, spec), np.mean(j**2), 2e-5, f"loss {spec}")  # squared: 2x the J error


def test_cross_attention_rows_come_from_keys_input():
  """inputs_k feeds the keys and F_X; inputs_kv is an alias; inputs_v is ignored (no value projection)."""
  module, kwargs, x, _, params = _setup("data_dependent")
  y = normal(7, (B, N, D))
  out = module.apply({"params": params}, x, y)
  out_ref = _reference(kwargs, params, x, None, x_k=y)[0]
  ref.assert_rel_close(out, out_ref, 1e-5)
  np.testing.assert_array_equal(module.apply({"params": params}, x, inputs_kv=y), out)
  np.testing.assert_array_equal(module.apply({"params": params}, x, y, 5.0 * y), out)
  assert ref.rel_err(module.apply({"params": params}, x), out) > 1e-2


def test_param_shapes_and_logical_axes():
  """Parameter layout of SPEC 1-3 ([D, H, p] projections, [H, a, s] We/Wr) with logical-axis boxes (given
  partitioned initialisers, as the models pass them; plain arrays otherwise, as Flax's)."""
  plain = jax.eval_shape(_module(num_samples=NS).init, jax.random.key(0), jnp.ones((B, N, D)))
  assert not any(isinstance(v, nn.meta.AxisMetadata) for v in jax.tree.leaves(plain, is_leaf=nn.meta.is_axis_metadata))
  for data_dependent, a in ((True, NS), (False, P)):
    module = _module(
      num_samples=NS if data_dependent else None, data_dependent=data_dependent, **partitioned_attention_inits()
    )
    variables = jax.eval_shape(module.init, jax.random.key(0), jnp.ones((B, N, D)))  # boxes, no compile
    assert isinstance(variables["params"]["We"], nn.LogicallyPartitioned)
    shapes = jax.tree_util.tree_map(lambda v: v.shape, nn.meta.unbox(variables["params"]))
    assert shapes == {
      "query": {"kernel": (D, H, P), "bias": (H, P)},
      "key": {"kernel": (D, H, P), "bias": (H, P)},
      "We": (H, a, S),
      "Wr": (H, a, S),
      "Lambda": (H, S),
      "combine": {"kernel": (2 * S, P), "bias": (P,)},
      "out": {"kernel": (H, P, D), "bias": (D,)},
    }
    assert variables["params"]["We"].names == ("heads", None, "rank")
  assert _module().sampled_rows == S * 10
  assert _module(rank_multi=5).sampled_rows == S * 5
  assert _module(data_dependent=False).sampled_rows is None


def test_init_does_not_sow_stale_terms():
  """init returns parameters only, so apply(init_variables, mutable=["ksvd"]) holds exactly one KSVDTerms."""
  module, _, x, _, _ = _setup("data_dependent")
  variables = jax.eval_shape(module.init, jax.random.key(0), x)
  assert set(variables) == {"params"}
  params = random_params(module, x)
  _, state = module.apply({**variables, "params": params}, x, mutable=["ksvd", "intermediates"])
  assert len(collect_terms(state["ksvd"])) == 1
  assert len(state["intermediates"]["escore"]) == 1


SHAPE_CONFIGS = ["data_dependent", "data_independent", "causal", "softmax_kernel"]


class ShapesAndDtypesTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(name=SHAPE_CONFIGS, dtype=[jnp.float32, jnp.bfloat16])
  def test_shapes_and_dtypes(self, name, dtype):
    """[B, N, D] -> [B, N, D] in the module dtype; scores [B, H, N, s]; KSVD terms in float32."""
    kwargs, _ = CONFIGS[name]
    module = _module(dtype=dtype, param_dtype=dtype, **kwargs)
    x = jnp.asarray(normal(1, (B, N, D)), dtype)
    for leaf in jax.tree_util.tree_leaves(nn.meta.unbox(jax.eval_shape(module.init, jax.random.key(0), x))):
      chex.assert_type(leaf, dtype)  # parameters in param_dtype
    params = random_params(module, x)
    fn = self.variant(lambda p, v: module.apply({"params": p}, v, mutable=["intermediates", "ksvd"]))
    out, state = fn(params, x)
    chex.assert_shape(out, (B, N, D))
    chex.assert_type(out, dtype)
    chex.assert_tree_all_finite(out)
    chex.assert_shape([state["intermediates"]["escore"][0], state["intermediates"]["rscore"][0]], (B, H, N, S))
    chex.assert_type(state["intermediates"]["escore"][0], dtype)
    (terms,) = collect_terms(state["ksvd"])
    for leaf in jax.tree_util.tree_leaves(terms):
      chex.assert_type(leaf, jnp.float32)
    assert np.isfinite(float(ksvd_loss(state["ksvd"])))

  def test_bfloat16_close_to_float32(self):
    """The bf16 layer (bf16 params) tracks the float32 layer to bf16 precision."""
    module, _, x, _, params = _setup("data_dependent")
    out32 = module.apply({"params": params}, x)
    module16 = _module(num_samples=NS, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    params16 = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), params)
    out16 = module16.apply({"params": params16}, x.astype(jnp.bfloat16))
    assert ref.rel_err(out16, out32) < 5e-2


@pytest.mark.parametrize("name", ["data_dependent", "causal", "softmax_kernel", "masked_padding_aware"])
def test_vmap_over_heads_equals_loop_of_primal_head(name):
  """The module's vmapped scores equal an explicit Python loop calling primal_head per (sequence, head)."""
  module, kwargs, x, mask, params = _setup(name)
  _, escore, rscore, _ = apply(module, params, x, mask)
  q = jnp.einsum("bnd,dhp->bhnp", x, params["query"]["kernel"]) + params["query"]["bias"][None, :, None]
  k = jnp.einsum("bnd,dhp->bhnp", x, params["key"]["kernel"]) + params["key"]["bias"][None, :, None]
  aware = kwargs.get("sampling") == "padding_aware"
  if kwargs.get("feature_map") == "softmax_kernel":
    projection = jax.random.normal(jax.random.key(0), (P, P), jnp.float32)
    feature_map = functools.partial(softmax_kernel_feature_map, projection=projection)
  else:
    feature_map = cosine_feature_map
  data_dependent = kwargs.get("data_dependent", True)
  if data_dependent:
    positions = (
      padding_aware_positions(jnp.asarray(mask), NS) if aware else np.tile(release_sample_indices(N, NS), (B, 1))
    )
  for b in range(B):
    valid = jnp.asarray(mask[b], jnp.float32) if aware else None
    for h in range(H):
      rows = x[b, np.asarray(positions[b]), h * P : (h + 1) * P] if data_dependent else None
      e, r, _, _ = primal_head(
        q[b, h],
        k[b, h],
        params["We"][h],
        params["Wr"][h],
        rows,
        valid,
        feature_map=feature_map,
        running_mean=kwargs.get("causal", False),
        normalize=kwargs.get("feature_map") == "softmax_kernel",
        causal_normalizer=kwargs.get("causal", False),
      )
      np.testing.assert_allclose(escore[b, h], e, rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(rscore[b, h], r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["causal", "causal_softmax_kernel"])
def test_causality(name):
  """causal=True: perturbing x at positions > t never changes outputs at positions <= t."""
  module, _, x, _, params = _setup(name)
  out = np.asarray(module.apply({"params": params}, x))
  for t in (0, 3, N - 2):
    x2 = x.copy()
    x2[:, t + 1 :] = normal(t + 50, x2[:, t + 1 :].shape, scale=3.0)
    out2 = np.asarray(module.apply({"params": params}, x2))
    np.testing.assert_allclose(out2[:, : t + 1], out[:, : t + 1], rtol=1e-6, atol=1e-6)
    assert ref.rel_err(out2[:, t + 1 :], out[:, t + 1 :]) > 1e-3  # the perturbation is visible later


def test_non_causal_data_dependent_mixes_tokens():
  """Control for the causality test: the data-dependent layer's early outputs see later positions."""
  module, _, x, _, params = _setup("data_dependent")
  x2 = x.copy()
  x2[:, -1] += 1.0  # the last position is always sampled
  out, out2 = module.apply({"params": params}, x), module.apply({"params": params}, x2)
  assert ref.rel_err(np.asarray(out2)[:, :1], np.asarray(out)[:, :1]) > 1e-3


def _perturb_padding(x, mask, seed):
  x2 = x.copy()
  x2[~mask] = normal(seed, x2[~mask].shape, scale=5.0)
  return x2


@pytest.mark.parametrize(
  "name", ["masked_padding_aware", "causal_masked_padding_aware", "softmax_kernel_padding_aware"]
)
def test_padding_aware_ignores_padded_content(name):
  """sampling="padding_aware": padded content changes neither real outputs nor the KSVD loss."""
  module, _, x, mask, params = _setup(name)
  out, _, _, ksvd = apply(module, params, x, mask)
  out2, _, _, ksvd2 = apply(module, params, _perturb_padding(x, mask, 9), mask)
  np.testing.assert_allclose(np.asarray(out2)[mask], np.asarray(out)[mask], rtol=1e-5, atol=1e-6)
  for spec in (RELEASE_SEQUENCE, RELEASE_LRA, PAPER, KSVDSpec("release", "data", "batch")):
    np.testing.assert_allclose(ksvd_loss(ksvd2, spec), ksvd_loss(ksvd, spec), rtol=1e-5)
  # Padded outputs are zeroed before the output projection: they equal its bias.
  np.testing.assert_allclose(np.asarray(out)[~mask], np.broadcast_to(params["out"]["bias"], ((~mask).sum(), D)))


@pytest.mark.parametrize("name", ["masked_release", "causal_masked_release"])
def test_release_sampling_sees_padded_content(name):
  """Control (release parity): padded content DOES change real outputs and the loss."""
  module, _, x, mask, params = _setup(name)
  out, _, _, ksvd = apply(module, params, x, mask)
  out2, _, _, ksvd2 = apply(module, params, _perturb_padding(x, mask, 9), mask)
  assert ref.rel_err(np.asarray(out2)[mask], np.asarray(out)[mask]) > 1e-3
  assert ref.rel_err(ksvd_loss(ksvd2), ksvd_loss(ksvd)) > 1e-3


@pytest.mark.parametrize("name", ["masked_release", "masked_padding_aware", "causal_masked_padding_aware"])
def test_flax_attention_mask_equals_padding_vector(name):
  """[B, 1, N, N] make_attention_mask(pad, pad) (and [B, H, N, N], and & causal) act like the [B, N] vector."""
  module, kwargs, x, mask, params = _setup(name)
  out, _, _, ksvd = apply(module, params, x, mask)
  forms = [nn.make_attention_mask(mask, mask), jnp.broadcast_to(nn.make_attention_mask(mask, mask), (B, H, N, N))]
  if kwargs.get("causal"):
    forms.append(nn.combine_masks(nn.make_attention_mask(mask, mask), nn.make_causal_mask(mask)))
  for form in forms:
    out_f, _, _, ksvd_f = apply(module, params, x, form)
    np.testing.assert_allclose(out_f, out, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ksvd_loss(ksvd_f), ksvd_loss(ksvd), rtol=1e-6)
  out_none = module.apply({"params": params}, x)
  assert ref.rel_err(out_none, out) > 1e-3  # the mask matters


# ----------------------------------------------------------------------------- gradients


@pytest.mark.parametrize(
  "kwargs",
  [
    dict(rows=True),
    dict(running_mean=True, causal_normalizer=True),
    dict(rows=True, normalize=True),
    dict(running_mean=True, normalize=True, causal_normalizer=True, valid=True),
  ],
  ids=["data_dependent", "causal", "softmax_kernel", "causal_softmax_masked"],
)
def test_check_grads_scores(kwargs):
  """Reverse-mode gradients of primal_head's scores match finite differences (float64)."""
  kwargs = dict(kwargs)
  with jax.enable_x64(True):
    f64 = lambda a: jnp.asarray(a, jnp.float64)
    q, k = f64(normal(1, (N, P))), f64(normal(2, (N, P)))
    a = NS if kwargs.pop("rows", False) else P
    we, wr = f64(normal(3, (a, S))), f64(normal(4, (a, S)))
    rows = f64(normal(5, (NS, P))) if a == NS else None
    valid = f64(padding_mask(0, 3, N)[2]) if kwargs.pop("valid", False) else None
    normalize = kwargs.get("normalize", False)
    if normalize:
      projection = f64(normal(6, (P, P), scale=0.3))
      feature_map = functools.partial(softmax_kernel_feature_map, projection=projection)
    else:
      feature_map = cosine_feature_map

    def scores(q, k, we, wr):
      e, r, _, _ = primal_head(q, k, we, wr, rows, valid, feature_map=feature_map, **kwargs)
      return jnp.concatenate([e, r], -1)

    assert scores(q, k, we, wr).dtype == jnp.float64
    check_grads(scores, (0.3 * q, 0.3 * k, we, wr), order=1, modes=["rev"], eps=1e-6, atol=1e-5, rtol=1e-5)


def test_check_grads_objective():
  """Reverse-mode gradients of the KSVD loss (both conventions) match finite differences (float64)."""
  from primal_jax.ksvd import ksvd_terms

  with jax.enable_x64(True):
    f64 = lambda *shape: jnp.asarray(np.random.default_rng(len(shape) + sum(shape)).standard_normal(shape))
    e, r, we_x, wr_x = f64(2, H, N, S), f64(2, H, N, S + 0), f64(2, H, P, S), f64(2, H, P, S)
    we, wr, lam = f64(H, NS, S), f64(H, NS, S), jnp.abs(f64(H, S)) + 0.1
    valid = jnp.asarray(padding_mask(1, 2, N), jnp.float64)
    for spec in (RELEASE_SEQUENCE, RELEASE_LRA, PAPER):
      loss = jax.jit(lambda *args, spec=spec: ksvd_loss([ksvd_terms(*args, valid=valid)], spec))
      check_grads(loss, (e, r, lam, we, wr, we_x, wr_x), order=1, modes=["rev"], eps=1e-6, atol=1e-5, rtol=1e-5)


def test_check_grads_full_layer():
  """Gradients of the full layer + KSVD loss w.r.t. its input match finite differences (float64)."""
  with jax.enable_x64(True):
    module = _module(num_samples=NS, param_dtype=jnp.float64)
    x = jnp.asarray(normal(2, (2, N, D)), jnp.float64)
    params = random_params(module, x, seed=3)

    @jax.jit
    def loss(v):
      out, state = module.apply({"params": params}, v, mutable=["ksvd"])
      return jnp.mean(out**2) + ksvd_loss(state["ksvd"])

    assert loss(x).dtype == jnp.float64
    check_grads(loss, (x,), order=1, modes=["rev"], eps=1e-6, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["data_dependent", "causal", "softmax_kernel", "masked_padding_aware"])
def test_no_nan_gradients_for_zero_inputs(name):
  """All-zero inputs (q = k = 0 with Flax's zero biases) give finite gradients through layer + KSVD loss."""
  kwargs, masked = CONFIGS[name]
  module = _module(**kwargs)
  x = jnp.zeros((B, N, D))
  mask = padding_mask(0, B, N) if masked else None
  params = random_params(module, x, mask=mask)
  # Flax's zero biases: with x = 0, q = k = 0 and phi(0) = 0 everywhere.
  params = jax.tree_util.tree_map_with_path(
    lambda path, a: jnp.zeros_like(a) if "bias" in jax.tree_util.keystr(path) else a, params
  )

  def loss(params, v):
    out, state = module.apply({"params": params}, v, mask=mask, mutable=["ksvd"])
    return jnp.mean(out) + ksvd_loss(state["ksvd"])

  value, (g_params, g_x) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)
  assert np.isfinite(float(value))
  chex.assert_tree_all_finite((g_params, g_x))
  assert np.any(np.asarray(g_params["out"]["bias"]) != 0)


@pytest.mark.parametrize(
  "name,feature_map", [("causal_masked_padding_aware", "softmax_kernel"), ("masked_padding_aware", "cosine")]
)
def test_left_padding_and_all_padding_sequences_are_finite(name, feature_map):
  """Leading padding (no real key yet) and an all-padding sequence: finite outputs, loss and gradients."""
  kwargs = dict(CONFIGS[name][0], feature_map=feature_map)
  module = _module(**kwargs)
  x = normal(4, (B, N, D))
  mask = np.ones((B, N), bool)
  mask[0, :4] = False  # left padding, as for right-aligned prompts
  mask[1, :] = False  # a batch-filler sequence
  params = random_params(module, x, mask=mask)
  specs = (RELEASE_SEQUENCE, RELEASE_LRA, PAPER)

  def loss(params, v, spec):
    out, state = module.apply({"params": params}, v, mask=mask, mutable=["ksvd"])
    return jnp.mean(out) + 1e-3 * ksvd_loss(state["ksvd"], spec), out

  @jax.jit
  def values_and_grads(params, v):  # one compile for the three conventions
    return [jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, v, spec) for spec in specs]

  for spec, ((value, out), grads) in zip(specs, values_and_grads(params, x), strict=True):
    assert np.isfinite(float(value)), spec
    chex.assert_tree_all_finite((out, grads))
  # Real positions of sequence 0 still equal the float64 reference.
  out_ref = _reference(kwargs, params, x, mask)[0]
  ref.assert_rel_close(np.asarray(out)[0, 4:], out_ref[0, 4:], 1e-5)


def test_no_recompilation_across_calls():
  """A jitted apply traces once for three calls with equal shapes but different values (mask too)."""
  module, _, x, mask, params = _setup("masked_padding_aware")

  @jax.jit
  @chex.assert_max_traces(n=1)
  def forward(params, x, mask):
    out, state = module.apply({"params": params}, x, mask=mask, mutable=["ksvd"])
    return out, ksvd_loss(state["ksvd"])

  results = []
  for seed in range(3):
    results.append(forward(params, normal(seed, (B, N, D)), jnp.asarray(padding_mask(seed, B, N))))
  assert ref.rel_err(results[1][0], results[0][0]) > 1e-3


# ----------------------------------------------------------------------------- drop-in for MultiHeadDotProductAttention


class Block(nn.Module):
  """A pre-norm Transformer block written for nn.MultiHeadDotProductAttention."""

  attention_cls: Any = nn.MultiHeadDotProductAttention

  @nn.compact
  def __call__(self, x, mask=None, deterministic=True):
    h = nn.LayerNorm()(x)
    h = self.attention_cls(num_heads=4, qkv_features=32, dropout_rate=0.1)(h, mask=mask, deterministic=deterministic)
    x = x + h
    return x + nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(64)(nn.LayerNorm()(x))))


def test_drop_in_replacement_for_flax_mha():
  """The same Block runs with the Flax MHA class and, unchanged, with partial(PrimalAttention, ...)."""
  x = normal(0, (2, 12, 32))
  pad = np.arange(12)[None] < np.array([[12], [9]])
  mask = nn.make_attention_mask(pad, pad)
  for cls in (nn.MultiHeadDotProductAttention, functools.partial(PrimalAttention, low_rank=4, num_samples=8)):
    block = Block(attention_cls=cls)
    params = random_params(block, x, mask=mask, scale=0.2)  # eval_shape of init: no initialiser compiles

    @functools.partial(jax.jit, static_argnums=3)
    def run(x, mask, key, deterministic, block=block, params=params):
      return block.apply({"params": params}, x, mask, deterministic, rngs={"dropout": key}, mutable=["ksvd"])

    for deterministic in (True, False):  # dropout off and on
      out, state = run(x, mask, jax.random.key(2, impl="rbg"), deterministic)
      chex.assert_shape(out, x.shape)
      chex.assert_tree_all_finite(out)
      if cls is nn.MultiHeadDotProductAttention:
        assert not state.get("ksvd")
        continue
      (terms,) = collect_terms(state["ksvd"])
      chex.assert_shape(terms.energy_e, (2, 4))
      assert float(ksvd_loss(state["ksvd"])) > 0
      out2, _ = run(x, mask, jax.random.key(3, impl="rbg"), deterministic)
      if deterministic:
        np.testing.assert_array_equal(out2, out)
      else:  # dropout is active: another key gives another output
        assert ref.rel_err(out2, out) > 1e-4


def test_dropout_deterministic_equals_no_dropout():
  """deterministic=True makes the dropout layer the identity (same output as dropout_rate=0)."""
  module, _, x, _, params = _setup("data_dependent")
  with_dropout = _module(num_samples=NS, dropout_rate=0.5)
  np.testing.assert_array_equal(
    with_dropout.apply({"params": params}, x, deterministic=True), module.apply({"params": params}, x)
  )
  with pytest.raises(Exception):  # noqa: B017 - Flax's error type for a missing deterministic flag
    with_dropout.apply({"params": params}, x)


# ----------------------------------------------------------------------------- errors


X = np.zeros((B, N, D), np.float32)


@pytest.mark.parametrize(
  "kwargs,inputs,call_kwargs,match",
  [
    (dict(), X[0, 0], {}, "inputs_q"),
    (dict(num_heads=3), X, {}, "qkv_features"),
    (dict(data_dependent=False, qkv_features=10, num_heads=4), X, {}, "qkv_features"),
    (dict(qkv_features=8), X, {}, "qkv_features"),  # data-dependent needs qkv_features == width
    (dict(num_heads=0), X, {}, "num_heads"),
    (dict(low_rank=0), X, {}, "low_rank"),
    (dict(low_rank=5, num_samples=4), X, {}, "low_rank"),
    (dict(num_samples=0), X, {}, "num_samples"),
    (dict(num_samples=N + 2, allow_repeated_samples=False), X, {}, "allow_repeated_samples"),
    (dict(num_samples=NS), X, dict(mask=np.ones((B, N + 1), bool)), "mask"),
    (dict(num_samples=NS), X, dict(mask=np.ones((B, 1, N, N + 1), bool)), "mask"),
    (dict(causal=True), X, {}, "data_dependent"),
    (dict(data_dependent=False, feature_map="softmax_kernel", decode=True), X, {}, "decode"),  # mixes positions
    (dict(feature_map="relu"), X, {}, "feature_map"),
    (dict(sampling="random"), X, {}, "sampling"),
    (dict(init_style="kaiming"), X, {}, "init_style"),
    (dict(num_samples=NS), X, dict(inputs_k=X[:, :-1]), "inputs_k"),
    (dict(num_samples=NS), X, dict(inputs_k=X, inputs_kv=X), "inputs_kv"),
  ],
)
def test_clear_errors(kwargs, inputs, call_kwargs, match):
  """Invalid configurations and inputs raise ValueError naming the argument."""
  kwargs = {"num_heads": H, "low_rank": S, **kwargs}
  with pytest.raises(ValueError, match=match):
    jax.eval_shape(functools.partial(PrimalAttention(**kwargs).init, **call_kwargs), jax.random.key(0), inputs)


def test_n_below_num_samples_allowed_by_default():
  """Repeated rows (N < n) are the release's LRA behaviour and allowed unless disabled."""
  out = jax.eval_shape(_module(num_samples=N + 2).init_with_output, jax.random.key(0), X)[0]
  chex.assert_shape(out, (B, N, D))


def test_debug_checks_non_finite_inputs():
  """debug_checks=True: NaN/inf inputs raise (eager: ValueError; under jit: the callback's message)."""
  module = _module(num_samples=NS, debug_checks=True)
  x = normal(0, (B, N, D))
  params = random_params(module, x)
  bad = x.copy()
  bad[1, 2, 3] = np.nan
  module.apply({"params": params}, x)  # finite inputs pass
  with pytest.raises(ValueError, match="inputs_q"):
    module.apply({"params": params}, bad)
  with pytest.raises(ValueError, match="inputs_k"):
    module.apply({"params": params}, x, np.where(np.isnan(bad), np.inf, bad))
  jitted = jax.jit(lambda p, v: module.apply({"params": p}, v))
  jax.block_until_ready(jitted(params, x))
  with pytest.raises(Exception, match="inputs_q contains NaN"):
    jax.block_until_ready(jitted(params, bad))
  # Without debug checks the NaN silently propagates (that is what the flag is for).
  out = _module(num_samples=NS).apply({"params": params}, bad)
  assert np.isnan(np.asarray(out)).any()


def test_registry():
  """get_attention maps names to classes and rejects unknown names."""
  assert get_attention("primal") is PrimalAttention
  assert get_attention("softmax") is SoftmaxAttention
  assert {"primal", "softmax"} <= set(ATTENTIONS)  # plus the LRA baselines (tests/test_baseline_attention.py)
  with pytest.raises(ValueError, match="attention"):
    get_attention("nope")
