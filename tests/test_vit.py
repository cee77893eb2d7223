"""`VisionTransformer` (DeiT layout) and DeiT's drop path in `EncoderBlock`.

Numerical parity of the whole model is tested against the release's golden case (tests/test_convert.py,
`cv_primal_deit`), other shapes against the float64 NumPy model (tests/test_convert_vit.py) and timm
(tests/test_convert_timm.py); here: the configs by name, the data-dependent row rule, shapes, errors,
stochastic depth, and the position-embedding resize.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from primal_jax.ksvd import RELEASE_LRA, ksvd_loss
from primal_jax.models.blocks import EncoderBlock
from primal_jax.models.config import TransformerConfig
from primal_jax.models.vit import (
  VisionTransformer,
  adapt_patch_kernel,
  decode_variant,
  resize_pos_embed,
  vit_config,
  vit_layers,
  with_token_count,
)

SMALL = dict(num_layers=3, dim=24, num_heads=2, low_rank=4, rank_multi=3, num_classes=5)


def _init(model, images, seed=0):
  return nn.unbox(jax.jit(model.init)(jax.random.key(seed), images)["params"])


def test_decode_variant():
  assert decode_variant("S/16") == {"dim": 384, "num_heads": 6, "patch_size": 16}
  assert decode_variant("Ti/4") == {"dim": 192, "num_heads": 3, "patch_size": 4}
  assert decode_variant("B/32")["num_heads"] == 12
  for bad in ("L/16", "S16", "S/0", "s/16"):
    with pytest.raises(ValueError, match="variant"):
      decode_variant(bad)


def test_named_configs():
  """DeiT-S/16: 12 blocks of width 384, 6 heads, MLP 1536, LayerNorm eps 1e-6, exact GELU, drop path 0.1."""
  deit = vit_config("S/16")
  assert (deit.num_layers, deit.dim, deit.num_heads, deit.hidden_dim) == (12, 384, 6, 1536)
  assert deit.layer_names == ("softmax",) * 12
  assert (deit.layer_norm_eps, deit.activation, deit.exact_gelu, deit.drop_path_rate) == (1e-6, "gelu", True, 0.1)
  plus = vit_config("S/16", "primal_plus", num_primal_layers=2, low_rank=32)
  assert plus.layer_names == ("softmax",) * 10 + ("primal",) * 2
  assert plus.layers[-1].kwargs == {"low_rank": 32, "rank_multi": 10, "data_dependent": True, "init_style": "torch"}
  assert vit_config("Ti/16", "primalformer").layer_names == ("primal",) * 12
  assert vit_layers("performer", 2) == ("performer", "performer")
  with pytest.raises(ValueError, match="model must be one of"):
    vit_layers("nope", 2)


@pytest.mark.parametrize("tokens,expected", [(17, 12), (10, 10), (12, 12)])
def test_rows_are_min_of_tokens_and_s_times_rank_multi(tokens, expected):
  """The release's CV rule n = min(N, s * rank_multi); an explicit num_samples and data-independent layers stay."""
  layers = (("primal", {"low_rank": 4, "rank_multi": 3}), ("primal", {"low_rank": 4, "num_samples": 7}))
  config = TransformerConfig(layers=layers + (("primal", {"data_dependent": False}),), dim=24, num_heads=2)
  resolved = with_token_count(config, tokens)
  assert resolved.layers[0].kwargs["num_samples"] == expected
  assert resolved.layers[1].kwargs["num_samples"] == 7
  assert "num_samples" not in resolved.layers[2].kwargs
  assert resolved.max_len == tokens and config.max_len == 512  # the original is untouched


@pytest.fixture(scope="module")
def plus_model():
  """A small Primal.+DeiT (3 blocks, the last Primal) on 16 x 16 RGB images, patch 4: N = 17 tokens."""
  model = VisionTransformer(vit_config("S/4", "primal_plus", **SMALL), image_size=16, patch_size=4)
  images = jax.random.normal(jax.random.key(1), (3, 16, 16, 3))
  return model, _init(model, images), images


def test_forward_shapes_params_and_ksvd_terms(plus_model):
  model, params, images = plus_model
  assert model.num_tokens == 17
  assert params["pos_embed"].shape == (1, 17, 24) and params["cls_token"].shape == (1, 1, 24)
  assert params["patch_embed"]["kernel"].shape == (4, 4, 3, 24)
  primal = params["encoder"]["block_2"]["attention"]
  assert primal["We"].shape == (2, 12, 4) and "value" not in primal  # n = min(17, 4 * 3)
  assert "value" in params["encoder"]["block_0"]["attention"]
  logits, state = jax.jit(lambda p, x: model.apply({"params": p}, x, mutable=["ksvd"]))(params, images)
  assert logits.shape == (3, 5) and np.all(np.isfinite(logits))
  assert np.isfinite(ksvd_loss(state["ksvd"], RELEASE_LRA))
  # Grayscale images (Fashion-MNIST): the patch embedding takes any channel count.
  gray = VisionTransformer(vit_config("S/7", **SMALL), image_size=28, patch_size=7)
  gray_params = _init(gray, jnp.zeros((1, 28, 28, 1)))
  assert jax.jit(gray.apply)({"params": gray_params}, jnp.zeros((2, 28, 28, 1))).shape == (2, 5)


