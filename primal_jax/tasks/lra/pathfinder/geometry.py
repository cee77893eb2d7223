"""What a Pathfinder image looks like: pixel values, difficulty levels and every drawing parameter (`Geometry`).

Kept apart from the drawing so that the pipeline and the checker can name a
level or a pixel value without importing the renderer.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping

from primal_jax.data.checks import check_int_at_least

LEVELS: Mapping[str, int] = types.MappingProxyType({"easy": 6, "intermediate": 9, "hard": 14})
LEVEL_DIRECTORIES: Mapping[str, str] = types.MappingProxyType(
  {"easy": "curv_baseline", "intermediate": "curv_contour_length_9", "hard": "curv_contour_length_14"}
)
PATH_VALUE = 191  # brightest path pixel (0.75 of full scale)
MARKER_VALUE = 255  # marker cores; brighter than any path pixel so markers can be located in the image
IMAGE_SIZE = 32  # LRA's Pathfinder column (Path-X is 128)
DEFAULT_DIFFICULTY = "hard"


@dataclasses.dataclass(frozen=True)
class Geometry:
  """Every parameter of the drawing, in pixels and degrees; the defaults follow LRA's Pathfinder32 settings.

  LRA's (snakes2 arguments): paddle_length 2, paddle_margin 1, marker_radius
  1.5, seed_distance 7, padding 1, continuity 1.0, distractor_length
  contour_length // 3 and num_distractor_snakes 20 // distractor_length. Its
  paddle_thickness 0.5 drawn at 2x and downsampled becomes our width 1.0 with
  antialiasing.
  """

  size: int = IMAGE_SIZE
  contour_length: int = 9  # dashes per target path
  num_distractors: int | None = None  # None: 20 // distractor_length (LRA Pathfinder32)
  distractor_length: int | None = None  # None: max(contour_length // 3, 1)
  dash_length: float = 2.0
  dash_gap: float = 1.0
  width: float | None = None  # stroke width; None: 1.0 antialiased, 1.5 otherwise (a thinner one is not 8-connected)
  marker_radius: float = 1.5
  max_turn: float = 90.0  # degrees between consecutive dashes
  seed_distance: float = 7.0  # between the starts of the two target paths
  padding: int = 1  # border pixels that stay empty
  antialias: bool = True

  def resolved(self) -> Geometry:
    """A copy with the derived defaults filled in and every value checked."""
    length = check_int_at_least(self.contour_length, "contour_length", 4)
    d_length = max(length // 3, 1) if self.distractor_length is None else self.distractor_length
    d_length = check_int_at_least(d_length, "distractor_length", 1)
    count = 20 // d_length if self.num_distractors is None else self.num_distractors
    count = check_int_at_least(count, "num_distractors", 0)
    width = (1.0 if self.antialias else 1.5) if self.width is None else self.width
    size = check_int_at_least(self.size, "size", 8)
    padding = check_int_at_least(self.padding, "padding", 0)
    if 2 * padding >= size - 4:
      raise ValueError(f"padding={padding} leaves no room in a {size}x{size} image")
    for name in ("dash_length", "dash_gap", "seed_distance", "width", "marker_radius"):
      value = width if name == "width" else getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite non-negative number, got {value!r}")
    if not 0 < self.dash_length <= size / 2:
      raise ValueError(f"dash_length must lie in (0, size / 2], got {self.dash_length!r}")
    if not isinstance(self.max_turn, int | float) or not 0 <= self.max_turn <= 180:
      raise ValueError(f"max_turn must lie in [0, 180] degrees, got {self.max_turn!r}")
    # Pixel centres within a radius > sqrt(2)/2 of a segment always form an 8-connected set; below it a
    # dash could break into pieces and a positive would stop being connected in its pixels.
    strokes = (
      (f"width={width!r}", width / 2, PATH_VALUE),
      (f"marker_radius={self.marker_radius!r}", self.marker_radius, MARKER_VALUE),
    )
    for name, radius, brightness in strokes:
      reach = radius + (0.5 - 0.5 / brightness if self.antialias else 0.0)
      if reach <= math.sqrt(0.5):
        raise ValueError(
          f"{name} draws strokes too thin to stay 8-connected (nonzero radius {reach:.3f} <= {math.sqrt(0.5):.3f}); "
          "use a larger value"
        )
    return dataclasses.replace(
      self,
      size=size,
      contour_length=length,
      distractor_length=d_length,
      num_distractors=count,
      padding=padding,
      width=float(width),
    )


def level_geometry(
  difficulty: str = DEFAULT_DIFFICULTY, *, contour_length: int | None = None, num_distractors: int | None = None
) -> Geometry:
  """The resolved Geometry of a difficulty level, optionally with its path length or distractor count replaced.

  The overrides make levels between or below LRA's three (e.g. 4-dash paths
  without distractors, which a small conv net learns in a few hundred steps),
  for curricula and diagnostics. None keeps the level's value.
  """
  if difficulty not in LEVELS:
    raise ValueError(f"difficulty must be one of {', '.join(LEVELS)}, got {difficulty!r}")
  length = LEVELS[difficulty] if contour_length is None else contour_length
  return Geometry(contour_length=length, num_distractors=num_distractors).resolved()
