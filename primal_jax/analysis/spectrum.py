"""Singular value spectra of attention matrices (paper Figure 1).

For softmax attention the matrix is the attention probabilities A [N, M] of
each head. Primal-Attention never forms an N x N matrix; its matrix is the
induced asymmetric kernel of Theorem 3.2, K_ij = phi_q(x_i)^T F_X^T F_X phi_k(x_j)
with F_X the sampled rows of the block input (identity when the projection
weights are data-independent).

The matrices are rebuilt from each layer's params and the inputs it received in
a forward pass, which `attention_matrices` captures with `nn.intercept_methods`,
so the attention modules need not expose them. Spectra are taken over the real
(unpadded) positions only: padded rows and columns are zeroed, which leaves the
singular values of the real sub-matrix followed by zeros. All NumPy results are
float64, because the tail singular values decide how many components reach 99%.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import traverse_util

from primal_jax.attention.primal import PrimalAttention
from primal_jax.attention.softmax import MASK_PENALTY, SoftmaxAttention
from primal_jax.dual import induced_kernel
from primal_jax.feature_maps import softmax_kernel_normalizer
from primal_jax.masks import attention_bias_mask, padding_from_mask
from primal_jax.sampling import padding_aware_positions, release_sample_indices
from primal_jax.scores import causal_running_mean

# Flax collection the interceptor sows each attention call's matrix into.
SPECTRUM_COLLECTION = "spectrum"
KINDS = ("primal", "softmax")
THRESHOLDS = (0.9, 0.99)
# The analysis wants exact float32 products, not the TF32/bf16 passes accelerators use by default.
_HIGHEST = jax.lax.Precision.HIGHEST


# ----------------------------------------------------------------------------- matrices of one layer


def _call_inputs(module: nn.Module, args: tuple, kwargs: dict) -> tuple[jax.Array, jax.Array, jax.Array | None]:
  """(inputs_q, inputs_k, mask) of an attention call, resolving defaults and the `inputs_kv` alias."""
  bound = inspect.signature(type(module).__call__).bind(module, *args, **kwargs)
  arguments = bound.arguments
  inputs_q = arguments["inputs_q"]
  inputs_k = arguments.get("inputs_kv")
  if inputs_k is None:
    inputs_k = arguments.get("inputs_k")
  return inputs_q, inputs_q if inputs_k is None else inputs_k, arguments.get("mask")


def _project(params: dict, x: jax.Array) -> jax.Array:
  """[B, N, D] through a DenseGeneral over heads (kernel [D, H, p], bias [H, p]) -> [B, H, N, p]."""
  kernel = jnp.asarray(params["kernel"])
  dtype = jnp.promote_types(jnp.result_type(x.dtype, kernel.dtype), jnp.float32)
  y = jnp.einsum("bnd,dhp->bhnp", x.astype(dtype), kernel.astype(dtype), precision=_HIGHEST)
  if "bias" in params:
    y = y + jnp.asarray(params["bias"]).astype(dtype)[None, :, None, :]
  return y


def primal_features(
  module: PrimalAttention,
  params: dict,
  inputs_q: jax.Array,
  inputs_k: jax.Array | None = None,
  mask: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array | None]:
  """The kernel's factors, recomputed from the layer's params as `PrimalAttention` computes them.

  The softmax-kernel feature map's D^-1/2 (Remark 4.1) scales the e and r
  scores of position i, so it is folded into both phi_q(x_i) and phi_k(x_i):
  the kernel below is then the one whose dual form gives the layer's scores.

  Args:
    module: the (unbound) layer; its attributes choose sampling and feature map.
    params: its `params` collection (query, key, ...).
    inputs_q, inputs_k: [B, N, D] as passed to the layer (inputs_k defaults to inputs_q).
    mask: as passed to the layer ([B, N] padding or a [B, 1|H, N, N] attention mask).
  Returns:
    phi_q, phi_k [B, H, N, m] and F_X [B, H, n, p] (None when data-independent).
  """
  if module.decode:
    raise ValueError("spectra need a full-sequence call; decode=True layers see one chunk at a time")
  inputs_k = inputs_q if inputs_k is None else inputs_k
  params = nn.meta.unbox(params)
  batch, length, _ = inputs_q.shape
  q = _project(params["query"], inputs_q)  # [B, H, N, p]
  k = _project(params["key"], inputs_k)
  heads, p = q.shape[1], q.shape[-1]
  padding = padding_from_mask(mask, batch, length)
  aware = module.sampling == "padding_aware" and padding is not None
  valid = padding.astype(q.dtype)[:, None, :] if aware else None  # [B, 1, N]

  rows = None
  n = module.sampled_rows
  if n is not None:
    if aware:
      positions = padding_aware_positions(padding, n)  # [B, n]
      rows = jnp.take_along_axis(inputs_k, positions[:, :, None], axis=1)
    else:
      rows = inputs_k[:, release_sample_indices(length, n)]  # [B, n, D]
    rows = jnp.swapaxes(rows.astype(q.dtype).reshape(batch, n, heads, p), 1, 2)  # [B, H, n, p]

  if module.causal:
    q, k = causal_running_mean(q, valid), causal_running_mean(k, valid)
  # The module's own choice of map (and, for softmax_kernel, its fixed random projection).
  feature_fn, normalize = module._features(p)
  phi_q, phi_k = feature_fn(q), feature_fn(k)
  if normalize:
    normalizer = functools.partial(softmax_kernel_normalizer, causal=module.causal)
    if valid is None:
      d = jax.vmap(jax.vmap(normalizer))(phi_q, phi_k)  # [B, H, N]
    else:
      d = jax.vmap(jax.vmap(normalizer, in_axes=(0, 0, None)))(phi_q, phi_k, valid[:, 0])
    scale = jax.lax.rsqrt(d)[..., None]
    phi_q, phi_k = phi_q * scale, phi_k * scale
  return phi_q, phi_k, rows


def primal_kernel(
  module: PrimalAttention,
  params: dict,
  inputs_q: jax.Array,
  inputs_k: jax.Array | None = None,
  mask: jax.Array | None = None,
) -> jax.Array:
  """[B, H, N, N] induced kernel phi_q F_X^T F_X phi_k^T of every head (Theorem 3.2); see `primal_features`."""
  phi_q, phi_k, rows = primal_features(module, params, inputs_q, inputs_k, mask)
  with jax.default_matmul_precision("highest"):
    return induced_kernel(phi_q, phi_k, rows)


def softmax_weights(
  module: SoftmaxAttention,
  params: dict,
  inputs_q: jax.Array,
  inputs_k: jax.Array | None = None,
  mask: jax.Array | None = None,
) -> jax.Array:
  """[B, H, N, M] attention probabilities, recomputed as `SoftmaxAttention` computes them (masked keys ~ 0)."""
  if module.decode:
    raise ValueError("spectra need a full-sequence call; decode=True layers see one chunk at a time")
  inputs_k = inputs_q if inputs_k is None else inputs_k
  params = nn.meta.unbox(params)
  q = _project(params["query"], inputs_q)  # [B, H, N, p]
  k = _project(params["key"], inputs_k)  # [B, H, M, p]
  p = q.shape[-1]
  scores = jnp.einsum("bhnp,bhmp->bhnm", q, k, precision=_HIGHEST) / jnp.sqrt(jnp.asarray(p, q.dtype))
  allowed = attention_bias_mask(mask, q.shape[0], q.shape[2], k.shape[2], module.causal)
  if allowed is not None:
    scores = scores - MASK_PENALTY * (1.0 - allowed.astype(scores.dtype))
  return jax.nn.softmax(scores, axis=-1)


def attention_matrix(module: nn.Module, params: dict, *args, **kwargs) -> tuple[str, jax.Array]:
  """(kind, [B, H, N, M] matrix) of one attention call; args/kwargs are the layer's call arguments."""
  inputs_q, inputs_k, mask = _call_inputs(module, args, kwargs)
  if isinstance(module, PrimalAttention):
    return "primal", primal_kernel(module, params, inputs_q, inputs_k, mask)
  if isinstance(module, SoftmaxAttention):
    return "softmax", softmax_weights(module, params, inputs_q, inputs_k, mask)
  raise TypeError(f"no attention matrix is defined for {type(module).__name__}; supported: {KINDS}")


