"""The train state pytree and its sharded initialisation.

Shapes come from `jax.eval_shape` of the boxed init (no FLOPs, no memory), the
logical axis names on the boxes give each leaf its `NamedSharding`, and the
real init is jitted with those `out_shardings`, so every parameter and
optimizer moment is created directly in its final place on the mesh.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from flax import struct
from jax.sharding import Mesh

from primal_jax.training.sharding import LOGICAL_AXIS_RULES, tree_shardings


@struct.dataclass
class TrainState:
  """Everything a run needs to continue bit-for-bit after a restart.

  Attributes:
    step: int32 [], optimizer steps taken.
    params: the model's `params` collection.
    opt_state: the optax state.
    rng: uint32 [2], the run key; step t uses `fold_in(rng, t)`.
    model_state: other mutable collections (BatchNorm's `batch_stats`), {} if none.
  """

  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array
  model_state: Any


def make_init_fn(module: nn.Module, tx: optax.GradientTransformation, example_inputs: tuple):
  """A function rng -> boxed TrainState (params keep their logical-axis boxes)."""

  def init(rng: jax.Array) -> TrainState:
    params_rng, dropout_rng, run_rng = jax.random.split(rng, 3)
    variables = module.init({"params": params_rng, "dropout": dropout_rng}, *example_inputs, deterministic=True)
    variables = dict(variables)
    params = variables.pop("params")
    model_state = {k: v for k, v in variables.items() if k not in ("ksvd", "intermediates")}
    return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=tx.init(params),  # optax maps over the boxes, so moments keep the params' axis names
      rng=run_rng,
      model_state=model_state,
    )

  return init


def abstract_state(init_fn, rng: jax.Array, mesh: Mesh, rules=LOGICAL_AXIS_RULES):
  """(ShapeDtypeStruct tree with shardings, sharding tree) of the unboxed state."""
  boxed = jax.eval_shape(init_fn, rng)
  shardings = tree_shardings(boxed, mesh, rules)
  unboxed = nn.unbox(boxed)
  check_divisible_shardings(unboxed, shardings)
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), unboxed, shardings)
  return abstract, shardings


def check_divisible_shardings(abstract_tree, shardings) -> None:
  """A clear error when a sharded dimension does not split evenly over its mesh axes.

  E.g. 2 heads over a "model" axis of 4 devices: XLA would only fail later,
  deep inside init or a checkpoint restore.
  """
  for (path, leaf), sharding in zip(
    jax.tree_util.tree_leaves_with_path(abstract_tree), jax.tree.leaves(shardings), strict=True
  ):
    for dim, (size, axes) in enumerate(zip(leaf.shape, sharding.spec, strict=False)):
      if axes is None:
        continue
      axes = (axes,) if isinstance(axes, str) else tuple(axes)
      devices = math.prod(sharding.mesh.shape[a] for a in axes)
      if size % devices:
        raise ValueError(
          f"{jax.tree_util.keystr(path)}: dimension {dim} (size {size}) is sharded over mesh axes {axes} "
          f"({devices} devices) and does not divide evenly; choose a mesh_shape whose 'model' size divides "
          "num_heads (and the MLP width)"
        )


def init_state(init_fn, rng: jax.Array, shardings) -> TrainState:
  """Materialise the state directly in its sharded layout."""
  return jax.jit(lambda r: nn.unbox(init_fn(r)), out_shardings=shardings)(rng)
