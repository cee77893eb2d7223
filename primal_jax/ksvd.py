"""The KSVD objective J of Primal-Attention in both conventions (SPEC section 5).

Paper (eq. 11), per sequence and head, with the weights W_e|X, W_r|X that
produced the scores::

    J = 1/2 sum_i e_i^T Lambda e_i + 1/2 sum_i r_i^T Lambda r_i - Tr(W_e|X^T W_r|X),

J_l = mean over heads, regulariser eta * sum_l J_l^2.

Release (the authors' PyTorch code): Lambda enters squared, the quadratic terms
are averaged (not summed) over positions, the trace uses the raw parameters
(`trace="params"`, "trace_no_x") or the data-dependent weights
(`trace="data"`), J_l is squared per sample (time series, RL, LM) or once
from batch means (LRA), and layers are averaged. Per (sequence, head) the
release J equals the paper J with Lambda_paper = lambda^2 / N.

A Primal layer reduces its scores to `KSVDTerms` (sufficient statistics per
sequence and head) and sows them in the `ksvd` collection; `ksvd_loss` turns a
model's collection into the regulariser in the chosen convention. Terms stacked
by `nn.scan` over blocks (leading layer axes on every field) count as one layer
per index, so a scanned stack gives the loss of the same stack unscanned.
"""

from __future__ import annotations

import dataclasses
import math

import flax
import jax
import jax.numpy as jnp
import numpy as np

from primal_jax.validation import check_choice

KSVD_COLLECTION = "ksvd"


@flax.struct.dataclass
class KSVDTerms:
  """Sufficient statistics of one Primal layer's objective.

  Attributes:
    energy_e, energy_r: [B, H] sum_i m_i e_i^T diag(lambda) e_i (paper form).
    energy_e_sq, energy_r_sq: [B, H] sum_i m_i ||lambda * e_i||^2 (release form).
    count: [B] sum_i m_i, the number of positions that entered the sums.
    trace_params: [H] Tr(W_e[h]^T W_r[h]) on the raw parameters.
    trace_data: [B, H] Tr(W_e|X^T W_r|X) on the weights that produced e and r.
  """

  energy_e: jax.Array
  energy_r: jax.Array
  energy_e_sq: jax.Array
  energy_r_sq: jax.Array
  count: jax.Array
  trace_params: jax.Array
  trace_data: jax.Array


def ksvd_terms(
  escore: jax.Array,
  rscore: jax.Array,
  lam: jax.Array,
  we: jax.Array,
  wr: jax.Array,
  we_x: jax.Array,
  wr_x: jax.Array,
  valid: jax.Array | None = None,
) -> KSVDTerms:
  """Reduces one layer's scores to `KSVDTerms` (float32 or wider).

  Args:
    escore, rscore: [B, H, N, s].
    lam: [H, s] the Lambda parameter.
    we, wr: [H, a, s] raw parameters (a = n data-dependent, a = p otherwise).
    we_x, wr_x: [B, H, p, s] weights that produced the scores.
    valid: optional [B, N] 0/1: positions that enter the sums (None: all).
  """
  dt = jnp.promote_types(escore.dtype, jnp.float32)
  e, r, lam = escore.astype(dt), rscore.astype(dt), lam.astype(dt)
  n_pos = e.shape[2]
  m = jnp.ones(e.shape[:1] + (n_pos,), dt) if valid is None else valid.astype(dt)
  lam_b = lam[None, :, None, :]  # [1, H, 1, s]

  def masked_sum(per_position):  # [B, H, N] -> [B, H]
    return jnp.einsum("bhn,bn->bh", per_position, m)

  return KSVDTerms(
    energy_e=masked_sum(jnp.sum(e * e * lam_b, -1)),
    energy_r=masked_sum(jnp.sum(r * r * lam_b, -1)),
    energy_e_sq=masked_sum(jnp.sum(jnp.square(e * lam_b), -1)),
    energy_r_sq=masked_sum(jnp.sum(jnp.square(r * lam_b), -1)),
    count=jnp.sum(m, axis=-1),
    trace_params=jnp.einsum("has,has->h", we.astype(dt), wr.astype(dt)),
    trace_data=jnp.einsum("bhps,bhps->bh", we_x.astype(dt), wr_x.astype(dt)),
  )


