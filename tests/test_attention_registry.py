"""The attention shell and the registry: one parameter layout for every mechanism, per-layer options, and a
mechanism added by a test file with one registry line that runs in a model with no config edit."""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import linen as nn

from primal_jax.attention import (
  ATTENTIONS,
  AttentionShell,
  LayerSpec,
  option_names,
  register_attention,
  unregister_attention,
)
from primal_jax.models import TransformerConfig
from primal_jax.models.registry import build_model

# Compares with float64 NumPy or golden numbers at float32 tolerances: full float32 matmuls on every platform.
pytestmark = pytest.mark.matmul_precision("highest")

B, N, D, H = 2, 7, 8, 2


class UniformAttention(AttentionShell):
  """Every query averages the values of the real keys, scaled by `gain`: the simplest core there is."""

  gain: float = 1.0

  supports_causal: ClassVar[bool] = False

  def validate(self) -> None:
    if self.gain <= 0:
      raise ValueError(f"gain must be > 0, got {self.gain}")

  def attend(self, q, k, v, *, inputs_k, mask, deterministic, dropout_rng, sow_weights):
    weights = jnp.ones(k.shape[:2], q.dtype) if mask is None else mask.astype(q.dtype)  # [B, M]
    mean = jnp.einsum("bm,bmhd->bhd", weights, v) / jnp.sum(weights, axis=1)[:, None, None]  # [B, H, p]
    return self.gain * jnp.broadcast_to(mean[:, None], q.shape)  # [B, N, H, p]


@pytest.fixture
def uniform():
  register_attention("uniform", UniformAttention)  # the one registry line
  yield
  unregister_attention("uniform")


def test_new_mechanism_runs_in_a_model_through_the_config(uniform):
  model_config = ml_collections.ConfigDict(
    dict(
      name="lra",
      layers=("uniform", "primal"),
      attention={"uniform": {"gain": 2.0}, "primal": {"low_rank": 2, "rank_multi": 2}},
      dim=D,
      hidden_dim=16,
      num_heads=H,
      dropout_rate=0.0,
      attention_dropout_rate=0.0,
    )
  )
  info = ml_collections.ConfigDict(dict(seq_len=N, vocab_size=11, num_classes=3))
  built = build_model(model_config, info)
  assert built.module.config.layer_attention(0).gain == 2.0
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 11, (B, N)), jnp.int32)
  mask = jnp.arange(N)[None, :] < jnp.array([[N], [4]])
  variables = jax.jit(built.module.init)(jax.random.key(0), tokens, mask)  # jitted: one compilation, not one per op
  block0 = variables["params"]["body"]["encoder"]["block_0"]["attention"]
  assert set(block0) == {"query", "key", "value", "out"}  # the shell's parameter tree
  logits, state = jax.jit(lambda v: built.module.apply(v, tokens, mask, mutable=["intermediates"]))(variables)
  assert logits.shape == (B, 3) and np.all(np.isfinite(logits))


def test_shell_output_is_the_core_between_the_projections(uniform):
  """The shell's projections and output around the core, against float64 NumPy (tolerance 1e-5 relative)."""
  layer = UniformAttention(num_heads=H, gain=0.5)
  x = jax.random.normal(jax.random.key(1), (B, N, D))
  mask = jnp.arange(N)[None, :] < jnp.array([[N], [3]])
  params = nn.unbox(layer.init(jax.random.key(2), x, mask=mask))["params"]
  got = np.asarray(layer.apply({"params": params}, x, mask=mask), np.float64)
  p64 = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  x64, m = np.asarray(x, np.float64), np.asarray(mask, np.float64)
  v = np.einsum("bnd,dhp->bnhp", x64, p64["value"]["kernel"]) + p64["value"]["bias"]
  mean = np.einsum("bm,bmhp->bhp", m, v) / m.sum(1)[:, None, None]
  heads = 0.5 * np.broadcast_to(mean[:, None], (B, N, H, D // H))
  expected = np.einsum("bnhp,hpe->bne", heads, p64["out"]["kernel"]) + p64["out"]["bias"]
  assert np.max(np.abs(got - expected)) <= 1e-5 * np.max(np.abs(expected))


def test_layer_specs_and_option_checks(uniform):
  assert option_names("uniform")[-1] == "gain" and "num_heads" not in option_names("uniform")
  config = TransformerConfig(layers=("uniform", ("uniform", {"gain": 3.0})), attention={"uniform": {"gain": 2.0}})
  assert config.layers == (LayerSpec("uniform", (("gain", 2.0),)), LayerSpec("uniform", (("gain", 3.0),)))
  assert hash(config.layers) == hash(TransformerConfig(layers=config.layers).layers)  # hashable, static
  with pytest.raises(ValueError, match="gain must be > 0"):
    TransformerConfig(layers=("uniform",), attention={"uniform": {"gain": 0.0}})
  with pytest.raises(ValueError, match="causal=True is not supported by UniformAttention"):
    jax.eval_shape(UniformAttention(num_heads=H, causal=True).init, jax.random.key(0), jnp.ones((B, N, D)))
  with pytest.raises(ValueError, match="already registered"):
    register_attention("primal", UniformAttention)
  with pytest.raises(ValueError, match="must subclass"):
    register_attention("dense", nn.Dense)


def test_every_registered_mechanism_shares_the_projection_layout():
  x = jnp.ones((B, N, D))
  for name, cls in ATTENTIONS.items():
    extra = {"max_len": N} if "max_len" in option_names(name) else {}
    if name == "nystromformer":
      extra = {"num_landmarks": N, "conv_kernel_size": 3}
    if name == "primal":
      extra = {"low_rank": 2, "num_samples": 4}
    if name == "soft":
      extra = {"num_landmarks": N}
    shapes = jax.eval_shape(cls(num_heads=H, **extra).init, jax.random.key(0), x)["params"]
    # Primal-Attention and KEP-SVGP have no value projection, SOFT no key projection (its keys are the queries).
    expected = {"query", "out"} | set(cls.projections)
    assert {"key", "value"} <= expected or name in ("primal", "soft", "kep_svgp"), name
    assert expected <= set(shapes), name
    assert nn.unbox(shapes)["query"]["kernel"].shape == (D, H, D // H), name
    assert nn.unbox(shapes)["out"]["kernel"].shape == (H, D // H, D), name
