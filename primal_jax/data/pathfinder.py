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

Ours: the label is decidable from the pixels by construction, which
`markers_connected` checks independently of the drawing. The contract,
enforced on the quantised pixels themselves (not on geometry):

  * the nonzero pixels of one path (its dashes and markers) form one
    8-connected set: every dash is drawn so that it touches the previous one;
  * nonzero pixels of different paths are never equal or 8-adjacent (a gap of
    at least one zero pixel); a dash keeps that gap from its own path too,
    except from the two dashes before it, so paths do not fold onto themselves;
  * path pixels are at most PATH_VALUE and every marker has a core of pixels
    at MARKER_VALUE > PATH_VALUE, so the markers can be found in the image.

Dashes are drawn with antialiasing by default: a pixel's intensity falls
linearly from full to zero over the pixel beyond the stroke's half-width,
then the canvas is quantised to uint8. A gap between dashes is therefore a
dimmer pixel rather than a zero one: the dashes show as a modulation of
intensity along a path that stays one 8-connected set.

Tokens: pixel intensity v in 0..255 becomes token v + 1 (vocab_size 257),
because token 0 is reserved for padding in `token_tasks`. LRA feeds v itself
with a 256-entry vocabulary and no padding; the shift only renames the
embedding rows.

Drawing is vectorised over chunks of images in lockstep (every image draws its
n-th dash at the same time), choosing among random candidate dashes; choices
are steered towards free room ahead, a target path that runs into a dead end
takes back its previous dash a few times, and an image that still fails is
redrawn in a later round, with the same label. Roughly 1,000 (easy) to 650
(hard) images/s on one CPU core.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import tempfile
import time
import types
import warnings
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

LEVELS: Mapping[str, int] = types.MappingProxyType({"easy": 6, "intermediate": 9, "hard": 14})
LEVEL_DIRECTORIES: Mapping[str, str] = types.MappingProxyType(
  {"easy": "curv_baseline", "intermediate": "curv_contour_length_9", "hard": "curv_contour_length_14"}
)
PATH_VALUE = 191  # brightest path pixel (0.75 of full scale)
MARKER_VALUE = 255  # marker cores; brighter than any path pixel so markers can be located in the image
CLASS_NAMES = ("disconnected", "connected")
VOCAB_SIZE = 257  # pixel v -> token v + 1; 0 is padding
IMAGE_SIZE = 32  # LRA's Pathfinder column (Path-X is 128)
# LRA splits each 200,000-image difficulty level 80/10/10 (lra_benchmarks/image/input_pipeline.py,
# get_pathfinder_base_datasets: `[:80%]`, `[80%:90%]`, `[90%:]`; base_pathfinder32_config.py:
# TRAIN_EXAMPLES = 160000, VALID_EXAMPLES = 20000). The Nystromformer preprocessing that the
# Primal-Attention release builds on splits the same 80/10/10.
DEFAULT_SPLIT_SIZES: Mapping[str, int] = types.MappingProxyType(
  {"train": 160_000, "validation": 20_000, "test": 20_000}
)
DEFAULT_DIFFICULTY = "hard"