def _sowing_interceptor(next_fun, args, kwargs, context):
  """Runs the call unchanged, then sows its matrix and the padding the layer saw."""
  out = next_fun(*args, **kwargs)
  module = context.module
  if context.method_name == "__call__" and isinstance(module, (PrimalAttention, SoftmaxAttention)):
    if not module.is_initializing():
      kind, matrix = attention_matrix(module, module.variables["params"], *args, **kwargs)
      inputs_q, _, mask = _call_inputs(module, args, kwargs)
      padding = padding_from_mask(mask, inputs_q.shape[0], inputs_q.shape[1])
      if padding is None:
        padding = jnp.ones(inputs_q.shape[:2], bool)
      module.sow(SPECTRUM_COLLECTION, kind, {"matrix": matrix, "padding": padding})
  return out


def sow_attention_matrices(apply_fn):
  """Wraps `apply_fn(variables, *args, **kw)` (a Flax `apply`) so every Primal/softmax attention call
  sows {"matrix", "padding"} into `SPECTRUM_COLLECTION`; pass that collection in `mutable`."""

  @functools.wraps(apply_fn)
  def wrapped(*args, **kwargs):
    with nn.intercept_methods(_sowing_interceptor):
      return apply_fn(*args, **kwargs)

  return wrapped


@dataclasses.dataclass(frozen=True)
class LayerMatrices:
  """Every call of one attention layer in a batch.

  Attributes:
    name: the layer's module path, e.g. "encoder/block_1/attention".
    kind: "primal" (induced kernel) or "softmax" (attention probabilities).
    matrices: [B, H, N, M] one matrix per example and head (calls of a shared
      layer, e.g. both towers of a dual encoder, stacked along B).
    valid: [B, N] bool, the real positions (rows; also the columns when N = M).
  """

  name: str
  kind: str
  matrices: np.ndarray
  valid: np.ndarray


