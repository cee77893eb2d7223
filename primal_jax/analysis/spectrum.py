"""Singular value spectra of attention matrices (paper Figure 1).

For softmax attention the matrix is the attention probabilities A [N, M] of
each head. Primal-Attention never forms an N x N matrix; its matrix is the
induced asymmetric kernel of Theorem 3.2, K_ij = phi_q(x_i)^T F_X^T F_X phi_k(x_j)
with F_X the sampled rows of the block input (identity when the projection
weights are data-independent).

Each attention layer computes its own matrix from the very q, k (and sampled
rows) of its forward pass and sows it into `SPECTRUM_COLLECTION` when the
caller makes that collection mutable (nothing is computed otherwise), so the
analysis never re-implements a layer. Spectra are taken over the real
(unpadded) positions only: padded rows and columns are zeroed, which leaves the
singular values of the real sub-matrix followed by zeros. All NumPy results are
float64, because the tail singular values decide how many components reach 99%.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from flax import linen as nn
from flax import traverse_util

from primal_jax.attention.shell import SPECTRUM_COLLECTION

KINDS = ("primal", "softmax")
THRESHOLDS = (0.9, 0.99)


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
  """Every Primal/softmax attention layer's matrices for one batch (eager; jit the `apply` for speed).

  Args:
    module: any model containing `PrimalAttention` / `SoftmaxAttention` layers.
    variables: its variables ({"params": ..., other collections}).
    inputs: positional model inputs; `kwargs` go to `apply` (e.g. deterministic=True).
    valid: see `collect_matrices`.
  """
  _, state = module.apply(variables, *inputs, mutable=[SPECTRUM_COLLECTION], **kwargs)
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
  if valid is None:
    return np.linalg.svd(m, compute_uv=False)
  v = np.asarray(valid, bool)
  if v.ndim != 2 or v.shape[0] != m.shape[0] or v.shape[1] != m.shape[-2]:
    raise ValueError(f"valid must be [batch, rows] = {(m.shape[0], m.shape[-2])}, got {v.shape}")
  # Each example's SVD runs on its real sub-matrix only (cost L^3, not N^3: ListOps' 2,000 positions hold
  # 1,130 real ones on average), then pads with the zeros the padded rows and columns would have added.
  out = np.zeros(m.shape[:-2] + (min(m.shape[-2:]),))
  for b in range(m.shape[0]):
    rows = np.flatnonzero(v[b])
    sub = m[b][..., rows, :]
    if m.shape[-1] == m.shape[-2]:
      sub = sub[..., rows]
    if sub.shape[-1] and sub.shape[-2]:
      sv = np.linalg.svd(sub, compute_uv=False)
      out[b, ..., : sv.shape[-1]] = sv
  return out


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
