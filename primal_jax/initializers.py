"""Initialisers of the PyTorch release (SPEC section 7), as Flax initialisers.

`init_style` picks a family for every Linear-like layer of a module::

  "flax":  lecun-normal kernels, zero biases (Flax defaults);
  "torch": PyTorch nn.Linear defaults, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for
           kernel and bias (kaiming-uniform with a = sqrt(5));
  "gpt2":  N(0, 0.02) kernels and zero biases (the release's RL model).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import linen as nn

from primal_jax.validation import check_choice

INIT_STYLES = ("flax", "torch", "gpt2")


def torch_orthogonal_init():
  """PyTorch `orthogonal_` on a 3-D [H, a, s] tensor.

  PyTorch flattens to [H, a*s] and makes that matrix (semi-)orthogonal: with
  H <= a*s each head's block is a unit-Frobenius-norm vector and heads are
  mutually orthogonal. This is NOT per-head orthonormal columns, which is what
  `nn.initializers.orthogonal` would give.
  """

  def init(key, shape, dtype=jnp.float32):
    rows, cols = shape[0], math.prod(shape[1:])
    flat = jax.random.normal(key, (max(rows, cols), min(rows, cols)), jnp.float32)
    q, r = jnp.linalg.qr(flat)
    q = q * jnp.sign(jnp.diagonal(r))[None, :]  # unique Q, as PyTorch does
    if rows < cols:
      q = q.T
    return q.reshape(shape).astype(dtype)

  return init


def uniform01_init():
  """Lambda ~ U[0, 1) (the release's `torch.rand`)."""

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype)

  return init


def _torch_uniform(fan_in: int):
  bound = 1.0 / math.sqrt(fan_in)

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


def linear_inits(style: str, fan_in: int, kernel_init=None, bias_init=None):
  """(kernel_init, bias_init) for a Linear with `fan_in` inputs in `style`.

  Explicit `kernel_init` / `bias_init` override the style's choice ("flax" only),
  so modules keep MultiHeadDotProductAttention's constructor arguments.
  """
  check_choice(style, INIT_STYLES, "init_style")
  if style == "torch":
    return _torch_uniform(fan_in), _torch_uniform(fan_in)
  if style == "gpt2":
    return nn.initializers.normal(0.02), nn.initializers.zeros
  return (
    kernel_init if kernel_init is not None else nn.initializers.lecun_normal(),
    bias_init if bias_init is not None else nn.initializers.zeros,
  )


def embedding_init(style: str):
  """PyTorch nn.Embedding draws N(0, 1); GPT-2 N(0, 0.02); Flax variance scaling."""
  check_choice(style, INIT_STYLES, "init_style")
  if style == "torch":
    return nn.initializers.normal(1.0)
  if style == "gpt2":
    return nn.initializers.normal(0.02)
  return nn.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0)


# The logical axes of an attention layer's projections (`primal_jax.attention.AttentionShell`): queries, keys and
# values [embed, heads, kv] (biases [heads, kv]), the output [heads, kv, embed] (bias [embed]).
ATTENTION_AXES = {
  "kernel_init": ("embed", "heads", "kv"),
  "bias_init": ("heads", "kv"),
  "out_kernel_init": ("heads", "kv", "embed"),
  "out_bias_init": ("embed",),
}


def partitioned_attention_inits() -> dict:
  """Flax's default attention initialisers (lecun-normal kernels, zero biases) boxed with their logical axes.

  Passed by the project's models, so every parameter of their attention layers carries logical axes for sharded
  training (a layer with a partitioned initialiser boxes all its parameters; `init_style` still picks the
  functions of "torch" and "gpt2" layers). A layer built without them has plain parameters, as Flax's.
  """
  plain = {"kernel_init": nn.initializers.lecun_normal(), "bias_init": nn.initializers.zeros}
  plain |= {"out_kernel_init": plain["kernel_init"], "out_bias_init": plain["bias_init"]}
  return {name: nn.with_logical_partitioning(init, ATTENTION_AXES[name]) for name, init in plain.items()}