# Bumped whenever the drawing changes, so cached splits of an older drawing are never reused.
GENERATOR_VERSION = 2  # 2: positives and negatives matched in marker distance
# Stream of randomness for the dataset, apart from the per-epoch orders drawn from the same seed.
PATHFINDER_STREAM = 11
_SPLIT_IDS = types.MappingProxyType({"train": 0, "validation": 1, "test": 2})
# Images drawn together in lockstep; part of what fixes the output for a seed, so it is a constant.
_CHUNK = 1024
_TURN_CANDIDATES = 16  # random turning angles tried for every dash
_PLACE_CANDIDATES = 48  # random positions tried for the first dash of a path ...
_FIRST_CANDIDATES = 8  # ... but the first path of an image has the whole image to itself
_BACKTRACKS = 3  # times a target path may take back a dash after a dead end
_MIN_ATTEMPTS, _MIN_SUCCESS_RATE = 2048, 0.01  # below this rate of drawn images, give up
_DISTANCE_BIN = 0.5  # pixels; positives and negatives are paired within a bin of marker distance
_LOOKAHEAD = 3.0  # pixels beyond a candidate dash's end where its free room is measured
_ROOM = 4  # half-side of that box
_ROOM_POWER = 8  # how strongly free room steers the choice among valid candidates
_SUBPIXEL = 8  # start points lie on a 1/8-pixel grid ...
_ANGLES = 256  # ... and headings on a 360/256-degree one, so plain dashes come from a table


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
    length = _check_int(self.contour_length, "contour_length", 4)
    d_length = max(length // 3, 1) if self.distractor_length is None else self.distractor_length
    d_length = _check_int(d_length, "distractor_length", 1)
    count = 20 // d_length if self.num_distractors is None else self.num_distractors
    count = _check_int(count, "num_distractors", 0)
    width = (1.0 if self.antialias else 1.5) if self.width is None else self.width
    size = _check_int(self.size, "size", 8)
    padding = _check_int(self.padding, "padding", 0)
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


def _check_int(value: Any, name: str, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
    raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
  return int(value)


def _dilate(mask: np.ndarray) -> np.ndarray:
  """3x3 binary dilation of [..., h, w] (pixels equal or 8-adjacent to a True pixel); edges count as False."""
  padded = np.pad(mask, [(0, 0)] * (mask.ndim - 2) + [(1, 1), (1, 1)])
  h, w = mask.shape[-2:]
  out = np.zeros_like(mask)
  for dy in range(3):
    for dx in range(3):
      out |= padded[..., dy : dy + h, dx : dx + w]
  return out


def _quantize(sy: np.ndarray, sx: np.ndarray, th: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Start points moved to the centres of their 1/_SUBPIXEL-pixel cells, headings to multiples of 2 pi / _ANGLES.

  On this grid a plain dash is one of _SUBPIXEL**2 * _ANGLES pictures, drawn
  once per call of `generate_pathfinder` and then only looked up.
  """
  q = _SUBPIXEL
  step = 2 * math.pi / _ANGLES
  return (np.floor(sy * q) + 0.5) / q, (np.floor(sx * q) + 0.5) / q, np.rint(th / step) * step


class _Canvas:
  """Lockstep drawing state of a chunk of images (row i is image i), in coordinates padded by a window.

  Paths are drawn a piece (one dash, with any marker on it) at a time into
  slots: 0 and 1 hold the two target paths, 2 the distractor being drawn. Each
  slot keeps its own layer of values and of dilated supports (nonzero pixels
  grown by one pixel), so a slot can be rolled back without touching the
  others: `recent` holds the slot's two newest pieces, `old` the rest of it.
  A new piece of a slot must avoid `done` (the border and finished paths),
  every slot's `old` and the other slots' `recent`, and touch its own newest piece.
  """

  def __init__(self, geo: Geometry, n: int, stamps: np.ndarray | None = None):
    self.geo = geo
    # Window half-sides keeping every nonzero pixel of a piece, and its dilation, inside the window.
    self.dash_half = math.ceil(geo.dash_length + geo.width / 2 + 0.5) + 1
    self.marker_half = math.ceil(geo.dash_length + max(geo.width / 2, geo.marker_radius) + 0.5) + 1
    self.pad = self.marker_half
    side = geo.size + 2 * self.pad
    self.finished = np.zeros((n, side, side), np.uint8)
    self.done = np.ones((n, side, side), bool)
    inner = slice(self.pad + geo.padding, self.pad + geo.size - geo.padding)
    self.done[:, inner, inner] = False
    self.layer = np.zeros((3, n, side, side), np.uint8)
    self.old = np.zeros((3, n, side, side), bool)
    self.recent = np.zeros((3, 2, n, side, side), bool)  # [slot, newest / second newest, row, y, x]
    self.used = np.zeros(3, bool)  # slots holding pieces
    self.origin = np.zeros((3, 2, n))  # [slot, (y, x), row]: start of the slot's first piece
    self.end = np.zeros((3, 2, n))  # end of its newest piece
    self.heading = np.zeros((3, n))
    self.stamps = self.dash_stamps() if stamps is None else stamps

  def image(self) -> np.ndarray:
    """uint8 [n, size, size] of the finished paths."""
    crop = slice(self.pad, self.pad + self.geo.size)
    return self.finished[:, crop, crop]

  def dash_stamps(self) -> np.ndarray:
    """uint8 [_SUBPIXEL, _SUBPIXEL, _ANGLES, win, win]: every plain dash on the grid of `_quantize`."""
    q, cells = _SUBPIXEL, (np.arange(_SUBPIXEL) + 0.5) / _SUBPIXEL
    sy = np.broadcast_to(cells[:, None, None], (q, q, _ANGLES)).reshape(q * q, _ANGLES)
    sx = np.broadcast_to(cells[None, :, None], (q, q, _ANGLES)).reshape(q * q, _ANGLES)
    th = np.broadcast_to(np.arange(_ANGLES) * (2 * math.pi / _ANGLES), (q * q, _ANGLES))
    none = np.zeros(q * q, bool)
    values, _, _ = self.render(sy, sx, th, none, none, self.dash_half)
    return values.reshape(q, q, _ANGLES, *values.shape[-2:])

  def _shade(self, dist: np.ndarray, radius: float, value: int) -> np.ndarray:
    if self.geo.antialias:
      cover = np.clip(np.float32(radius + 0.5) - dist, 0.0, 1.0)
    else:
      cover = (dist <= radius).astype(np.float32)
    return np.rint(cover * np.float32(value)).astype(np.uint8)

  def render(self, sy, sx, th, start_marker, end_marker, half):
    """uint8 [n, k, win, win] pieces (a dash from (sy, sx) at angle th, optional marker discs at its ends).

    Returns them with the padded coordinates of their windows' first row and
    column; the window is 2 * half + 1 pixels square around floor(start).
    """
    g = self.geo
    offsets = np.arange(2 * half + 1)
    oy = np.floor(sy).astype(np.int64) - half  # image coordinates of the window's first row
    ox = np.floor(sx).astype(np.int64) - half
    py = ((oy[..., None] + offsets) - sy[..., None]).astype(np.float32)[..., :, None]  # [n, k, win, 1]
    px = ((ox[..., None] + offsets) - sx[..., None]).astype(np.float32)[..., None, :]  # [n, k, 1, win]
    uy = np.sin(th).astype(np.float32)[..., None, None]
    ux = np.cos(th).astype(np.float32)[..., None, None]
    length = np.float32(g.dash_length)
    t = np.clip(py * uy + px * ux, 0.0, length)
    dy, dx = py - t * uy, px - t * ux
    values = self._shade(np.sqrt(dy * dy + dx * dx), g.width / 2, PATH_VALUE)
    for flag, (cy, cx) in ((start_marker, (py, px)), (end_marker, (py - length * uy, px - length * ux))):
      if flag.any():
        disc = self._shade(np.sqrt(cy * cy + cx * cx), g.marker_radius, MARKER_VALUE)
        values = np.where(flag[:, None, None, None], np.maximum(values, disc), values)
    return values, oy + self.pad, ox + self.pad

  def _pieces(self, sy, sx, th, start_marker, end_marker):
    """(values [m, k, win, win], window origins, half) of quantised candidates: looked up unless they carry a marker."""
    if start_marker.any() or end_marker.any():
      half = self.marker_half
      return (*self.render(sy, sx, th, start_marker, end_marker, half), half)
    half = self.dash_half
    iy, ix = np.floor(sy), np.floor(sx)
    cell_y = ((sy - iy) * _SUBPIXEL).astype(np.int64)
    cell_x = ((sx - ix) * _SUBPIXEL).astype(np.int64)
    angle = np.rint(th * (_ANGLES / (2 * math.pi))).astype(np.int64) % _ANGLES
    values = self.stamps[cell_y, cell_x, angle]
    return values, iy.astype(np.int64) - half + self.pad, ix.astype(np.int64) - half + self.pad, half

  def _blocked(self, slot: int, rows: np.ndarray) -> np.ndarray:
    """bool [m, side, side]: where a new piece of `slot` must have no nonzero pixel."""
    blocked = self.done[rows]
    for other in np.flatnonzero(self.used):
      blocked |= self.old[other, rows]
      if other != slot:
        blocked |= self.recent[other, 0, rows] | self.recent[other, 1, rows]
    return blocked

  def place(self, slot, rows, sy, sx, th, rng, *, link, prior=None, start_marker=None, end_marker=None):
    """Draws one of the quantised candidate pieces [m, k] in each of `rows`; returns drawn [n].

    Valid: its start lies in the image, its nonzero pixels avoid everything
    blocked for `slot`, and (with `link`) touch the slot's newest piece. Among
    the valid ones a row draws one at random with weight `prior` (the turning
    preference) times a power of the free room ahead of its end: looking ahead
    steers paths away from walls and other paths, so far fewer run into dead ends.
    """
    drawn = np.zeros(self.done.shape[0], bool)
    m = rows.size
    if m == 0:
      return drawn
    g = self.geo
    pick = rng.uniform(size=m)
    flags = [np.zeros(m, bool) if f is None else f for f in (start_marker, end_marker)]
    inside = (sy >= 0) & (sy <= g.size - 1) & (sx >= 0) & (sx <= g.size - 1)
    sy, sx = np.clip(sy, 0, g.size - 1), np.clip(sx, 0, g.size - 1)  # windows stay in the maps; invalid anyway
    values, oy, ox, half = self._pieces(sy, sx, th, *flags)
    win = 2 * half + 1
    support = values > 0
    blocked = self._blocked(slot, rows)
    code = blocked.view(np.uint8)
    if link:
      code = code | (self.recent[slot, 0, rows].view(np.uint8) << 1)
    windows = np.lib.stride_tricks.sliding_window_view(code, (win, win), axis=(1, 2))
    seen = windows[np.arange(m)[:, None], oy, ox]  # [m, k, win, win]
    valid = inside & ~(support & (seen & 1).view(bool)).any(axis=(2, 3))
    if link:
      valid &= (support & (seen >> 1).view(bool)).any(axis=(2, 3))
    weight = valid * (1.0 if prior is None else prior) * self._room(blocked, sy, sx, th) ** _ROOM_POWER
    cumulative = np.cumsum(weight, axis=1)
    total = cumulative[:, -1]
    ok = total > 0
    chosen = np.argmax(cumulative > (pick * total)[:, None], axis=1)
    drawn[rows] = ok

    local = np.flatnonzero(ok)
    if local.size:
      rows, c = rows[local], chosen[local]
      piece = values[local, c]  # [r, win, win]
      ry = (oy[local, c][:, None] + np.arange(win))[:, :, None]
      rx = (ox[local, c][:, None] + np.arange(win))[:, None, :]
      rr = rows[:, None, None]
      layer = self.layer[slot]
      layer[rr, ry, rx] = np.maximum(layer[rr, ry, rx], piece)
      self.old[slot, rows] |= self.recent[slot, 1, rows]
      self.recent[slot, 1, rows] = self.recent[slot, 0, rows]
      self.recent[slot, 0, rows] = False
      self.recent[slot, 0][rr, ry, rx] = _dilate(piece > 0)
      self.used[slot] = True
      start_y, start_x, angle = sy[local, c], sx[local, c], th[local, c]
      if not link:
        self.origin[slot, 0, rows], self.origin[slot, 1, rows] = start_y, start_x
      self.heading[slot, rows] = angle
      self.end[slot, 0, rows] = start_y + g.dash_length * np.sin(angle)
      self.end[slot, 1, rows] = start_x + g.dash_length * np.cos(angle)
    return drawn

  def _room(self, blocked: np.ndarray, sy, sx, th) -> np.ndarray:
    """[m, k] fraction of free pixels, on a 2-pixel lattice, in the box ahead of each candidate's end.

    The box (2 * _ROOM + 1 pixels square, clipped to the padded map) is centred
    _LOOKAHEAD pixels beyond the end; sampling every other pixel is plenty for a steer.
    """
    m, side = blocked.shape[0], blocked.shape[1]
    box = 2 * _ROOM + 1
    ahead = self.geo.dash_length + _LOOKAHEAD
    y0 = np.clip(np.rint(sy + ahead * np.sin(th)).astype(np.int64) + self.pad - _ROOM, 0, side - box)
    x0 = np.clip(np.rint(sx + ahead * np.cos(th)).astype(np.int64) + self.pad - _ROOM, 0, side - box)
    taken = blocked.view(np.uint8)
    s0, s1, s2 = taken.strides
    samples = _ROOM + 1
    lattice = np.lib.stride_tricks.as_strided(
      taken, (m, side - box + 1, side - box + 1, samples, samples), (s0, s1, s2, 2 * s1, 2 * s2), writeable=False
    )
    count = lattice[np.arange(m)[:, None], y0, x0].sum(axis=(2, 3), dtype=np.int32)
    return 1.0 - count / samples**2

  def snapshot(self, slot: int) -> list[np.ndarray]:
    """Copies of everything of `slot`, for `restore`."""
    return [a[slot].copy() for a in (self.layer, self.old, self.recent, self.end, self.heading)]

  def restore(self, slot: int, rows: np.ndarray, snapshot: list[np.ndarray]) -> None:
    """Rolls `slot` back to `snapshot` in `rows`; the other slots keep what they drew since."""
    for array, saved in zip((self.layer, self.old, self.recent, self.end, self.heading), snapshot, strict=True):
      _set_rows(array[slot], saved, rows)

  def save_rows(self, slot: int, rows: np.ndarray, snapshot: list[np.ndarray]) -> None:
    """Overwrites `rows` of `snapshot` with the slot's current state."""
    for array, saved in zip((self.layer, self.old, self.recent, self.end, self.heading), snapshot, strict=True):
      _set_rows(saved, array[slot], rows)

  def finish(self, slot: int) -> None:
    """The slot's path is complete: merged into the finished image, and blocking every later piece."""
    np.maximum(self.finished, self.layer[slot], out=self.finished)
    self.done |= self.old[slot] | self.recent[slot, 0] | self.recent[slot, 1]
    self.layer[slot] = 0
    self.old[slot] = False
    self.recent[slot] = False
    self.used[slot] = False


def _set_rows(target: np.ndarray, source: np.ndarray, rows: np.ndarray) -> None:
  """target[..., rows, <image axes>] = source[...] there: rows are the axis before an image's (y, x), or the last."""
  if target.ndim >= 3:  # [..., n, side, side]
    target[..., rows, :, :] = source[..., rows, :, :]
  else:  # [..., n]
    target[..., rows] = source[..., rows]


def _draw_chunk(
  geo: Geometry, labels: np.ndarray, rng: np.random.Generator, stamps: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(images uint8 [n, size, size], ok [n], marker distance [n]): one lockstep attempt at an image per label.

  ok is False where the attempt failed. The distance is between the centres of
  the two marker discs: the start of target A and the far end of A (positive) or B.
  """
  n = len(labels)
  canvas = _Canvas(geo, n, stamps)
  positive = labels.astype(bool)
  lo, hi = geo.padding, geo.size - 1 - geo.padding
  max_turn = math.radians(geo.max_turn)

  def start(slot, active, sy, sx, th, start_marker=None):
    """Places a path's first piece in the active rows; candidates [m, k] for those rows."""
    rows = np.flatnonzero(active)
    sy, sx, th = _quantize(sy, sx, th)
    marker = None if start_marker is None else start_marker[rows]
    return canvas.place(slot, rows, sy, sx, th, rng, link=False, start_marker=marker)

  def extend(slot, active, end_marker=None):
    rows = np.flatnonzero(active)
    turn = rng.uniform(-1.0, 1.0, (rows.size, _TURN_CANDIDATES))  # in units of max_turn
    prior = np.cos(0.5 * math.pi * turn) ** 2  # LRA's continuity 1.0 preference for small turns
    th = canvas.heading[slot, rows][:, None] + max_turn * turn
    sy = canvas.end[slot, 0, rows][:, None] + geo.dash_gap * np.sin(th)
    sx = canvas.end[slot, 1, rows][:, None] + geo.dash_gap * np.cos(th)
    sy, sx, th = _quantize(sy, sx, th)
    marker = None if end_marker is None else end_marker[rows]
    return canvas.place(slot, rows, sy, sx, th, rng, link=True, prior=prior, end_marker=marker)

  def random_starts(active, k=_PLACE_CANDIDATES):
    shape = (int(active.sum()), k)
    return rng.uniform(lo, hi, shape), rng.uniform(lo, hi, shape), rng.uniform(-math.pi, math.pi, shape)

  # Target A starts anywhere, with a marker in both classes; B starts seed_distance away from A's start.
  everyone = np.ones(n, bool)
  alive = start(0, everyone, *random_starts(everyone, _FIRST_CANDIDATES), start_marker=everyone)
  m = int(alive.sum())
  phi = rng.uniform(-math.pi, math.pi, (m, _PLACE_CANDIDATES))
  th = rng.uniform(-math.pi, math.pi, (m, _PLACE_CANDIDATES))
  sy = canvas.origin[0, 0, alive][:, None] + geo.seed_distance * np.sin(phi)
  sx = canvas.origin[0, 1, alive][:, None] + geo.seed_distance * np.cos(phi)
  alive &= start(1, alive, sy, sx, th)
  # Both grow a dash at a time; the far end of A (positive) or of B (negative) carries the second marker.
  # A row whose path finds no room takes its previous dash back and tries both again, a few times.
  before = [None, None]  # per target: its state before its newest dash
  for k in range(1, geo.contour_length):
    for slot, marked in ((0, positive), (1, ~positive)):
      marker = marked & (k == geo.contour_length - 1)
      snapshot = canvas.snapshot(slot)
      failed = alive & ~extend(slot, alive, marker)
      for _ in range(_BACKTRACKS if before[slot] is not None else 0):
        if not failed.any():
          break
        rows = np.flatnonzero(failed)
        canvas.restore(slot, rows, before[slot])
        again = extend(slot, failed)
        canvas.save_rows(slot, np.flatnonzero(again), snapshot)
        again &= extend(slot, again, marker)
        failed &= ~again
      alive &= ~failed
      before[slot] = snapshot
  canvas.finish(0)
  canvas.finish(1)
  far = canvas.end[np.where(positive, 0, 1), :, np.arange(n)]  # [n, (y, x)]: centre of the second marker
  distance = np.hypot(*(far - canvas.origin[0].T).T)
  # Distractors: as many as fit; one that runs into a dead end stays shorter (still a separate path).
  for _ in range(geo.num_distractors):
    growing = start(2, alive, *random_starts(alive))
    for _ in range(1, geo.distractor_length):
      growing &= extend(2, growing)
    canvas.finish(2)
  return canvas.image().copy(), alive, distance


def _too_few_message(drawn: int, attempts: int, geo: Geometry) -> str:
  return (
    f"only {drawn} of {attempts} attempts drew a usable image: two paths of {geo.contour_length} dashes "
    f"hardly fit a {geo.size}x{geo.size} image with {geo}; use shorter paths, fewer distractors or a larger size"
  )


def _draw_matched(
  geo: Geometry, num_positive: int, num_negative: int, rng: np.random.Generator, stamps: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
  """(positives [num_positive, size, size], negatives [num_negative, ...]) kept in distance-matched pairs.

  Each drawn image waits in the bin of its marker distance until an image of
  the other label lands in the same bin; the two are then kept together. The
  kept positives and negatives thus have the same histogram of marker
  distance, which removes the shortcut (in the unmatched drawing the markers of
  a negative sit further apart: one is on target B, which starts
  seed_distance away from A). Images are drawn in chunks of alternating labels.
  """
  waiting: tuple[dict[int, deque], dict[int, deque]] = ({}, {})  # per label: bin -> images without a partner
  kept: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])  # per label, in matched pairs
  pairs = max(num_positive, num_negative)
  chunk_labels = np.arange(_CHUNK) % 2
  attempts = 0
  while len(kept[1]) < pairs:
    drawn, ok, distance = _draw_chunk(geo, chunk_labels, rng, stamps)
    attempts += _CHUNK
    for i in np.flatnonzero(ok):
      label, key = int(chunk_labels[i]), int(distance[i] // _DISTANCE_BIN)
      partners = waiting[1 - label].get(key)
      if partners:
        kept[label].append(drawn[i].copy())
        kept[1 - label].append(partners.popleft())
      else:
        waiting[label].setdefault(key, deque()).append(drawn[i].copy())
    if len(kept[1]) < pairs and attempts >= _MIN_ATTEMPTS and 2 * len(kept[1]) < _MIN_SUCCESS_RATE * attempts:
      raise ValueError(_too_few_message(2 * len(kept[1]), attempts, geo))
  empty = np.zeros((0, geo.size, geo.size), np.uint8)
  negatives, positives = kept
  return (
    np.stack(positives[:num_positive]) if num_positive else empty,
    np.stack(negatives[:num_negative]) if num_negative else empty,
  )


def _rng(seed: int | Sequence[int]) -> np.random.Generator:
  parts = [seed] if isinstance(seed, int | np.integer) else seed
  if not isinstance(parts, Sequence | np.ndarray) or len(parts) == 0:
    raise ValueError(f"seed must be a non-negative integer or a sequence of them, got {seed!r}")
  return np.random.default_rng([_check_int(p, "seed", 0) for p in parts])


def generate_pathfinder(
  num_examples: int,
  *,
  seed: int | Sequence[int],
  size: int = IMAGE_SIZE,
  contour_length: int = 9,
  num_distractors: int | None = None,
  match_marker_distance: bool = True,
  **geometry: Any,
) -> tuple[np.ndarray, np.ndarray]:
  """(images uint8 [n, size, size], labels int64 [n]) of Pathfinder, the same for the same arguments.

  Args:
    num_examples: n >= 1. Exactly n // 2 labels are 1 (an odd n has one more 0), in a seeded random order.
    seed: a non-negative int or a sequence of them (numpy SeedSequence entropy).
    size: image side in pixels; the other defaults suit 32.
    contour_length: dashes per target path, >= 4 (LEVELS: easy 6, intermediate 9, hard 14).
    num_distractors: distractor paths tried per image (default 20 // distractor_length, as LRA's
      Pathfinder32); in a crowded image fewer fit.
    match_marker_distance: keep positives and negatives in pairs whose distances between the two markers
      fall in the same _DISTANCE_BIN, so that distance says nothing about the label. False draws every
      image for its label directly (as snakes2 does), and on the easy level the distance alone then
      predicts the label about 73% of the time.
    **geometry: the other fields of `Geometry` (distractor_length, dash_length, dash_gap, width,
      marker_radius, max_turn, seed_distance, padding, antialias).
  """
  n = _check_int(num_examples, "num_examples", 1)
  unknown = set(geometry) - {f.name for f in dataclasses.fields(Geometry)}
  if unknown:
    raise ValueError(f"unknown geometry parameters {sorted(unknown)}; see pathfinder.Geometry")
  geo = Geometry(size=size, contour_length=contour_length, num_distractors=num_distractors, **geometry).resolved()
  rng = _rng(seed)
  labels = np.zeros(n, np.int64)
  labels[: n // 2] = 1
  labels = rng.permutation(labels)
  images = np.zeros((n, geo.size, geo.size), np.uint8)
  stamps = _Canvas(geo, 0).stamps  # drawn once, shared by every chunk
  if match_marker_distance:
    positives, negatives = _draw_matched(geo, n // 2, n - n // 2, rng, stamps)
    images[labels == 1] = positives
    images[labels == 0] = negatives
    return images, labels
  pending = np.arange(n)
  attempts = 0
  while pending.size:
    failed = []
    for begin in range(0, pending.size, _CHUNK):
      rows = pending[begin : begin + _CHUNK]
      drawn, ok, _ = _draw_chunk(geo, labels[rows], rng, stamps)
      images[rows[ok]] = drawn[ok]
      failed.append(rows[~ok])
    attempts += pending.size
    pending = np.concatenate(failed)
    if pending.size and attempts >= _MIN_ATTEMPTS and (n - pending.size) < _MIN_SUCCESS_RATE * attempts:
      raise ValueError(_too_few_message(n - pending.size, attempts, geo))
  return images, labels


# ----------------------------------------------------------------------------- independent checker


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


# ----------------------------------------------------------------------------- inspection


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
  columns = _check_int(columns, "columns", 1)
  scale = _check_int(scale, "scale", 1)
  frame = _check_int(frame, "frame", 0)
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


# ----------------------------------------------------------------------------- input pipeline


@dataclasses.dataclass(frozen=True, eq=False)
class PathfinderSource(Sequence):
  """A split as token examples {"tokens": int32 [size * size] (pixel + 1, row-major), "label", "index"}."""

  images: np.ndarray  # [n, size, size] uint8
  labels: np.ndarray  # [n] int

  def __len__(self) -> int:
    return len(self.labels)

  def __getitem__(self, i):  # integer indices only, as pipeline.Subset
    if isinstance(i, slice):
      raise TypeError("PathfinderSource supports integer indices only")
    i = int(i)
    tokens = self.images[i].reshape(-1).astype(np.int32) + 1
    return {"tokens": tokens, "label": int(self.labels[i]), "index": i}


def split_cache_path(cache_dir: str | Path, split: str, num_examples: int, seed: int, geometry: Geometry) -> Path:
  """`<cache_dir>/pathfinder/<hash>.npz`, the hash over everything that fixes the split's images."""
  key = {
    "version": GENERATOR_VERSION,
    "split": split,
    "num_examples": num_examples,
    "seed": seed,
    "geometry": dataclasses.asdict(geometry),
  }
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
  return Path(cache_dir) / "pathfinder" / f"{digest}.npz"


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


def load_or_generate_split(
  split: str,
  num_examples: int,
  *,
  seed: int,
  difficulty: str = DEFAULT_DIFFICULTY,
  cache_dir: str | Path | None = None,
  contour_length: int | None = None,
  num_distractors: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """(images, labels) of one split, generated once per parameter set and then read from the cache.

  Each split draws from its own stream (seed, PATHFINDER_STREAM, split id), so
  changing one split's size leaves the others' images alone. A cache file that
  does not read back as expected is regenerated, with a warning. The geometry
  is `level_geometry(difficulty, contour_length=..., num_distractors=...)`.
  """
  from primal_jax.data.aeon_wheel import default_cache_dir

  if split not in _SPLIT_IDS:
    raise ValueError(f"split must be one of {', '.join(_SPLIT_IDS)}, got {split!r}")
  geo = level_geometry(difficulty, contour_length=contour_length, num_distractors=num_distractors)
  path = split_cache_path(default_cache_dir() if cache_dir is None else cache_dir, split, num_examples, seed, geo)
  if path.exists():
    try:
      with np.load(path) as data:
        images, labels = data["images"], data["labels"]
      if (
        images.shape == (num_examples, geo.size, geo.size)
        and images.dtype == np.uint8
        and labels.shape == (num_examples,)
      ):
        return images, labels
      warnings.warn(f"{path} holds arrays of unexpected shapes; regenerating it", stacklevel=2)
    except Exception as e:  # any unreadable cache file is regenerated
      warnings.warn(f"could not read {path} ({e!r}); regenerating it", stacklevel=2)
  images, labels = generate_pathfinder(
    num_examples, seed=(seed, PATHFINDER_STREAM, _SPLIT_IDS[split]), **dataclasses.asdict(geo)
  )
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".npz")
  try:
    with os.fdopen(fd, "wb") as f:
      np.savez_compressed(f, images=images, labels=labels)
    os.replace(tmp, path)  # readers never see half a file; concurrent writers write the same bytes
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise
  return images, labels


def make_pathfinder_pipeline(data_config: Any, *, process_index: int = 0, process_count: int = 1):
  """The InputPipeline of LRA Pathfinder-32: 1,024 pixel tokens per image, classes ("disconnected", "connected").

  Reads from `data_config` (attributes, or keys of a mapping): batch_size,
  eval_batch_size, seed (the epoch orders), data_seed (the images; default
  `seed`), difficulty ("easy" | "intermediate" | "hard", default "hard", LRA's
  column), contour_length (dashes per target path; 0 or absent: the level's)
  and num_distractors (-1 or absent: the level's default), num_train /
  num_validation / num_test (defaults 160,000 / 20,000 /
  20,000, LRA's 80/10/10 split of 200,000 images; 0 leaves a validation or
  test split out), data_dir (cache root; default `aeon_wheel.default_cache_dir()`),
  and seq_len if present, which must be 0 or 1,024. Every host generates (or
  reads) the same splits; with a shared cache, the first writer's file is read
  by the rest (the train loop lets process 0 go first).
  """
  from primal_jax.data import pipeline
  from primal_jax.data.token_tasks import token_pipeline  # needs grain; generation and the checker do not

  get = data_config.get if isinstance(data_config, Mapping) else lambda k, d=None: getattr(data_config, k, d)
  for key in ("batch_size", "eval_batch_size", "seed"):
    if get(key) is None:
      raise ValueError(f"data_config has no {key!r}; Pathfinder needs batch_size, eval_batch_size and seed")
  seed = pipeline.check_nonnegative_int(get("seed"), "seed")
  data_seed = seed if get("data_seed") is None else pipeline.check_nonnegative_int(get("data_seed"), "data_seed")
  difficulty = get("difficulty", DEFAULT_DIFFICULTY)
  contour_length, num_distractors = get("contour_length", 0), get("num_distractors", -1)
  overrides = {
    "contour_length": None if contour_length in (0, None) else contour_length,
    "num_distractors": None if num_distractors in (-1, None) else num_distractors,
  }
  level_geometry(difficulty, **overrides)  # a bad level or override fails here, before any drawing
  seq_len = IMAGE_SIZE * IMAGE_SIZE
  if get("seq_len", 0) not in (0, None, seq_len):
    raise ValueError(
      f"Pathfinder-32 has {seq_len} tokens per image; seq_len must be 0 or {seq_len}, got {get('seq_len')!r}"
    )
  sizes = {split: get(f"num_{split}", default) for split, default in DEFAULT_SPLIT_SIZES.items()}
  pipeline.check_positive_int(sizes["train"], "num_train")
  for split in ("validation", "test"):
    pipeline.check_nonnegative_int(sizes[split], f"num_{split}")
  splits = {
    split: PathfinderSource(
      *load_or_generate_split(
        split, int(n), seed=data_seed, difficulty=difficulty, cache_dir=get("data_dir"), **overrides
      )
    )
    for split, n in sizes.items()
    if n > 0
  }
  return token_pipeline(
    "pathfinder",
    splits,
    CLASS_NAMES,
    VOCAB_SIZE,
    data_config,
    seq_len=seq_len,
    process_index=process_index,
    process_count=process_count,
  )


def main(argv: Sequence[str] | None = None) -> None:
  """`python -m primal_jax.data.pathfinder OUT_DIR`: sample PNGs of every level and the drawing speed."""
  parser = argparse.ArgumentParser(description=main.__doc__)
  parser.add_argument("out_dir", type=Path)
  parser.add_argument("--num", type=int, default=32, help="samples per level in the PNGs")
  parser.add_argument("--speed", type=int, default=2048, help="images per level to time (0: skip)")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  for level, path in write_level_samples(args.out_dir, num_per_level=args.num, seed=args.seed).items():
    print(f"{level}: {path}")
  for level, length in LEVELS.items():
    if args.speed:
      begin = time.perf_counter()
      generate_pathfinder(args.speed, seed=args.seed, contour_length=length)
      elapsed = time.perf_counter() - begin
      print(f"{level} ({LEVEL_DIRECTORIES[level]}): {args.speed / elapsed:.0f} images/s")


if __name__ == "__main__":
  main()
