"""Pathfinder (Linsley et al. 2018), the Long Range Arena task "Pathfinder", generated here from a seed.

Each image shows two circular markers and several curvy paths made of short
dashes; the label is 1 ("connected") iff both markers lie at the two ends of
one path. LRA's column is Pathfinder-32 "hard" (32x32 pixels, 14 dashes per
path, `pathfinder32/curv_contour_length_14`), read as 1,024 pixel tokens. The
images LRA used were drawn by drewlinsley/pathfinder (`snakes2.py`) and ship
in a download outside the package registries; this module draws the same kind
of image with its own code, so the task needs no download and is reproducible
from (seed, parameters). It is not LRA's data set: accuracies are comparable
in kind, not to the digit.

Kept from the original design (`snakes2_wrapper.py`, and the Pathfinder32
settings quoted in LRA's `lra_benchmarks/data/pathfinder.py`): every image
holds two *target* paths of `contour_length` dashes whose first dashes start
`seed_distance` (7) pixels apart, plus up to 20 // (contour_length // 3)
distractor paths of contour_length // 3 dashes. One marker (radius 1.5) sits
at the start of target A, the other at the far end of A (positive) or of B
(negative), so both classes show the same kind and number of paths and only
tracing them tells the label. Dashes are 2 px long with a 1 px gap; each turns
from the previous one by at most `max_turn` (90) degrees, small turns
preferred with weight cos^2 as LRA's `continuity = 1.0`.

One departure, on by default (`match_marker_distance`): drawn that way, the
markers of a negative sit further apart than those of a positive (the second
one is on B, which starts seed_distance from A), and on the easy level the
distance between the markers alone predicts the label 73% of the time. So
positives and negatives are kept in pairs whose marker distances fall in the
same half-pixel bin; the distance then predicts ~51% (tested). This costs
about two drawings per kept image.

Modules (generation and checking need numpy only; the pipeline needs grain):

  geometry        pixel values, difficulty levels, `Geometry` (every drawing parameter)
  canvas          the renderer: lockstep drawing of dashes and markers
  generate        `generate_pathfinder`: labels, target and distractor paths, distance matching
  check           `markers_connected` / `find_markers`: the label from the pixels alone
  samples         PNG sample sheets (`python -m primal_jax.tasks.lra.pathfinder OUT_DIR` writes them)
  input_pipeline  cached splits and `make_pathfinder_pipeline` (task "pathfinder")
"""

from primal_jax.tasks.lra.pathfinder.check import (
  find_markers,
  markers_connected,
)
from primal_jax.tasks.lra.pathfinder.generate import (
  GENERATOR_VERSION,
  generate_pathfinder,
)
from primal_jax.tasks.lra.pathfinder.geometry import (
  DEFAULT_DIFFICULTY,
  IMAGE_SIZE,
  LEVEL_DIRECTORIES,
  LEVELS,
  MARKER_VALUE,
  PATH_VALUE,
  Geometry,
  level_geometry,
)
from primal_jax.tasks.lra.pathfinder.input_pipeline import (
  CLASS_NAMES,
  DEFAULT_SPLIT_SIZES,
  PATHFINDER_STREAM,
  VOCAB_SIZE,
  PathfinderSource,
  load_or_generate_split,
  make_pathfinder_pipeline,
  split_cache_path,
)
from primal_jax.tasks.lra.pathfinder.samples import (
  write_level_samples,
  write_samples_png,
)

__all__ = [
  "CLASS_NAMES",
  "DEFAULT_DIFFICULTY",
  "DEFAULT_SPLIT_SIZES",
  "GENERATOR_VERSION",
  "IMAGE_SIZE",
  "LEVELS",
  "LEVEL_DIRECTORIES",
  "MARKER_VALUE",
  "PATHFINDER_STREAM",
  "PATH_VALUE",
  "VOCAB_SIZE",
  "Geometry",
  "PathfinderSource",
  "find_markers",
  "generate_pathfinder",
  "level_geometry",
  "load_or_generate_split",
  "make_pathfinder_pipeline",
  "markers_connected",
  "split_cache_path",
  "write_level_samples",
  "write_samples_png",
]
