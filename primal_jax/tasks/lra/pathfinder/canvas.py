"""The renderer: lockstep drawing of dashes and markers into a chunk of images (`Canvas`).

Dashes are drawn with antialiasing by default: a pixel's intensity falls
linearly from full to zero over the pixel beyond the stroke's half-width,
then the canvas is quantised to uint8. Start points and headings are
quantised (`quantize`) so that a plain dash is looked up from a table of
pre-drawn stamps rather than drawn anew. `generate` decides what to draw;
this module only draws, validates and rolls back pieces.
"""

from __future__ import annotations

import math

import numpy as np

from primal_jax.tasks.lra.pathfinder.geometry import MARKER_VALUE, PATH_VALUE, Geometry

_LOOKAHEAD = 3.0  # pixels beyond a candidate dash's end where its free room is measured
_ROOM = 4  # half-side of that box
_ROOM_POWER = 8  # how strongly free room steers the choice among valid candidates
_SUBPIXEL = 8  # start points lie on a 1/8-pixel grid ...
_ANGLES = 256  # ... and headings on a 360/256-degree one, so plain dashes come from a table


def _dilate(mask: np.ndarray) -> np.ndarray:
  """3x3 binary dilation of [..., h, w] (pixels equal or 8-adjacent to a True pixel); edges count as False."""
  padded = np.pad(mask, [(0, 0)] * (mask.ndim - 2) + [(1, 1), (1, 1)])
  h, w = mask.shape[-2:]
  out = np.zeros_like(mask)
  for dy in range(3):
    for dx in range(3):
      out |= padded[..., dy : dy + h, dx : dx + w]
  return out


def quantize(sy: np.ndarray, sx: np.ndarray, th: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Start points moved to the centres of their 1/_SUBPIXEL-pixel cells, headings to multiples of 2 pi / _ANGLES.

  On this grid a plain dash is one of _SUBPIXEL**2 * _ANGLES pictures, drawn
  once per call of `generate_pathfinder` and then only looked up.
  """
  q = _SUBPIXEL
  step = 2 * math.pi / _ANGLES
  return (np.floor(sy * q) + 0.5) / q, (np.floor(sx * q) + 0.5) / q, np.rint(th / step) * step


class Canvas:
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
