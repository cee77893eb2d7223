"""timm's RandAugment as DeiT uses it ("rand-m9-mstd0.5-inc1"), on one uint8 image with a NumPy Generator.

Per image: `num_ops` operations drawn with replacement from timm's "increasing" set, each applied with
probability 0.5 at magnitude ~ N(9, 0.5) clipped to [0, 10] (out of 10); geometric operations fill with the
mean colour and resample bicubically, as DeiT's `create_transform` passes them. The arguments follow timm
0.4.12's `auto_augment.py` level functions (rotate 30 degrees, shear 0.3, translate 0.45 of the side, enhance
factors 1 +- 0.9, posterize to 4 - 4 m/10 bits, solarize at 256 - 256 m/10, solarize-add 110 m/10, each
sign drawn at random); the operations are Pillow's, as in timm. Written here (not imported from timm) so the
pipeline needs no torch; the draws come from the example's Generator, so they match timm's distribution, not
its random stream.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

MAX_LEVEL = 10.0
# timm _RAND_INCREASING_TRANSFORMS, in its order.
OPS = (
  "AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing", "SolarizeIncreasing", "SolarizeAdd",
  "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing", "ShearX", "ShearY",
  "TranslateXRel", "TranslateYRel",
)  # fmt: skip
IMAGENET_FILL = (124, 116, 104)  # DeiT: round(255 * ImageNet mean)


def _signed(value: float, rng: np.random.Generator) -> float:
  return -value if rng.uniform() > 0.5 else value


def level_argument(op: str, magnitude: float, rng: np.random.Generator) -> float:
  """timm's level function of `op` at `magnitude` (0..10): the operation's own argument."""
  m = magnitude / MAX_LEVEL
  if op == "Rotate":
    return _signed(30.0 * m, rng)
  if op in ("ShearX", "ShearY"):
    return _signed(0.3 * m, rng)
  if op in ("TranslateXRel", "TranslateYRel"):
    return _signed(0.45 * m, rng)
  if op.endswith("Increasing") and op[: -len("Increasing")] in ("Color", "Contrast", "Brightness", "Sharpness"):
    return 1.0 + _signed(0.9 * m, rng)
  if op == "PosterizeIncreasing":
    return 4 - int(4 * m)
  if op == "SolarizeIncreasing":
    return 256 - int(256 * m)
  if op == "SolarizeAdd":
    return int(110 * m)
  return 0.0  # AutoContrast, Equalize, Invert take no argument


def _affine(image: Image.Image, matrix, fill) -> Image.Image:
  return image.transform(image.size, Image.Transform.AFFINE, matrix, resample=Image.Resampling.BICUBIC, fillcolor=fill)


def apply_op(image: Image.Image, op: str, arg: float, fill) -> Image.Image:
  """One operation on a Pillow image (mode "L" or "RGB")."""
  if op == "AutoContrast":
    return ImageOps.autocontrast(image)
  if op == "Equalize":
    return ImageOps.equalize(image)
  if op == "Invert":
    return ImageOps.invert(image)
  if op == "Rotate":
    return image.rotate(arg, resample=Image.Resampling.BICUBIC, fillcolor=fill)
  if op == "PosterizeIncreasing":
    return image if arg >= 8 else ImageOps.posterize(image, int(arg))
  if op == "SolarizeIncreasing":
    return ImageOps.solarize(image, int(arg))
  if op == "SolarizeAdd":
    lut = [min(255, i + int(arg)) if i < 128 else i for i in range(256)]
    return image.point(lut * len(image.getbands()))
  enhancers = {"Color": ImageEnhance.Color, "Contrast": ImageEnhance.Contrast}
  enhancers.update(Brightness=ImageEnhance.Brightness, Sharpness=ImageEnhance.Sharpness)
  if op.endswith("Increasing") and op[: -len("Increasing")] in enhancers:
    return enhancers[op[: -len("Increasing")]](image).enhance(arg)
  if op == "ShearX":
    return _affine(image, (1, arg, 0, 0, 1, 0), fill)
  if op == "ShearY":
    return _affine(image, (1, 0, 0, arg, 1, 0), fill)
  if op == "TranslateXRel":
    return _affine(image, (1, 0, arg * image.size[0], 0, 1, 0), fill)
  if op == "TranslateYRel":
    return _affine(image, (1, 0, 0, 0, 1, arg * image.size[1]), fill)
  raise ValueError(f"op must be one of {OPS}, got {op!r}")


def rand_augment(
  image: np.ndarray,
  rng: np.random.Generator,
  *,
  num_ops: int = 2,
  magnitude: float = 9.0,
  magnitude_std: float = 0.5,
  prob: float = 0.5,
  fill=IMAGENET_FILL,
) -> np.ndarray:
  """uint8 [H, W, C] (C 1 or 3) -> the same shape after `num_ops` random operations (module doc)."""
  height, width, channels = image.shape
  pil = Image.fromarray(image[..., 0] if channels == 1 else image)
  fill = int(round(float(np.mean(fill)))) if channels == 1 else tuple(int(v) for v in fill)
  for index in rng.integers(0, len(OPS), num_ops):  # with replacement, as timm (no choice weights)
    if prob < 1.0 and rng.uniform() > prob:
      continue
    level = rng.normal(magnitude, magnitude_std) if magnitude_std > 0 else magnitude
    op = OPS[int(index)]
    pil = apply_op(pil, op, level_argument(op, min(MAX_LEVEL, max(0.0, level)), rng), fill)
  return np.asarray(pil, np.uint8).reshape(height, width, channels)
