"""The independent checker: whether the two markers of an image are connected, decided from its pixels alone.

Ours: the label is decidable from the pixels by construction, which
`markers_connected` checks independently of the drawing (it shares no code
with `canvas` or `generate`). The contract, enforced on the quantised pixels
themselves (not on geometry):

  * the nonzero pixels of one path (its dashes and markers) form one
    8-connected set: every dash is drawn so that it touches the previous one;
  * nonzero pixels of different paths are never equal or 8-adjacent (a gap of
    at least one zero pixel); a dash keeps that gap from its own path too,
    except from the two dashes before it, so paths do not fold onto themselves;
  * path pixels are at most PATH_VALUE and every marker has a core of pixels
    at MARKER_VALUE > PATH_VALUE, so the markers can be found in the image.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from primal_jax.tasks.lra.pathfinder.geometry import PATH_VALUE


def _component(mask: np.ndarray, start: tuple[int, int]) -> np.ndarray:
  """bool [h, w]: the 8-connected component of `mask` containing `start` (breadth-first flood fill)."""
  h, w = mask.shape
  seen = np.zeros_like(mask, dtype=bool)
  seen[start] = True
  queue = deque([start])
  while queue:
    y, x = queue.popleft()
    for ny in (y - 1, y, y + 1):
      for nx in (x - 1, x, x + 1):
        if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
          seen[ny, nx] = True
          queue.append((ny, nx))
  return seen


def find_markers(image: np.ndarray, *, marker_threshold: int = PATH_VALUE) -> np.ndarray:
  """int [m, 2] (row, col): per 8-connected blob brighter than `marker_threshold`, its pixel nearest its centroid.

  Relies only on the image: paths never exceed PATH_VALUE, markers have cores at MARKER_VALUE.
  """
  image = np.asarray(image)
  if image.ndim != 2:
    raise ValueError(f"image must be 2-D [height, width], got shape {image.shape}")
  bright = image > marker_threshold
  left = bright.copy()
  found = []
  for y, x in zip(*np.nonzero(bright), strict=True):
    if left[y, x]:
      blob = _component(bright, (int(y), int(x)))
      left &= ~blob
      pixels = np.argwhere(blob)
      centre = pixels.mean(axis=0)
      found.append(pixels[np.argmin(((pixels - centre) ** 2).sum(axis=1))])
  return np.array(found, dtype=np.int64).reshape(-1, 2)


def markers_connected(image: np.ndarray, marker_positions: Any = None, *, threshold: int = 0) -> bool:
  """Whether the two markers lie in one 8-connected set of foreground pixels (value > threshold).

  Written against the pixels only, not the generator's bookkeeping: it is the
  check that a label is decidable from the image. `marker_positions`: two
  (row, col) pixels; None finds them with `find_markers` (exactly two blobs).
  """
  image = np.asarray(image)
  if image.ndim != 2:
    raise ValueError(f"image must be 2-D [height, width], got shape {image.shape}")
  positions = find_markers(image) if marker_positions is None else np.asarray(marker_positions)
  if positions.shape != (2, 2):
    raise ValueError(f"need exactly two markers as [[row, col], [row, col]], got {positions.tolist()}")
  foreground = image > threshold
  points = []
  for row, col in np.rint(positions).astype(np.int64):
    if not (0 <= row < image.shape[0] and 0 <= col < image.shape[1]) or not foreground[row, col]:
      raise ValueError(f"marker ({row}, {col}) is not a foreground pixel (> {threshold}) of the image")
    points.append((int(row), int(col)))
  return bool(_component(foreground, points[0])[points[1]])
