"""Linen <-> NNX: the same layer in both front ends, and Linen models run through the NNX layers.

The NNX layer's Variables are the Linen layer's collections under the same paths, so converting is
copying arrays: `linen_variables(layer)` gives `{"params": ...}` for `LinenLayer.apply`, and
`load_linen_variables(layer, variables)` writes a Linen tree into an NNX layer. `to_linen` / `from_linen`
also build the layer of the other front end with the same options.

`through_nnx()` makes every attention of a Linen model run through its NNX layer (a Flax method
interceptor): the model's outputs, KSVD terms and scores then come from the NNX layers, which is how
`python -m primal_jax.convert verify --frontend=nnx` checks the golden cases on them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from flax import linen as nn
from flax import nnx

from primal_jax.attention.baselines.common import RANDOM_STATE_COLLECTION
from primal_jax.attention.shell import AttentionShell
from primal_jax.ksvd import KSVD_COLLECTION
from primal_jax.nnx.registry import nnx_class
from primal_jax.nnx.shell import SHELL_ARGS, Attention
from primal_jax.nnx.trees import assign, to_tree


def linen_variables(layer: Attention) -> dict[str, Any]:
  """`{"params": ...}` of the NNX layer, for its Linen class's `apply` (plus "cache" once initialised, and
  "random_state" where the layer holds one)."""
  variables = {"params": layer.params_tree()}
  if layer.cache is not None:
    variables["cache"] = to_tree(layer.cache)
  if layer.random_state is not None:
    variables[RANDOM_STATE_COLLECTION] = to_tree(layer.random_state)
  return variables


def load_linen_variables(layer: Attention, variables: dict[str, Any]) -> Attention:
  """Writes a Linen layer's `{"params": ...}` (boxed or plain) into the NNX layer, in place; returns it.

  A "random_state" collection in `variables` becomes the layer's random state (`Attention.set_random_state`).

  Raises ValueError naming a parameter that is missing, extra or of another shape.
  """
  if "params" not in variables:
    raise ValueError(f"variables must hold a 'params' collection, got {sorted(variables)}")
  params = variables["params"]
  name = type(layer).__name__
  extra = sorted(set(params) - set(layer.param_names))
  if extra or set(layer.param_names) - set(params):
    raise ValueError(f"{name}: params have {sorted(params)}, the layer has {sorted(layer.param_names)}")
  for key in layer.param_names:
    node = getattr(layer, key)
    if isinstance(node, nnx.Variable):
      assign(nnx.Dict({"_": node}), {"_": params[key]}, f"{name} params/{key}")
    else:
      assign(node, params[key], f"{name} params/{key}")
  if RANDOM_STATE_COLLECTION in variables:
    layer.set_random_state(variables[RANDOM_STATE_COLLECTION])
  return layer


def to_linen(layer: Attention) -> tuple[AttentionShell, dict[str, Any]]:
  """(the Linen layer, its variables): `module.apply(variables, x, ...)` equals `layer(x, ...)`."""
  variables = linen_variables(layer)
  variables.pop("cache", None)
  return layer.linen_layer(causal=layer.causal, decode=False), variables


def from_linen(
  module: AttentionShell, variables: dict[str, Any], in_features: int, *, rngs: nnx.Rngs | None = None, **kwargs
) -> Attention:
  """The NNX layer of a Linen attention `module` with its `variables` ({"params": ...}).

  `in_features` is the width of the inputs (Linen infers it on the first call); `kwargs` go to the NNX
  constructor (e.g. `in_kv_features`, `keep_rngs`). `module.causal` becomes the default of `is_causal`; a
  "random_state" collection in `variables` the layer's random state.
  """
  fields = {f.name: getattr(module, f.name) for f in dataclasses.fields(module) if f.name not in ("parent", "name")}
  shell = {k: fields.pop(k) for k in list(fields) if k in SHELL_ARGS}
  shell.pop("parent", None), shell.pop("name", None)
  layer = nnx_class(type(module))(
    in_features=in_features, rngs=rngs if rngs is not None else nnx.Rngs(0), **shell, **fields, **kwargs
  )
  return load_linen_variables(layer, variables)


@dataclasses.dataclass
class Substitutions:
  """What `through_nnx` did: the number of attention calls it ran through NNX layers."""

  calls: int = 0


def _replace(_, value):
  return (value,)


@contextlib.contextmanager
def through_nnx():
  """Within the block, every `AttentionShell.__call__` of a Linen model runs as its NNX layer.

  The NNX layer is built from the Linen layer's options, current parameters and random state (the
  `random_state` collection: Performer's features, Reformer's rotations); keys of the RNG streams it draws from
  at every call (`rng_streams`) come from the Linen call's streams; its KSVD terms and intermediates are sown
  back into the Linen layer's collections, so the model's code is unchanged.
  Yields a `Substitutions` counter.
  """
  done = Substitutions()
  inside = []  # the NNX layer applies its Linen class: those calls are not intercepted again

  def interceptor(next_fun, args, kwargs, context):
    module = context.module
    skip = inside or not isinstance(module, AttentionShell) or context.method_name != "__call__"
    if skip or module.is_initializing():
      return next_fun(*args, **kwargs)
    inside.append(module)
    try:
      return _through(module, args, kwargs)
    finally:
      inside.pop()

  def _through(module, args, kwargs):
    if module.decode:
      raise ValueError("through_nnx runs full-sequence attention calls; decode with the NNX layers themselves")
    kwargs = dict(kwargs)
    inputs_q, *rest = args
    kv = kwargs.pop("inputs_kv", None)
    inputs_k, inputs_v = (kv, kv) if kv is not None else ((rest + [None, None])[:2])
    inputs_k = kwargs.pop("inputs_k", inputs_k)
    inputs_v = kwargs.pop("inputs_v", inputs_v)
    sow_weights = kwargs.pop("sow_weights", False)
    dropout_rng = kwargs.pop("dropout_rng", None)
    kv_width = None if inputs_k is None else inputs_k.shape[-1]
    variables = {k: v for k, v in module.variables.items() if k in ("params", RANDOM_STATE_COLLECTION)}
    # keep_rngs=False: every key comes from the Linen call's streams (a missing one is refused as Linen refuses it).
    clone = module.clone(parent=None, decode=False)
    layer = from_linen(clone, variables, inputs_q.shape[-1], in_kv_features=kv_width, keep_rngs=False)
    streams = (*module.rng_streams(), *(("dropout",) if dropout_rng is None and module.dropout_rate > 0 else ()))
    keys = {s: module.make_rng(s) for s in streams if module.has_rng(s)}
    if dropout_rng is not None:
      keys["dropout"] = dropout_rng
    rngs = nnx.Rngs(**keys) if keys else None

    def call(layer):
      return layer(inputs_q, inputs_k, inputs_v, sow_weights=True, rngs=rngs, is_causal=module.causal, **kwargs)

    out, sown = nnx.capture(call, nnx.Intermediate)(layer)
    if isinstance(getattr(layer, "ksvd", None), nnx.Variable):
      module.sow(KSVD_COLLECTION, "terms", layer.ksvd.get_value(), reduce_fn=_replace, init_fn=tuple)
    for key, value in sown.items():
      if key != "attention_weights" or sow_weights:
        for item in value:
          module.sow("intermediates", key, item)
    done.calls += 1
    return out

  with nn.intercept_methods(interceptor):
    yield done
