"""Image corruptions at five severities, seeded and written as code (not data), for distribution-shift tests.

In the spirit of CIFAR-10-C / ImageNet-C (Hendrycks & Dietterich, 2019), five kinds, each a pure NumPy function
of uint8 images [n, H, W, C] -> uint8 images of the same shape (computed in float64 on [0, 1], clipped,
rounded)::

  gaussian_noise  x + N(0, sigma^2), sigma = ImageNet-C's (0.08, 0.12, 0.18, 0.26, 0.38)
  shot_noise      Poisson(x * lam) / lam, lam = ImageNet-C's (60, 25, 12, 5, 3)
  gaussian_blur   separable Gaussian blur (reflected borders), sigma in pixels (0.5, 0.75, 1.0, 1.25, 1.5) (ours:
                  scaled for 28-32 pixel images; CIFAR-10-C's 0.4-1.0 barely blur 28 x 28 Fashion-MNIST)
  contrast        (x - mean) * c + mean per image and channel, c = ImageNet-C's (0.4, 0.3, 0.2, 0.1, 0.05)
  pixelate        nearest-neighbour down to round(f * H) pixels a side and back up, f = (0.6, 0.5, 0.4, 0.3, 0.25)

Severity 1 is the mildest, 5 the strongest; each severity's parameter moves the image further from the clean one.
The noise is drawn from `np.random.default_rng([seed, kind index, severity])`, so a (kind, severity, seed) gives
the same images on every machine and in every process.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping

import numpy as np

SEVERITIES = (1, 2, 3, 4, 5)
PARAMETERS: Mapping[str, tuple[float, ...]] = types.MappingProxyType(
  {
    "gaussian_noise": (0.08, 0.12, 0.18, 0.26, 0.38),
    "shot_noise": (60.0, 25.0, 12.0, 5.0, 3.0),
    "gaussian_blur": (0.5, 0.75, 1.0, 1.25, 1.5),
    "contrast": (0.4, 0.3, 0.2, 0.1, 0.05),
    "pixelate": (0.6, 0.5, 0.4, 0.3, 0.25),
  }
)
CORRUPTIONS = tuple(PARAMETERS)


def _gaussian_noise(x: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
  return x + rng.normal(0.0, sigma, x.shape)


def _shot_noise(x: np.ndarray, lam: float, rng: np.random.Generator) -> np.ndarray:
  return rng.poisson(x * lam) / lam


def gaussian_kernel(sigma: float) -> np.ndarray:
  """[2 ceil(3 sigma) + 1] normalised Gaussian taps."""
  radius = int(np.ceil(3 * sigma))
  t = np.arange(-radius, radius + 1, dtype=np.float64)
  taps = np.exp(-0.5 * (t / sigma) ** 2)
  return taps / taps.sum()


def _blur_axis(x: np.ndarray, taps: np.ndarray, axis: int) -> np.ndarray:
  radius = len(taps) // 2
  pad = [(0, 0)] * x.ndim
  pad[axis] = (radius, radius)
  padded = np.pad(x, pad, mode="reflect")
  length = x.shape[axis]
  return sum(w * np.take(padded, np.arange(i, i + length), axis=axis) for i, w in enumerate(taps))


def _gaussian_blur(x: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
  del rng
  taps = gaussian_kernel(sigma)
  return _blur_axis(_blur_axis(x, taps, 1), taps, 2)


def _contrast(x: np.ndarray, c: float, rng: np.random.Generator) -> np.ndarray:
  del rng
  mean = x.mean(axis=(1, 2), keepdims=True)
  return (x - mean) * c + mean


def _pixelate(x: np.ndarray, factor: float, rng: np.random.Generator) -> np.ndarray:
  del rng
  h, w = x.shape[1:3]
  sh, sw = max(1, round(factor * h)), max(1, round(factor * w))
  rows = np.minimum(((np.arange(sh) + 0.5) * h / sh).astype(int), h - 1)  # centres of the small grid's cells
  cols = np.minimum(((np.arange(sw) + 0.5) * w / sw).astype(int), w - 1)
  small = x[:, rows][:, :, cols]
  up_rows = np.minimum((np.arange(h) * sh / h).astype(int), sh - 1)
  up_cols = np.minimum((np.arange(w) * sw / w).astype(int), sw - 1)
  return small[:, up_rows][:, :, up_cols]


_FUNCTIONS: Mapping[str, Callable[[np.ndarray, float, np.random.Generator], np.ndarray]] = types.MappingProxyType(
  {
    "gaussian_noise": _gaussian_noise,
    "shot_noise": _shot_noise,
    "gaussian_blur": _gaussian_blur,
    "contrast": _contrast,
    "pixelate": _pixelate,
  }
)


def corrupt(images, kind: str, severity: int, seed: int = 0) -> np.ndarray:
  """uint8 [n, H, W, C] images under corruption `kind` at `severity` (1-5), deterministic given `seed`."""
  images = np.asarray(images)
  if kind not in _FUNCTIONS:
    raise ValueError(f"kind must be one of {', '.join(CORRUPTIONS)}, got {kind!r}")
  if severity not in SEVERITIES:
    raise ValueError(f"severity must be one of {SEVERITIES}, got {severity!r}")
  if images.dtype != np.uint8 or images.ndim != 4:
    raise ValueError(f"images must be uint8 [n, H, W, C], got {images.dtype} {images.shape}")
  rng = np.random.default_rng([int(seed), CORRUPTIONS.index(kind), int(severity)])
  x = images.astype(np.float64) / 255.0
  out = _FUNCTIONS[kind](x, PARAMETERS[kind][severity - 1], rng)
  return np.round(np.clip(out, 0.0, 1.0) * 255.0).astype(np.uint8)