def test_class_token_alone_feeds_the_head(plus_model):
  """The logits are the head applied to the final norm's output at position 0 (the class token)."""
  model, params, images = plus_model
  forward = jax.jit(lambda p, x: model.apply({"params": p}, x, capture_intermediates=True, mutable=["intermediates"]))
  logits, state = forward(params, images)
  features = state["intermediates"]["encoder"]["__call__"][0]  # [B, N, D] after the final norm
  head = params["head"]
  np.testing.assert_allclose(logits, features[:, 0] @ head["kernel"] + head["bias"], rtol=1e-5, atol=1e-6)


def test_bad_images_and_sizes(plus_model):
  model, params, _ = plus_model
  with pytest.raises(ValueError, match=r"images must have shape \[batch, 16, 16, channels\]"):
    model.apply({"params": params}, jnp.zeros((1, 3, 16, 16)))
  with pytest.raises(ValueError, match="multiple of patch_size"):
    VisionTransformer(vit_config("S/4", **SMALL), image_size=18, patch_size=4).init(
      jax.random.key(0), jnp.zeros((1, 18, 18, 3))
    )


def test_drop_path_rates_follow_timm():
  config = vit_config("S/16", drop_path_rate=0.1)
  np.testing.assert_allclose([config.drop_path(i) for i in range(12)], np.linspace(0, 0.1, 12), rtol=1e-12)
  assert TransformerConfig(layers=("softmax",), drop_path_rate=0.3).drop_path(0) == 0.0
  with pytest.raises(ValueError, match="drop_path_rate"):
    TransformerConfig(drop_path_rate=1.0)


def test_drop_path_drops_whole_branches_per_sample():
  """Block 1 of 2 at rate 0.5: each branch is dropped per sample (output = input when both are), kept
  branches scaled by 1/0.5; deterministic calls and rate 0 are the plain block."""
  base = dict(layers=("softmax", "softmax"), dim=8, num_heads=2, hidden_dim=16, dropout_rate=0.0)
  base["attention_dropout_rate"] = 0.0
  block = EncoderBlock(TransformerConfig(**base, drop_path_rate=0.5), layer=1)
  plain = EncoderBlock(TransformerConfig(**base), layer=1)
  x = jax.random.normal(jax.random.key(3), (400, 5, 8))
  variables = plain.init(jax.random.key(4), x, None, True)
  np.testing.assert_array_equal(block.apply(variables, x, None, True), plain.apply(variables, x, None, True))
  y = block.apply(variables, x, None, False, rngs={"dropout": jax.random.key(5)})
  unchanged = np.all(np.asarray(y) == np.asarray(x), axis=(1, 2))
  assert 70 <= unchanged.sum() <= 130  # both branches dropped: p = 0.25 of 400
  # A sample whose attention branch is dropped sees x + 2 * mlp(norm2(x)) (kept MLP branch scaled by 2).
  assert not np.allclose(y, plain.apply(variables, x, None, True))


def test_adapt_patch_kernel():
  """RGB -> gray sums the channels (a gray image as R = G = B embeds exactly as before); another patch size
  keeps a uniform patch's embedding for a constant kernel; what cannot be adapted is None."""
  rng = np.random.default_rng(0)
  kernel = rng.standard_normal((8, 8, 3, 5)).astype(np.float32)
  gray = rng.standard_normal((8, 8)).astype(np.float32)
  adapted = adapt_patch_kernel(kernel, (8, 8, 1, 5))
  assert adapted.shape == (8, 8, 1, 5) and adapted.dtype == np.float32
  np.testing.assert_allclose(
    np.einsum("pqc,pqcd->d", np.repeat(gray[..., None], 3, -1), kernel),
    np.einsum("pq,pqd->d", gray, adapted[:, :, 0]),
    rtol=1e-5, atol=1e-5,
  )  # fmt: skip
  constant = np.full((8, 8, 3, 2), 0.25, np.float32)
  smaller = adapt_patch_kernel(constant, (7, 7, 1, 2))
  np.testing.assert_allclose(smaller.sum(axis=(0, 1, 2)), constant.sum(axis=(0, 1, 2)), rtol=1e-6)
  assert adapt_patch_kernel(kernel, (8, 8, 3, 6)) is None and adapt_patch_kernel(kernel, (8, 8, 2, 5)) is None
  assert VisionTransformer.adapt_pretrained("patch_embed/kernel", kernel, (7, 7, 1, 5)).shape == (7, 7, 1, 5)


def test_resize_pos_embed():
  pos = np.random.default_rng(0).standard_normal((1, 17, 6)).astype(np.float32)
  np.testing.assert_allclose(resize_pos_embed(pos, 17), pos, atol=1e-6)
  bigger = resize_pos_embed(pos, 37)
  assert bigger.shape == (1, 37, 6)
  np.testing.assert_array_equal(bigger[:, 0], pos[:, 0])
  with pytest.raises(ValueError, match="square"):
    resize_pos_embed(pos, 20)


def test_rectangular_images_and_patches():
  model = VisionTransformer(vit_config("S/4", **dict(SMALL, num_layers=1)), image_size=(8, 24), patch_size=(4, 8))
  assert model.grid == (2, 3) and model.num_tokens == 7
  params = _init(model, jnp.zeros((1, 8, 24, 3)))
  assert params["patch_embed"]["kernel"].shape == (4, 8, 3, 24) and params["pos_embed"].shape == (1, 7, 24)
