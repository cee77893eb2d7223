"""Sample sheets for looking at the data: PNG grids of images framed by their labels.

Not needed for training; Pillow is imported only when a sheet is written.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from primal_jax.data.checks import check_int_at_least
from primal_jax.tasks.lra.pathfinder.generate import generate_pathfinder
from primal_jax.tasks.lra.pathfinder.geometry import LEVELS


def write_samples_png(
  images: np.ndarray, labels: np.ndarray, path: str | Path, *, columns: int = 8, scale: int = 4, frame: int = 2
) -> Path:
  """Writes a grid of the images (each enlarged `scale` times) framed green for label 1, red for 0; returns the path."""
  try:
    from PIL import Image
  except ImportError as e:  # pragma: no cover - PIL comes with matplotlib (the notebooks/test extras)
    raise ImportError("write_samples_png needs Pillow: pip install pillow (or the 'test' extra)") from e
  images, labels = np.asarray(images), np.asarray(labels)
  if images.ndim != 3 or images.dtype != np.uint8 or len(images) == 0:
    raise ValueError(f"images must be a non-empty uint8 array [n, height, width], got {images.dtype} {images.shape}")
  if labels.shape != (len(images),):
    raise ValueError(f"labels must have shape ({len(images)},), got {labels.shape}")
  columns = check_int_at_least(columns, "columns", 1)
  scale = check_int_at_least(scale, "scale", 1)
  frame = check_int_at_least(frame, "frame", 0)
  n, h, w = images.shape
  columns = min(columns, n)
  rows = math.ceil(n / columns)
  cell_h, cell_w = h * scale + 2 * frame, w * scale + 2 * frame
  grid = np.full((rows * cell_h, columns * cell_w, 3), 40, np.uint8)
  colours = {0: (220, 40, 40), 1: (40, 200, 40)}
  for i, (img, label) in enumerate(zip(images, labels, strict=True)):
    top, left = (i // columns) * cell_h, (i % columns) * cell_w
    grid[top : top + cell_h, left : left + cell_w] = colours.get(int(label), (128, 128, 128))
    big = np.kron(img, np.ones((scale, scale), np.uint8))
    grid[top + frame : top + frame + h * scale, left + frame : left + frame + w * scale] = big[..., None]
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  Image.fromarray(grid, "RGB").save(path)
  return path


def write_level_samples(folder: str | Path, *, num_per_level: int = 32, seed: int = 0) -> dict[str, Path]:
  """Writes `pathfinder_<level>.png` with `num_per_level` samples of every difficulty level into `folder`."""
  out = {}
  for level, length in LEVELS.items():
    images, labels = generate_pathfinder(num_per_level, seed=seed, contour_length=length)
    out[level] = write_samples_png(images, labels, Path(folder) / f"pathfinder_{level}.png")
  return out