@dataclasses.dataclass(frozen=True)
class KSVDSpec:
  """How a model's KSVD terms become the regulariser.

  Attributes:
    convention: "paper" (eq. 11: Lambda linear, sums over positions) or
      "release" (Lambda squared, means over positions).
    trace: "data" (Tr(W_e|X^T W_r|X)) or "params" (Tr(W_e^T W_r), "trace_no_x").
    reduction: "per_sample" (J squared per sequence, then batch mean) or
      "batch" (one J from batch means, squared; release LRA).
    layer_reduce: "sum" (paper eq. 10) or "mean" (release) over Primal layers.
  """

  convention: str = "release"
  trace: str = "params"
  reduction: str = "per_sample"
  layer_reduce: str = "mean"

  def __post_init__(self):
    check_choice(self.convention, ("paper", "release"), "convention")
    check_choice(self.trace, ("data", "params"), "trace")
    check_choice(self.reduction, ("per_sample", "batch"), "reduction")
    check_choice(self.layer_reduce, ("sum", "mean"), "layer_reduce")


PAPER = KSVDSpec("paper", "data", "per_sample", "sum")
RELEASE_LRA = KSVDSpec("release", "params", "batch", "mean")
RELEASE_SEQUENCE = KSVDSpec("release", "params", "per_sample", "mean")  # time series, RL, LM
# The names configs use (`config.ksvd.spec`); every entry point below takes a name or a KSVDSpec.
# KEP-SVGP's release (`CIFAR/train.py compute_loss`; `primal_jax.attention.kep_svgp.KEP_KSVD_SPEC`).
RELEASE_KEP = KSVDSpec(convention="release", trace="params", reduction="batch", layer_reduce="sum")
KSVD_SPECS = {
  "paper": PAPER,
  "release_lra": RELEASE_LRA,
  "release_sequence": RELEASE_SEQUENCE,
  "release_kep": RELEASE_KEP,
}


def resolve_spec(spec: KSVDSpec | str, name: str = "spec") -> KSVDSpec:
  """`spec` itself, or the `KSVDSpec` a config names ("paper", "release_lra", "release_sequence")."""
  if isinstance(spec, KSVDSpec):
    return spec
  if isinstance(spec, str):
    check_choice(spec, tuple(KSVD_SPECS), name)
    return KSVD_SPECS[spec]
  raise ValueError(f"{name} must be a KSVDSpec or one of {tuple(KSVD_SPECS)}, got {spec!r}")


def check_eta(eta) -> None:
  """Raises ValueError unless eta is finite and >= 0 (a negative eta rewards a large J).

  Checked when concrete (a number, or an array outside `jit`); a traced eta (a schedule inside the
  step) cannot be checked without a host sync and is left alone.
  """
  if isinstance(eta, jax.core.Tracer):
    return
  value = np.asarray(eta)
  if value.ndim or not np.issubdtype(value.dtype, np.number) or not np.isfinite(value) or value < 0:
    raise ValueError(f"eta must be a finite number >= 0, got {eta!r}")


def ksvd_objective(terms: KSVDTerms, spec: KSVDSpec | str = RELEASE_SEQUENCE) -> jax.Array:
  """J of one layer, mean over heads (`spec` a `KSVDSpec` or its name in `KSVD_SPECS`).

  Returns:
    [B] per-sequence J for reduction "per_sample"; [] for "batch".
  """
  spec = resolve_spec(spec)
  if spec.convention == "paper":
    quad_e, quad_r = terms.energy_e, terms.energy_r
  else:
    quad_e, quad_r = terms.energy_e_sq, terms.energy_r_sq
  batch = spec.reduction == "batch"
  if batch:
    # Release: divided by the total count below (mean over b, i). Paper: mean over b of the
    # per-sequence sums, consistent with the batch-mean trace (a sum would scale with B).
    reduce_b = jnp.sum if spec.convention == "release" else jnp.mean
    quad_e, quad_r = reduce_b(quad_e, 0), reduce_b(quad_r, 0)  # [H]
    count = jnp.sum(terms.count)
  else:
    count = terms.count[:, None]  # [B, 1]
  if spec.convention == "release":
    count = jnp.maximum(count, 1.0)  # an all-padding sequence: 0 / 0 would make the loss NaN
    quad_e, quad_r = quad_e / count, quad_r / count
  if spec.trace == "params":
    trace = terms.trace_params
  else:
    trace = jnp.mean(terms.trace_data, 0) if batch else terms.trace_data
  return jnp.mean(0.5 * quad_e + 0.5 * quad_r - trace, axis=-1)