def collect_matrices(spectrum_collection: dict, valid: Any = None) -> list[LayerMatrices]:
  """`LayerMatrices` per layer, in call order, from the sown collection.

  Args:
    spectrum_collection: `state[SPECTRUM_COLLECTION]` returned by `apply(..., mutable=[...])`.
    valid: real positions: None (the padding each layer received; all positions
      if it received no mask), one [B, N] array for every call, or a sequence
      with one array per call of a layer (e.g. (mask, mask2) of a dual encoder).
      Needed when the model hides the mask from its attention (time series with
      `mask_attention=False`) but padded positions should still be excluded.
  """
  out = []
  for path, calls in traverse_util.flatten_dict(spectrum_collection, sep="/").items():
    name, _, kind = path.rpartition("/")
    if valid is None:
      per_call = [None] * len(calls)
    elif isinstance(valid, (list, tuple)):
      if len(valid) != len(calls):
        raise ValueError(f"{len(valid)} valid masks for {len(calls)} calls of layer {name!r}")
      per_call = list(valid)
    else:
      per_call = [valid] * len(calls)
    matrices, masks = [], []
    for call, v in zip(calls, per_call, strict=True):
      matrices.append(np.asarray(call["matrix"]))
      masks.append(np.asarray(call["padding"] if v is None else v, bool))
    out.append(LayerMatrices(name or "<root>", kind, np.concatenate(matrices), np.concatenate(masks)))
  return out


def attention_matrices(module: nn.Module, variables: dict, *inputs, valid: Any = None, **kwargs) -> list[LayerMatrices]:
  """Every Primal/softmax attention layer's matrices for one batch (eager; jit `sow_attention_matrices` for speed).

  Args:
    module: any model containing `PrimalAttention` / `SoftmaxAttention` layers.
    variables: its variables ({"params": ..., other collections}).
    inputs: positional model inputs; `kwargs` go to `apply` (e.g. deterministic=True).
    valid: see `collect_matrices`.
  """
  apply_fn = sow_attention_matrices(module.apply)
  _, state = apply_fn(variables, *inputs, mutable=[SPECTRUM_COLLECTION], **kwargs)
  return collect_matrices(state.get(SPECTRUM_COLLECTION, {}), valid)


# ----------------------------------------------------------------------------- spectra


