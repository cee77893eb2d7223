"""The NNX layers carry a mechanism's random state as the Linen layers do: replayed state (the `random_state`
collection: Performer's features, Reformer's rotations) as `RandomState` Variables, and keys drawn at every call
(Reformer's rotations="per_call": the "redraw" stream) from `nnx.Rngs`. The golden cases that need them
(lra_performer, lra_reformer) verify through the NNX layers in tests/test_baseline_parity.py."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from nnx_cases import D, H, inputs, layer_pair, padding

import primal_jax.nnx as pnnx
from primal_jax.attention.baselines import RANDOM_STATE_COLLECTION, REDRAW_RNG
from primal_jax.attention.baselines.reformer import default_num_buckets
from primal_jax.nnx.shell import RandomState

# Compares with the Linen layer at float32 tolerances: full float32 matmuls.
pytestmark = pytest.mark.matmul_precision("highest")

CHUNK = 4  # N = 8: two chunks, so the rotations decide the output
P = D // H


def _rotations(seed: int) -> np.ndarray:
  shape = (H, P, 2, default_num_buckets(8, CHUNK) // 2)
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_given_rotations_are_random_state_variables_and_equal_linen():
  layer, module, params = layer_pair("reformer", chunk_length=CHUNK)
  x, pad, rot = inputs(), padding(), _rotations(1)
  layer.set_random_state({"rotations": rot})
  assert isinstance(layer.random_state["rotations"], RandomState)
  assert not jax.tree.leaves(nnx.state(layer, RandomState).filter(nnx.Param))  # not a parameter
  assert "rotations" not in str(nnx.state(layer, nnx.Param))
  linen = module.apply({"params": params, RANDOM_STATE_COLLECTION: {"rotations": rot}}, x, mask=pad)
  np.testing.assert_allclose(layer(x, mask=pad), linen, rtol=1e-6, atol=1e-6)
  # The seeded draw differs from these rotations; removing the state goes back to it.
  seeded = module.apply({"params": params}, x, mask=pad)
  assert not np.allclose(seeded, linen, atol=1e-3)
  layer.set_random_state(None)
  np.testing.assert_allclose(layer(x, mask=pad), seeded, rtol=1e-6, atol=1e-6)
  # Checkpoint round trip: linen_variables / load_linen_variables / from_linen carry the collection.
  layer.set_random_state({"rotations": rot})
  variables = pnnx.linen_variables(layer)
  np.testing.assert_array_equal(variables[RANDOM_STATE_COLLECTION]["rotations"], rot)
  rebuilt = pnnx.from_linen(module, variables, D)
  np.testing.assert_allclose(rebuilt(x, mask=pad), linen, rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="rotations must have shape"):
    rebuilt.set_random_state({"rotations": rot[..., :1]})
    rebuilt(x)


def test_performer_features_given_as_random_state():
  layer, module, params = layer_pair("performer", random_state={"projection": np.eye(8, P, dtype=np.float32)})
  x = inputs()
  variables = {"params": params, RANDOM_STATE_COLLECTION: {"projection": np.eye(8, P, dtype=np.float32)}}
  np.testing.assert_allclose(layer(x), module.apply(variables, x), rtol=1e-6, atol=1e-6)
  assert not np.allclose(layer(x), module.apply({"params": params}, x), atol=1e-3)


def test_per_call_rotations_redraw_from_the_layers_rngs():
  """Two calls differ (new rotations each), deterministic given the Rngs seed, and equal the Linen layer given
  the same "redraw" key; under nnx.jit the stream advances too."""
  layer, module, params = layer_pair("reformer", chunk_length=CHUNK, rotations="per_call")
  twin, _, _ = layer_pair("reformer", chunk_length=CHUNK, rotations="per_call")
  x = inputs()
  first, second = layer(x), layer(x)
  assert not np.allclose(first, second, atol=1e-3)
  np.testing.assert_array_equal(twin(x), first)  # same nnx.Rngs(0): same draws
  np.testing.assert_array_equal(twin(x), second)
  key = nnx.Rngs(redraw=5).redraw()  # the key the call draws from nnx.Rngs(redraw=5)
  out = layer(x, rngs=nnx.Rngs(redraw=5))
  np.testing.assert_allclose(out, module.apply({"params": params}, x, rngs={REDRAW_RNG: key}), rtol=1e-6, atol=1e-6)
  jitted = nnx.jit(lambda layer, x: layer(x))
  assert not np.allclose(jitted(layer, x), jitted(layer, x), atol=1e-3)
  # Given rotations need no key.
  layer.set_random_state({"rotations": _rotations(2)})
  np.testing.assert_array_equal(layer(x), layer(x))
  seeded, _, _ = layer_pair("reformer", chunk_length=CHUNK)
  np.testing.assert_array_equal(seeded(x), seeded(x))


def test_per_call_without_keys_is_refused():
  layer = pnnx.get_attention("reformer")(
    num_heads=H, in_features=D, chunk_length=CHUNK, rotations="per_call", rngs=nnx.Rngs(params=0), keep_rngs=False
  )
  with pytest.raises(ValueError, match="'redraw' RNG stream"):
    layer(inputs())
  assert layer(inputs(), rngs=nnx.Rngs(redraw=1)).shape == inputs().shape


def test_through_nnx_passes_random_state_and_redraw_keys():
  """A Linen model's layers run through NNX with their random_state collection (equal to Linen) and keys from the
  call's "redraw" stream (the NNX layer derives its own key from it: deterministic given the key, new per key)."""
  _, module, params = layer_pair("reformer", chunk_length=CHUNK, rotations="per_call")
  x, rot = inputs(), _rotations(4)
  given = module.apply({"params": params, RANDOM_STATE_COLLECTION: {"rotations": rot}}, x)
  with pnnx.through_nnx() as substituted:
    out = module.apply({"params": params, RANDOM_STATE_COLLECTION: {"rotations": rot}}, x)
    a, b, again = (module.apply({"params": params}, x, rngs={REDRAW_RNG: jax.random.key(k)}) for k in (3, 4, 3))
    with pytest.raises(ValueError, match="'redraw' RNG stream"):
      module.apply({"params": params}, x)
  np.testing.assert_allclose(out, given, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(a, again)
  assert not np.allclose(a, b, atol=1e-3)
  assert substituted.calls == 4