def unstack_terms(terms: KSVDTerms) -> list[KSVDTerms]:
  """One `KSVDTerms` per layer of terms stacked on leading axes (`nn.scan` or `nn.vmap` over layers).

  A layer's terms have `count` [B] and `trace_params` [H]; stacked ones [L..., B] and [L..., H]
  (several leading axes for nested scans, flattened in row-major order). Raises ValueError when the
  fields disagree on the leading axes (e.g. terms stacked on another axis than the first).
  """
  lead = terms.count.shape[:-1]
  if not lead:
    return [terms]
  fields = {f.name: getattr(terms, f.name) for f in dataclasses.fields(terms)}
  trailing = {"count": 1, "trace_params": 1}  # every other field is [.., B, H]
  for name, value in fields.items():
    if value.shape[: value.ndim - trailing.get(name, 2)] != lead:
      raise ValueError(
        f"stacked KSVDTerms must carry the layer axes leading on every field: count has {lead} "
        f"before [batch], {name} has shape {value.shape} (scan with variable_axes={{'ksvd': 0}})"
      )
  size = math.prod(lead)
  flat = {name: value.reshape((size,) + value.shape[len(lead) :]) for name, value in fields.items()}
  return [KSVDTerms(**{name: value[i] for name, value in flat.items()}) for i in range(size)]


def collect_terms(collection) -> list[KSVDTerms]:
  """All `KSVDTerms` in a (nested) `ksvd` collection, one per layer, in module-path order.

  Terms stacked by `nn.scan` (or `nn.vmap`) over layers are split into their layers (`unstack_terms`),
  so a scanned stack gives the same list as the unscanned one. Empty terms (every field None: an NNX layer
  not called yet, `primal_jax.nnx.ksvd.EMPTY_TERMS`) are no layer.
  """
  leaves = jax.tree_util.tree_leaves(collection, is_leaf=lambda x: isinstance(x, KSVDTerms))
  full = [leaf for leaf in leaves if isinstance(leaf, KSVDTerms) and leaf.count is not None]
  return [layer for leaf in full for layer in unstack_terms(leaf)]


def _as_terms(layers) -> list[KSVDTerms]:
  if isinstance(layers, (list, tuple)) and all(isinstance(t, KSVDTerms) for t in layers):
    return [layer for t in layers for layer in unstack_terms(t)]
  return collect_terms(layers)


def ksvd_loss_per_sample(layers, spec: KSVDSpec | str = RELEASE_SEQUENCE, *, allow_empty: bool = False) -> jax.Array:
  """sum_l or mean_l J_l^2 over Primal layers.

  Args:
    layers: a list of `KSVDTerms` or a model's `ksvd` collection (the dict that
      `apply(..., mutable=["ksvd"])` returns).
    spec: a `KSVDSpec` or its name in `KSVD_SPECS`.
    allow_empty: return 0 when there are no terms (code that serves models with and
      without Primal layers). Otherwise no terms is a ValueError: the usual cause is an
      apply without `mutable=["ksvd"]`, which would silently turn the regulariser off.
  Returns:
    [B] for reduction "per_sample", [] for "batch"; 0 if there is no Primal layer and `allow_empty`.
  Raises:
    ValueError: no terms (unless `allow_empty`); a batch of size 0 (no mean exists).
  """
  spec = resolve_spec(spec)
  terms = _as_terms(layers)
  if not terms:
    if allow_empty:
      return jnp.zeros((), jnp.float32)
    raise ValueError(
      "the ksvd collection holds no KSVDTerms: apply the model with mutable=['ksvd'] (Primal layers sow "
      "only then, and not in decode mode); pass allow_empty=True for a model without Primal layers"
    )
  if any(t.count.shape[-1] == 0 for t in terms):
    raise ValueError("ksvd_loss of a batch of size 0 is undefined (no sequence to average over)")
  squares = jnp.stack([jnp.square(ksvd_objective(t, spec)) for t in terms])  # [L] or [L, B]
  return jnp.sum(squares, 0) if spec.layer_reduce == "sum" else jnp.mean(squares, 0)


def ksvd_loss(layers, spec: KSVDSpec | str = RELEASE_SEQUENCE, *, allow_empty: bool = False) -> jax.Array:
  """`ksvd_loss_per_sample` averaged over the batch: [] the unweighted regulariser."""
  return jnp.mean(ksvd_loss_per_sample(layers, spec, allow_empty=allow_empty))


def ksvd_regularizer(
  collection, eta: float, spec: KSVDSpec | str = RELEASE_SEQUENCE, *, allow_empty: bool = False
) -> jax.Array:
  """eta * `ksvd_loss`: the term added to the mean task loss (paper eq. 10); eta finite and >= 0."""
  check_eta(eta)
  return eta * ksvd_loss(collection, spec, allow_empty=allow_empty)