def singular_values(matrices: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
  """Descending singular values of each matrix restricted to real rows and columns, float64.

  Args:
    matrices: [..., N, M] (e.g. [B, H, N, N]).
    valid: [B, N] real positions (None: all real). Columns use the same mask
      when N = M (self-attention); otherwise all columns count.
  Returns:
    [..., min(N, M)]: the L_b singular values of example b's real sub-matrix,
    then zeros (zeroing the padded rows/columns adds only zero singular values).
  """
  m = np.asarray(matrices, np.float64)
  if valid is not None:
    v = np.asarray(valid, np.float64)
    if v.ndim != 2 or v.shape[0] != m.shape[0] or v.shape[1] != m.shape[-2]:
      raise ValueError(f"valid must be [batch, rows] = {(m.shape[0], m.shape[-2])}, got {v.shape}")
    v = v.reshape(v.shape[:1] + (1,) * (m.ndim - 3) + v.shape[1:])  # [B, 1.., N]
    m = m * v[..., :, None]
    if m.shape[-1] == m.shape[-2]:
      m = m * v[..., None, :]
  return np.linalg.svd(m, compute_uv=False)


def explained_variance(singular_values: np.ndarray) -> np.ndarray:
  """Cumulative share of sum sigma_i^2 in the top k singular values, k = 1..N (1 for an all-zero matrix)."""
  energy = np.square(np.asarray(singular_values, np.float64))
  total = energy.sum(-1, keepdims=True)
  return np.where(total > 0, np.cumsum(energy, -1) / np.where(total > 0, total, 1.0), 1.0)


def normalized_decay(singular_values: np.ndarray) -> np.ndarray:
  """sigma_i / sigma_1 (0 for an all-zero matrix): the decay shape, independent of the matrix's scale."""
  sv = np.asarray(singular_values, np.float64)
  top = sv[..., :1]
  return np.where(top > 0, sv / np.where(top > 0, top, 1.0), 0.0)


def components_for(curves: np.ndarray, threshold: float) -> np.ndarray:
  """Smallest k with cumulative explained variance >= threshold (int, per curve)."""
  if not 0.0 < threshold <= 1.0:
    raise ValueError(f"threshold must lie in (0, 1], got {threshold}")
  reached = np.asarray(curves) >= threshold - 1e-12  # rounding must not push 100% past the last component
  return np.argmax(reached, axis=-1) + 1


def _mean_std(x: np.ndarray) -> dict[str, Any]:
  return {"mean": np.mean(x, axis=0).tolist(), "std": np.std(x, axis=0).tolist()}


@dataclasses.dataclass(frozen=True)
class LayerSpectrum:
  """Singular values of one layer over a set of examples.

  Attributes:
    name, kind: as in `LayerMatrices`.
    singular_values: [E, H, K] float64, zeros beyond each example's real length.
    lengths: [E] real positions per example.
  """

  name: str
  kind: str
  singular_values: np.ndarray
  lengths: np.ndarray

  @classmethod
  def from_matrices(cls, layer: LayerMatrices) -> LayerSpectrum:
    return cls(layer.name, layer.kind, singular_values(layer.matrices, layer.valid), layer.valid.sum(-1))

  @classmethod
  def concatenate(cls, parts: Sequence[LayerSpectrum]) -> LayerSpectrum:
    """One spectrum from per-batch parts of the same layer."""
    first = parts[0]
    if any((p.name, p.kind) != (first.name, first.kind) for p in parts):
      raise ValueError("parts must come from one layer")
    width = max(p.singular_values.shape[-1] for p in parts)
    sv = [np.pad(p.singular_values, [(0, 0), (0, 0), (0, width - p.singular_values.shape[-1])]) for p in parts]
    return cls(first.name, first.kind, np.concatenate(sv), np.concatenate([p.lengths for p in parts]))

  def _flat(self) -> np.ndarray:
    return self.singular_values.reshape(-1, self.singular_values.shape[-1])  # [E * H, K]

  def summary(self, thresholds: Sequence[float] = THRESHOLDS) -> dict[str, Any]:
    """Curves (mean/std over examples and heads) and summary statistics, JSON-ready.

    Curves: `explained_variance` (Figure 1 a-c) and `normalized_decay` (Figure
    1 d) per component index; an example shorter than K contributes 1 and 0
    beyond its length. Statistics, each as mean and std over (example, head):
    `components_<pct>`, the components needed for that share of the energy;
    `decay_area`, the mean of sigma_i / sigma_1 over the real components (1/L
    for rank one, 1 for a flat spectrum); `stable_rank`, sum sigma_i^2 / sigma_1^2.
    Smaller means a sharper decay for all three.
    """
    sv = self._flat()
    lengths = np.repeat(self.lengths, self.singular_values.shape[1]).astype(np.float64)  # [E * H]
    curves = explained_variance(sv)
    decay = normalized_decay(sv)
    stats = {}
    for t in thresholds:
      k = components_for(curves, t).astype(np.float64)
      stats[f"components_{round(100 * t):d}"] = {"mean": float(k.mean()), "std": float(k.std())}
    area = decay.sum(-1) / np.maximum(lengths, 1.0)
    stable = np.square(decay).sum(-1)
    stats["decay_area"] = {"mean": float(area.mean()), "std": float(area.std())}
    stats["stable_rank"] = {"mean": float(stable.mean()), "std": float(stable.std())}
    return {
      "name": self.name,
      "kind": self.kind,
      "num_examples": int(self.singular_values.shape[0]),
      "num_heads": int(self.singular_values.shape[1]),
      "length": {"mean": float(self.lengths.mean()), "min": int(self.lengths.min()), "max": int(self.lengths.max())},
      "explained_variance": _mean_std(curves),
      "normalized_decay": _mean_std(decay),
      "stats": stats,
    }
