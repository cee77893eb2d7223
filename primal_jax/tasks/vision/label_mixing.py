"""DeiT's batch-level label mixing on the host: Mixup, CutMix and label smoothing, as timm's `Mixup` (mode "batch").

Mixup (Zhang et al. 2018) blends each image with its partner, CutMix (Yun et al. 2019) pastes a box of the
partner into it; either way the target becomes the matching blend of the two one-hot labels, smoothed
(off value `label_smoothing / classes`, on value `1 - label_smoothing + off`). As in timm's batch mode, one
draw per batch decides whether to mix (`prob`), which of the two (`switch_prob` when both are on) and the
mixing weight lam ~ Beta(alpha, alpha); each row's partner is the row at the mirrored position (timm's
`x.flip(0)`), over the batch's real rows only, so a padded row never leaks into a real one. CutMix's lam is
corrected to the pasted box's true area (timm's `correct_lam`). The result carries `label_probs`
float32 [b, classes], which the classification objective then uses instead of the integer labels; `label`
stays the row's own class (what training accuracy counts).

The draws use a NumPy Generator that the pipeline seeds by (seed, epoch, batch index, host), so a batch is
mixed the same way after a resume. Mixing happens within each host's local batch, as timm mixes within each
process's batch. Written here rather than taken from timm, which needs torch; the box sampling follows timm's
`rand_bbox` (centre uniform over the image, sides sqrt(1 - lam) of the image's, clipped at the border).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from primal_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class LabelMixing:
  """mix(batch, rng) -> batch with "inputs" mixed and "label_probs" [b, classes] added.

  Attributes:
    num_classes: width of the soft targets.
    mixup_alpha: Beta(alpha, alpha) of Mixup's lam; 0 switches Mixup off (DeiT: 0.8).
    cutmix_alpha: Beta(alpha, alpha) of CutMix's lam; 0 switches CutMix off (DeiT: 1.0).
    prob: probability that a batch is mixed at all (DeiT: 1.0).
    switch_prob: probability of CutMix rather than Mixup when both are on (DeiT: 0.5).
    label_smoothing: the smoothing of both labels (DeiT: 0.1); applies also when nothing is mixed.
  """

  num_classes: int
  mixup_alpha: float = 0.0
  cutmix_alpha: float = 0.0
  prob: float = 1.0
  switch_prob: float = 0.5
  label_smoothing: float = 0.0

  def __post_init__(self):
    if not isinstance(self.num_classes, int) or self.num_classes < 2:
      raise ValueError(f"num_classes must be an integer >= 2, got {self.num_classes!r}")
    for name in ("mixup_alpha", "cutmix_alpha"):
      value = getattr(self, name)
      if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"data.mix.{name} must be a finite number >= 0 (0 switches it off), got {value!r}")
    for name in ("prob", "switch_prob"):
      if not 0.0 <= getattr(self, name) <= 1.0:  # NaN too
        raise ConfigError(f"data.mix.{name} must be in [0, 1], got {getattr(self, name)!r}")
    if not 0.0 <= self.label_smoothing < 1.0:
      raise ConfigError(f"data.mix.label_smoothing must be in [0, 1), got {self.label_smoothing!r}")

  @property
  def active(self) -> bool:
    return (self.prob > 0 and (self.mixup_alpha > 0 or self.cutmix_alpha > 0)) or self.label_smoothing > 0

  def soft_labels(self, label: np.ndarray, partner: np.ndarray, lam: float) -> np.ndarray:
    """lam * smooth(one_hot(label)) + (1 - lam) * smooth(one_hot(partner)): float32 [b, classes]."""
    off = self.label_smoothing / self.num_classes
    on = 1.0 - self.label_smoothing + off
    eye = np.full((len(label), self.num_classes), off, np.float64)
    own, other = eye.copy(), eye.copy()
    own[np.arange(len(label)), label] = on
    other[np.arange(len(label)), partner] = on
    return (lam * own + (1.0 - lam) * other).astype(np.float32)

  def draw(self, rng: np.random.Generator, height: int, width: int) -> tuple[str, float, tuple[int, int, int, int]]:
    """("none" | "mixup" | "cutmix", lam, CutMix box (top, bottom, left, right)) for one batch."""
    no_box = (0, 0, 0, 0)
    if rng.uniform() >= self.prob or (self.mixup_alpha == 0 and self.cutmix_alpha == 0):
      return "none", 1.0, no_box
    use_cutmix = self.cutmix_alpha > 0 and (self.mixup_alpha == 0 or rng.uniform() < self.switch_prob)
    if not use_cutmix:
      return "mixup", float(rng.beta(self.mixup_alpha, self.mixup_alpha)), no_box
    lam = float(rng.beta(self.cutmix_alpha, self.cutmix_alpha))
    cut = math.sqrt(1.0 - lam)
    cut_h, cut_w = int(height * cut), int(width * cut)
    cy, cx = int(rng.integers(0, height)), int(rng.integers(0, width))
    top, bottom = int(np.clip(cy - cut_h // 2, 0, height)), int(np.clip(cy + cut_h // 2, 0, height))
    left, right = int(np.clip(cx - cut_w // 2, 0, width)), int(np.clip(cx + cut_w // 2, 0, width))
    lam = 1.0 - (bottom - top) * (right - left) / (height * width)  # the pasted area's true share
    return "cutmix", lam, (top, bottom, left, right)

  def __call__(self, batch: Mapping[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    inputs = np.asarray(batch["inputs"])  # [b, H, W, C]
    if inputs.ndim != 4:
      raise ValueError(f"label mixing needs image inputs [b, H, W, C], got shape {inputs.shape}")
    label = np.asarray(batch["label"])
    real = np.flatnonzero(np.asarray(batch["weight"]) > 0)  # padded rows mix with nobody
    partner_row = np.arange(len(label))
    partner_row[real] = real[::-1]
    kind, lam, (top, bottom, left, right) = self.draw(rng, inputs.shape[1], inputs.shape[2])
    mixed = np.array(inputs)
    if kind == "mixup":
      mixed[real] = lam * inputs[real] + (1.0 - lam) * inputs[partner_row[real]]
    elif kind == "cutmix":
      mixed[real, top:bottom, left:right] = inputs[partner_row[real], top:bottom, left:right]
    return {**batch, "inputs": mixed, "label_probs": self.soft_labels(label, label[partner_row], lam)}


def label_mixing(options: Mapping[str, Any] | None, num_classes: int) -> LabelMixing | None:
  """The `LabelMixing` of a config's `data.mix` section (None, empty or all off: no mixing, hard labels)."""
  if not options:
    return None
  options = dict(options.items())
  known = {f.name for f in dataclasses.fields(LabelMixing)} - {"num_classes"}
  unknown = sorted(set(options) - known)
  if unknown:
    raise ConfigError(f"data.mix has unknown keys {unknown}; known: {sorted(known)}")
  values = {}
  for k, v in options.items():
    try:
      values[k] = float(v)
    except (TypeError, ValueError):
      raise ConfigError(f"data.mix.{k} must be a number, got {v!r}") from None
  mixing = LabelMixing(num_classes=num_classes, **values)
  return mixing if mixing.active else None
