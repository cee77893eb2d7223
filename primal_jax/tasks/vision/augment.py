"""DeiT's per-image training augmentations on the host: random resized crop, flip, RandAugment, random erasing.

Each acts on one uint8 image [H, W, C] with a NumPy Generator that `core.Augmented` seeds by (seed, epoch,
example index), so an image's augmentation is reproducible and independent of batching, host count and
resumption; every one is off unless the config switches it on (`data.augment`), and evaluation splits are
never augmented.

Written here rather than taken from a library: the box sampling follows torchvision's
`RandomResizedCrop.get_params` (10 tries, then the central crop of the allowed aspect ratios) and timm's
`RandomErasing` (count 1), on NumPy arrays so the pipeline needs no torch; Pillow does the bicubic resize.
(dm-pix works on device arrays inside jit, which would move augmentation into the training step.)
Differences from timm: erased pixels are uniform uint8 noise before normalisation (timm's "pixel" mode draws
N(0, 1) after it). Mixup/CutMix and label smoothing act on whole batches: `primal_jax.tasks.vision.label_mixing`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from primal_jax.data.pipeline import Example
from primal_jax.tasks.vision.rand_augment import rand_augment


def _uniform_pair(value, name: str, low: float = 0.0) -> tuple[float, float]:
  pair = tuple(float(v) for v in value)
  if len(pair) != 2 or not low <= pair[0] <= pair[1]:
    raise ValueError(f"data.augment.{name} must be (min, max) with {low} <= min <= max, got {value!r}")
  return pair


def crop_box(height: int, width: int, scale, ratio, rng: np.random.Generator) -> tuple[int, int, int, int]:
  """(top, left, h, w) of a random crop covering a `scale` fraction of the area with aspect w/h in `ratio`."""
  area = height * width
  log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
  for _ in range(10):
    target = area * rng.uniform(scale[0], scale[1])
    aspect = math.exp(rng.uniform(*log_ratio))
    w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
    if 0 < w <= width and 0 < h <= height:
      return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
  aspect = width / height  # fallback: the central crop of the nearest allowed aspect ratio
  if aspect < ratio[0]:
    w, h = width, int(round(width / ratio[0]))
  elif aspect > ratio[1]:
    w, h = int(round(height * ratio[1])), height
  else:
    w, h = width, height
  return (height - h) // 2, (width - w) // 2, h, w


def erase_box(height: int, width: int, scale, ratio, rng: np.random.Generator) -> tuple[int, int, int, int] | None:
  """(top, left, h, w) of timm's random-erasing rectangle, or None when 10 tries all fail."""
  area = height * width
  log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
  for _ in range(10):
    target = area * rng.uniform(scale[0], scale[1])
    aspect = math.exp(rng.uniform(*log_ratio))
    h, w = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
    if w < width and h < height:
      return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
  return None


@dataclasses.dataclass(frozen=True)
class ImageAugment:
  """augment(example, rng) -> the example with its "image" (uint8 [H, W, C]) augmented; shape kept.

  Attributes:
    random_resized_crop: crop a random box (`crop_scale` of the area, aspect `crop_ratio`) and resize it back
      to H x W (bicubic), as DeiT's RandomResizedCrop (scale (0.08, 1), ratio (3/4, 4/3)).
    flip_prob: probability of a horizontal flip (DeiT: 0.5).
    rand_augment: timm's RandAugment ("rand-m9-mstd0.5-inc1": `rand_num_ops` 2, `rand_magnitude` 9 with
      std 0.5; `primal_jax.tasks.vision.rand_augment`), after the crop and flip as in DeiT.
    erase_prob: probability of erasing one random rectangle (DeiT's --reprob 0.25; area (0.02, 1/3) of the
      image, aspect (0.3, 3.3)).
  """

  random_resized_crop: bool = False
  crop_scale: tuple[float, float] = (0.08, 1.0)
  crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
  flip_prob: float = 0.0
  rand_augment: bool = False
  rand_num_ops: int = 2
  rand_magnitude: float = 9.0
  rand_magnitude_std: float = 0.5
  erase_prob: float = 0.0
  erase_scale: tuple[float, float] = (0.02, 1 / 3)
  erase_ratio: tuple[float, float] = (0.3, 1 / 0.3)

  def __post_init__(self):
    for name in ("crop_scale", "erase_scale"):
      object.__setattr__(self, name, _uniform_pair(getattr(self, name), name))
    for name in ("crop_ratio", "erase_ratio"):
      object.__setattr__(self, name, _uniform_pair(getattr(self, name), name, low=1e-6))
    for name in ("flip_prob", "erase_prob"):
      if not 0.0 <= getattr(self, name) <= 1.0:
        raise ValueError(f"data.augment.{name} must be in [0, 1], got {getattr(self, name)!r}")
    if not isinstance(self.rand_num_ops, int) or self.rand_num_ops < 0:
      raise ValueError(f"data.augment.rand_num_ops must be an integer >= 0, got {self.rand_num_ops!r}")
    if not 0.0 <= self.rand_magnitude <= 10.0 or self.rand_magnitude_std < 0:
      raise ValueError(
        f"data.augment.rand_magnitude must be in [0, 10] and rand_magnitude_std >= 0, got "
        f"{self.rand_magnitude!r}, {self.rand_magnitude_std!r}"
      )

  @property
  def active(self) -> bool:
    return self.random_resized_crop or self.flip_prob > 0 or self.rand_augment or self.erase_prob > 0

  def __call__(self, example: Example, rng: np.random.Generator) -> Example:
    image = np.asarray(example["image"])
    height, width, channels = image.shape
    if self.random_resized_crop:
      from PIL import Image

      top, left, h, w = crop_box(height, width, self.crop_scale, self.crop_ratio, rng)
      crop = image[top : top + h, left : left + w]
      crop = Image.fromarray(crop[..., 0] if channels == 1 else crop).resize((width, height), Image.Resampling.BICUBIC)
      image = np.asarray(crop, np.uint8).reshape(height, width, channels)
    if self.flip_prob > 0 and rng.uniform() < self.flip_prob:
      image = image[:, ::-1]
    if self.rand_augment:
      image = rand_augment(
        image, rng, num_ops=self.rand_num_ops, magnitude=self.rand_magnitude, magnitude_std=self.rand_magnitude_std
      )
    if self.erase_prob > 0 and rng.uniform() < self.erase_prob:
      box = erase_box(height, width, self.erase_scale, self.erase_ratio, rng)
      if box is not None:
        top, left, h, w = box
        image = np.array(image)
        image[top : top + h, left : left + w] = rng.integers(0, 256, (h, w, channels), dtype=np.uint8)
    return {**example, "image": np.ascontiguousarray(image)}


def image_augment(options: Mapping[str, Any] | None) -> ImageAugment | None:
  """The `ImageAugment` of a config's `data.augment` section (None or all off: no augmentation)."""
  if not options:
    return None
  options = dict(options.items())
  known = {f.name for f in dataclasses.fields(ImageAugment)}
  unknown = sorted(set(options) - known)
  if unknown:
    raise ValueError(f"data.augment has unknown keys {unknown}; known: {sorted(known)}")
  augment = ImageAugment(**options)
  return augment if augment.active else None
