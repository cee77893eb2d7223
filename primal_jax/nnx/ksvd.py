"""The KSVD objective in NNX: a Variable type for the terms, and the loss read from a filtered state.

Every full-sequence call of a Primal layer stores its `primal_jax.ksvd.KSVDTerms` in the layer's
`ksvd` attribute, a `KSVDVariable`, replacing the previous call's (never appending: a model called in
a loop keeps one set of terms per layer). The loss is then read from the state filtered by that type,
`nnx.state(model, KSVDVariable)` (or `nnx.pop(model, KSVDVariable)`), exactly as the Linen loss reads
the `ksvd` collection; terms stacked by `nnx.scan` / `nnx.vmap` over layers count as one layer per
index of their leading axes (`primal_jax.ksvd.unstack_terms`).
"""

from __future__ import annotations

import dataclasses

from flax import nnx

from primal_jax import ksvd as _ksvd
from primal_jax.ksvd import RELEASE_SEQUENCE, KSVDSpec, KSVDTerms


class KSVDVariable(nnx.Variable):
  """Holds one Primal layer's `KSVDTerms` (of its last full-sequence call): the NNX `ksvd` collection.

  A layer that keeps terms has it from construction, holding `EMPTY_TERMS` until its first full-sequence call:
  so a fresh module has every Variable a called one has, and a checkpoint of a called model (terms and all)
  restores into a fresh `nnx.eval_shape` of it (orbax restores the target's structure, the empty fields skip
  the batch-shaped terms, which are per-call values, not state to restore).
  """


# "No terms yet": every field None (no leaves, so no shapes that depend on a batch).
EMPTY_TERMS = KSVDTerms(*[None] * len(dataclasses.fields(KSVDTerms)))


NO_TERMS = (
  "the state holds no KSVDTerms: pass nnx.state(model, KSVDVariable) (or nnx.pop) taken after a full-sequence "
  "call of the model (Primal layers store their terms then, not while decoding); pass allow_empty=True for a "
  "model without Primal layers"
)


def layer_terms(state) -> list[KSVDTerms]:
  """One `KSVDTerms` per Primal layer, in path order, from a model, a state or a list of terms."""
  if isinstance(state, nnx.Module):
    state = nnx.state(state, KSVDVariable)
  return _ksvd.collect_terms(state)  # EMPTY_TERMS (a layer not called yet) counts as no layer


def ksvd_loss_per_sample(state, spec: KSVDSpec | str = RELEASE_SEQUENCE, *, allow_empty: bool = False):
  """`primal_jax.ksvd.ksvd_loss_per_sample` of the terms in `state` (a model, or its state filtered by
  `KSVDVariable`). Raises ValueError when there are none, unless `allow_empty`."""
  terms = layer_terms(state)
  if not terms and not allow_empty:
    raise ValueError(NO_TERMS)
  return _ksvd.ksvd_loss_per_sample(terms, spec, allow_empty=allow_empty)


def ksvd_loss(state, spec: KSVDSpec | str = RELEASE_SEQUENCE, *, allow_empty: bool = False):
  """The unweighted regulariser: `ksvd_loss_per_sample` averaged over the batch."""
  terms = layer_terms(state)
  if not terms and not allow_empty:
    raise ValueError(NO_TERMS)
  return _ksvd.ksvd_loss(terms, spec, allow_empty=allow_empty)


def ksvd_regularizer(state, eta: float, spec: KSVDSpec | str = RELEASE_SEQUENCE, *, allow_empty: bool = False):
  """eta * `ksvd_loss(state)`, the term added to the task loss (paper eq. 10); eta finite and >= 0."""
  _ksvd.check_eta(eta)
  return eta * ksvd_loss(state, spec, allow_empty=allow_empty)
