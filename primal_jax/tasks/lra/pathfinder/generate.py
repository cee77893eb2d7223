"""The Pathfinder generator: which paths to draw, with which labels, and the distance-matched pairing.

Drawing is vectorised over chunks of images in lockstep (every image draws its
n-th dash at the same time), choosing among random candidate dashes; choices
are steered towards free room ahead, a target path that runs into a dead end
takes back its previous dash a few times, and an image that still fails is
redrawn in a later round, with the same label. Roughly 1,000 (easy) to 650
(hard) images/s on one CPU core.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from primal_jax.data.checks import check_int_at_least
from primal_jax.tasks.lra.pathfinder.canvas import Canvas, quantize
from primal_jax.tasks.lra.pathfinder.geometry import IMAGE_SIZE, Geometry

# Bumped whenever the drawing changes, so cached splits of an older drawing are never reused.
GENERATOR_VERSION = 2  # 2: positives and negatives matched in marker distance
# Images drawn together in lockstep; part of what fixes the output for a seed, so it is a constant.
_CHUNK = 1024
_TURN_CANDIDATES = 16  # random turning angles tried for every dash
_PLACE_CANDIDATES = 48  # random positions tried for the first dash of a path ...
_FIRST_CANDIDATES = 8  # ... but the first path of an image has the whole image to itself
_BACKTRACKS = 3  # times a target path may take back a dash after a dead end
_MIN_ATTEMPTS, _MIN_SUCCESS_RATE = 2048, 0.01  # below this rate of drawn images, give up
_DISTANCE_BIN = 0.5  # pixels; positives and negatives are paired within a bin of marker distance


def _draw_chunk(
  geo: Geometry, labels: np.ndarray, rng: np.random.Generator, stamps: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(images uint8 [n, size, size], ok [n], marker distance [n]): one lockstep attempt at an image per label.

  ok is False where the attempt failed. The distance is between the centres of
  the two marker discs: the start of target A and the far end of A (positive) or B.
  """
  n = len(labels)
  canvas = Canvas(geo, n, stamps)
  positive = labels.astype(bool)
  lo, hi = geo.padding, geo.size - 1 - geo.padding
  max_turn = math.radians(geo.max_turn)

  def start(slot, active, sy, sx, th, start_marker=None):
    """Places a path's first piece in the active rows; candidates [m, k] for those rows."""
    rows = np.flatnonzero(active)
    sy, sx, th = quantize(sy, sx, th)
    marker = None if start_marker is None else start_marker[rows]
    return canvas.place(slot, rows, sy, sx, th, rng, link=False, start_marker=marker)

  def extend(slot, active, end_marker=None):
    rows = np.flatnonzero(active)
    turn = rng.uniform(-1.0, 1.0, (rows.size, _TURN_CANDIDATES))  # in units of max_turn
    prior = np.cos(0.5 * math.pi * turn) ** 2  # LRA's continuity 1.0 preference for small turns
    th = canvas.heading[slot, rows][:, None] + max_turn * turn
    sy = canvas.end[slot, 0, rows][:, None] + geo.dash_gap * np.sin(th)
    sx = canvas.end[slot, 1, rows][:, None] + geo.dash_gap * np.cos(th)
    sy, sx, th = quantize(sy, sx, th)
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
  return np.random.default_rng([check_int_at_least(p, "seed", 0) for p in parts])


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
  n = check_int_at_least(num_examples, "num_examples", 1)
  unknown = set(geometry) - {f.name for f in dataclasses.fields(Geometry)}
  if unknown:
    raise ValueError(f"unknown geometry parameters {sorted(unknown)}; see pathfinder.Geometry")
  geo = Geometry(size=size, contour_length=contour_length, num_distractors=num_distractors, **geometry).resolved()
  rng = _rng(seed)
  labels = np.zeros(n, np.int64)
  labels[: n // 2] = 1
  labels = rng.permutation(labels)
  images = np.zeros((n, geo.size, geo.size), np.uint8)
  stamps = Canvas(geo, 0).stamps  # drawn once, shared by every chunk
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
