"""The `ksvd` collection as users handle it: scanned stacks, merged state (issue 18, items 2 and 3)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_utils import normal
from flax import linen as nn

from primal_jax.attention import PrimalAttention
from primal_jax.initializers import partitioned_attention_inits
from primal_jax.ksvd import (
  PAPER,
  RELEASE_LRA,
  RELEASE_SEQUENCE,
  KSVDTerms,
  collect_terms,
  ksvd_loss,
  ksvd_loss_per_sample,
)

B, N, D, H, L = 2, 8, 16, 2, 3
# Partitioned initialisers (as the project's models pass them): the parameters carry logical axis names.
LAYER = dict(num_heads=H, low_rank=3, num_samples=6, **partitioned_attention_inits())


class Block(nn.Module):
  """A user's pre-norm block: x + PrimalAttention(LayerNorm(x))."""

  @nn.compact
  def __call__(self, x, _=None):
    return x + PrimalAttention(**LAYER, name="attention")(nn.LayerNorm(name="norm")(x)), None


class Unscanned(nn.Module):
  @nn.compact
  def __call__(self, x):
    for i in range(L):
      x, _ = Block(name=f"block_{i}")(x)
    return x


class Scanned(nn.Module):
  """The same stack under nn.scan: parameters and KSVD terms stacked on a leading layer axis."""

  @nn.compact
  def __call__(self, x):
    blocks = nn.scan(
      Block,
      variable_axes={"params": 0, "ksvd": 0, "intermediates": 0},
      split_rngs={"params": True},
      length=L,
      metadata_params={nn.PARTITION_NAME: "layers"},  # the library's parameters carry logical axis names
    )
    x, _ = blocks(name="blocks")(x, None)
    return x


def _scanned_setup():
  x = jnp.asarray(normal(0, (B, N, D)))
  scanned = Scanned().init(jax.random.key(0), x)["params"]
  unboxed = nn.meta.unbox(scanned)
  per_layer = {f"block_{i}": jax.tree.map(lambda a, i=i: a[i], unboxed["blocks"]) for i in range(L)}
  return x, scanned, per_layer


@pytest.mark.parametrize("spec", [PAPER, RELEASE_LRA, RELEASE_SEQUENCE], ids=["paper", "release_lra", "release_seq"])
def test_scanned_stack_equals_unscanned(spec):
  """ksvd_loss of the stacked collection equals the per-layer loss of the same weights, unscanned."""
  x, scanned, per_layer = _scanned_setup()
  assert nn.get_partition_spec(scanned)["blocks"]["attention"]["We"] == jax.sharding.PartitionSpec(
    "layers", "heads", None, "rank"
  )
  out_s, state_s = Scanned().apply({"params": scanned}, x, mutable=["ksvd"])
  out_u, state_u = Unscanned().apply({"params": per_layer}, x, mutable=["ksvd"])
  np.testing.assert_allclose(out_s, out_u, rtol=1e-5, atol=1e-5)
  assert len(collect_terms(state_s["ksvd"])) == L == len(collect_terms(state_u["ksvd"]))
  np.testing.assert_allclose(ksvd_loss(state_s["ksvd"], spec), ksvd_loss(state_u["ksvd"], spec), rtol=1e-5)
  np.testing.assert_allclose(
    ksvd_loss_per_sample(state_s["ksvd"], spec), ksvd_loss_per_sample(state_u["ksvd"], spec), rtol=1e-5
  )


def test_stacked_terms_with_inconsistent_axes_are_refused():
  """Terms stacked on an axis other than the leading one cannot be read as layers: a ValueError says so."""
  x, scanned, _ = _scanned_setup()
  _, state = Scanned().apply({"params": scanned}, x, mutable=["ksvd"])
  (stacked,) = jax.tree.leaves(state["ksvd"], is_leaf=lambda t: isinstance(t, KSVDTerms))
  moved = stacked.replace(count=jnp.swapaxes(stacked.count, 0, 1))  # [B, L] instead of [L, B]
  with pytest.raises(ValueError, match="leading"):
    ksvd_loss({"blocks": (moved,)})


@pytest.mark.parametrize("model", ["layer", "stack"])
def test_merged_state_does_not_pile_up(model):
  """{**variables, **state} (as for batch_stats) keeps one KSVDTerms per layer: same loss, no retrace."""
  x = jnp.asarray(normal(0, (B, N, D)))
  module = PrimalAttention(**LAYER) if model == "layer" else Unscanned()
  variables = module.init(jax.random.key(0), x)
  traces = []

  @jax.jit
  def step(variables, x):
    traces.append(1)
    out, state = module.apply(variables, x, mutable=["ksvd"])
    return ksvd_loss(state["ksvd"]), state

  first, state = step(variables, x)
  for _ in range(3):
    variables = {**variables, **state}
    loss, state = step(variables, x)
  assert len(collect_terms(state["ksvd"])) == (1 if model == "layer" else L)
  assert all(len(t) == 1 for t in jax.tree.leaves(state["ksvd"], is_leaf=lambda t: isinstance(t, tuple)))
  np.testing.assert_allclose(loss, first, rtol=1e-6)
  assert len(traces) == 2  # the first call without `ksvd`, then one shape for every merged call


def test_merged_state_under_scan_does_not_pile_up():
  """The same under nn.scan: stale stacked terms are replaced, not appended to (which broke shapes)."""
  x, scanned, _ = _scanned_setup()
  _, state = Scanned().apply({"params": scanned}, x, mutable=["ksvd"])
  first = ksvd_loss(state["ksvd"], PAPER)
  _, state = Scanned().apply({"params": scanned, **state}, x, mutable=["ksvd"])
  assert len(collect_terms(state["ksvd"])) == L
  np.testing.assert_allclose(ksvd_loss(state["ksvd"], PAPER), first, rtol=1e-6)
