"""Tests of primal_jax.tasks.lra.pathfinder: the generator, its independent checker, the sample PNGs and the pipeline.

The central test draws a few hundred images of every difficulty and asks the
flood-fill checker, which sees only pixels, whether the two markers it finds
are connected: that must equal the label on every image, so the label is
decidable from what the model sees. Pipeline tests use small splits in a
temporary cache (PRIMAL_JAX_DATA), never the user's.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

from primal_jax.tasks.lra import pathfinder as pf
from primal_jax.tasks.lra.pathfinder import input_pipeline as pf_input_pipeline

PER_LEVEL = 240


@pytest.fixture(scope="module")
def samples():
  """level -> (images, labels), PER_LEVEL each."""
  return {
    level: pf.generate_pathfinder(PER_LEVEL, seed=1000 + i, contour_length=length)
    for i, (level, length) in enumerate(pf.LEVELS.items())
  }


@pytest.fixture
def cache(monkeypatch, tmp_path):
  monkeypatch.setenv("PRIMAL_JAX_DATA", str(tmp_path))
  return tmp_path


def make_config(**overrides):
  values = dict(
    task="pathfinder",
    batch_size=16,
    eval_batch_size=24,
    seed=0,
    difficulty="easy",
    num_train=40,
    num_validation=8,
    num_test=12,
  )
  values.update(overrides)
  return types.SimpleNamespace(**values)


# ----------------------------------------------------------------------------- generator


@pytest.mark.parametrize("level", list(pf.LEVELS))
def test_markers_connected_iff_label_on_every_image(samples, level):
  images, labels = samples[level]
  for i, (image, label) in enumerate(zip(images, labels, strict=True)):
    assert len(pf.find_markers(image)) == 2, f"{level} image {i}"
    assert pf.markers_connected(image) == bool(label), f"{level} image {i}, label {label}"


def _steps_between(image, a, b):
  """Fewest 8-neighbour steps from pixel a to pixel b through nonzero pixels (-1 if none)."""
  foreground = image > 0
  dist = np.full(image.shape, -1)
  dist[tuple(a)] = 0
  frontier = [tuple(a)]
  while frontier and dist[tuple(b)] < 0:
    nxt = []
    for y, x in frontier:
      for ny in range(max(y - 1, 0), min(y + 2, image.shape[0])):
        for nx in range(max(x - 1, 0), min(x + 2, image.shape[1])):
          if foreground[ny, nx] and dist[ny, nx] < 0:
            dist[ny, nx] = dist[y, x] + 1
            nxt.append((ny, nx))
    frontier = nxt
  return dist[tuple(b)]


@pytest.mark.parametrize("level", list(pf.LEVELS))
def test_marked_path_is_contour_length_dashes_long(samples, level):
  """Along a positive's path the markers are about 3 px (dash + gap) per dash apart, more than a Chebyshev step each."""
  length = pf.LEVELS[level]
  images, labels = samples[level]
  steps = [_steps_between(image, *pf.find_markers(image)) for image in images[labels == 1]]
  assert 1.5 * length <= min(steps) and max(steps) <= 3 * length, (level, min(steps), max(steps))


def test_without_antialiasing_labels_are_decidable_too():
  images, labels = pf.generate_pathfinder(120, seed=5, contour_length=9, antialias=False)
  assert set(np.unique(images)) <= {0, pf.PATH_VALUE, pf.MARKER_VALUE}
  assert [pf.markers_connected(im) for im in images] == labels.astype(bool).tolist()


@pytest.mark.parametrize("n", [240, 7, 1])
def test_labels_are_balanced(samples, n):
  labels = samples["hard"][1] if n == PER_LEVEL else pf.generate_pathfinder(n, seed=3, contour_length=6)[1]
  assert labels.dtype == np.int64 and set(np.unique(labels)) <= {0, 1}
  assert labels.sum() == n // 2
  if n == PER_LEVEL:  # shuffled, not sorted by class
    assert 0 < np.flatnonzero(np.diff(labels)).size


def test_value_range_and_shapes(samples):
  for level, (images, labels) in samples.items():
    assert images.shape == (PER_LEVEL, 32, 32) and images.dtype == np.uint8, level
    assert labels.shape == (PER_LEVEL,)
    assert (images.reshape(PER_LEVEL, -1).max(axis=1) == pf.MARKER_VALUE).all()  # every image has markers
    assert (images == pf.PATH_VALUE).any()
    assert (images[:, 0, :] == 0).all() and (images[:, :, -1] == 0).all()  # padding=1 keeps the border empty
    coverage = (images > 0).mean()
    assert 0.1 < coverage < 0.45, (level, coverage)


def _distance_threshold_accuracy(images, labels):
  """Best accuracy of any threshold on the distance between the two markers found in the pixels."""
  distance = np.array([np.hypot(*np.subtract(*pf.find_markers(image).astype(float))) for image in images])
  order = np.argsort(distance, kind="stable")
  y = labels[order]
  # predict "connected" for the k nearest pairs, k = 0..n; either direction of the threshold
  correct = np.concatenate([[0], np.cumsum(y)]) + np.concatenate([[(1 - y).sum()], (1 - y).sum() - np.cumsum(1 - y)])
  accuracy = correct / len(y)
  return max(accuracy.max(), 1 - accuracy.min())


def test_marker_distance_does_not_give_the_label_away():
  # 2,048 easy images: a threshold fitted on the same set reaches ~0.5 + 3 / sqrt(n) by chance alone.
  # Drawn without matching, the markers of a negative sit further apart and the distance gives ~0.73.
  matched = pf.generate_pathfinder(2048, seed=5, contour_length=pf.LEVELS["easy"])
  raw = pf.generate_pathfinder(2048, seed=5, contour_length=pf.LEVELS["easy"], match_marker_distance=False)
  assert _distance_threshold_accuracy(*matched) < 0.56
  assert _distance_threshold_accuracy(*raw) > 0.66
  assert matched[1].sum() == 1024
  for image, label in zip(matched[0][:64], matched[1][:64], strict=True):
    assert pf.markers_connected(image) == bool(label)


def test_longer_paths_cover_more_of_the_image(samples):
  cover = {level: (images > 0).mean() for level, (images, _) in samples.items()}
  assert cover["easy"] < cover["hard"]


def test_deterministic_and_seed_dependent():
  a = pf.generate_pathfinder(24, seed=7, contour_length=9)
  b = pf.generate_pathfinder(24, seed=7, contour_length=9)
  c = pf.generate_pathfinder(24, seed=8, contour_length=9)
  d = pf.generate_pathfinder(24, seed=(7, 1), contour_length=9)
  np.testing.assert_array_equal(a[0], b[0])
  np.testing.assert_array_equal(a[1], b[1])
  assert not np.array_equal(a[0], c[0]) and not np.array_equal(a[0], d[0])
  assert not np.array_equal(a[0][0], a[0][1])  # images of one call differ too


def test_geometry_parameters_reach_the_drawing():
  thin = pf.generate_pathfinder(8, seed=2, contour_length=6, num_distractors=0)[0]
  busy = pf.generate_pathfinder(8, seed=2, contour_length=6, num_distractors=20)[0]
  assert (thin > 0).sum() < (busy > 0).sum()
  assert pf.Geometry(contour_length=14).resolved().num_distractors == 5  # 20 // (14 // 3), LRA's Pathfinder32
  assert pf.Geometry(contour_length=6).resolved().distractor_length == 2


@pytest.mark.parametrize(
  ("kwargs", "match"),
  [
    (dict(contour_length=3), "contour_length"),
    (dict(width=0.2), "too thin"),
    (dict(width=1.4, antialias=False), "too thin"),
    (dict(marker_radius=0.1), "marker_radius"),
    (dict(max_turn=200), "max_turn"),
    (dict(dash_length=-1.0), "dash_length"),
    (dict(padding=14), "padding"),
    (dict(curviness=1.0), "unknown geometry"),
  ],
)
def test_bad_parameters_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    pf.generate_pathfinder(4, seed=0, **kwargs)


@pytest.mark.parametrize("seed", [-1, 1.5, True, (), (1, -2), "7"])
def test_bad_seed_raises(seed):
  with pytest.raises(ValueError, match="seed"):
    pf.generate_pathfinder(4, seed=seed)


def test_bad_count_raises():
  with pytest.raises(ValueError, match="num_examples"):
    pf.generate_pathfinder(0, seed=0)


# ----------------------------------------------------------------------------- checker on hand-made images


def test_checker_follows_pixels_not_labels():
  image = np.zeros((12, 12), np.uint8)
  image[2, 2] = image[9, 9] = 255  # markers
  image[np.arange(3, 9), np.arange(3, 9)] = 100  # a diagonal stroke joins them (8-connectivity)
  assert pf.find_markers(image).tolist() == [[2, 2], [9, 9]]
  assert pf.markers_connected(image)
  image[5, 5] = 0  # one zero pixel cuts it
  assert not pf.markers_connected(image)
  image[5, 5] = 1
  assert pf.markers_connected(image)
  assert not pf.markers_connected(image, threshold=1)  # a dim pixel below the threshold cuts it too
  assert pf.markers_connected(image, [[2, 2], [9.2, 8.8]])


def test_checker_errors():
  image = np.zeros((8, 8), np.uint8)
  image[1, 1] = 255
  with pytest.raises(ValueError, match="exactly two markers"):
    pf.markers_connected(image)
  with pytest.raises(ValueError, match="not a foreground pixel"):
    pf.markers_connected(image, [[1, 1], [5, 5]])
  with pytest.raises(ValueError, match="2-D"):
    pf.markers_connected(image[None])


# ----------------------------------------------------------------------------- PNG


def test_png_grid_written_and_readable(samples, tmp_path):
  from PIL import Image

  images, labels = samples["hard"]
  path = pf.write_samples_png(images[:10], labels[:10], tmp_path / "sub" / "grid.png", columns=4, scale=3, frame=2)
  with Image.open(path) as png:
    grid = np.asarray(png.convert("RGB"))
  cell = 32 * 3 + 2 * 2
  assert grid.shape == (3 * cell, 4 * cell, 3)
  for i in range(10):  # frame colour says the label; the inside is the image, enlarged
    top, left = (i // 4) * cell, (i % 4) * cell
    assert tuple(grid[top, left]) == ((40, 200, 40) if labels[i] else (220, 40, 40))
    np.testing.assert_array_equal(grid[top + 2 : top + cell - 2 : 3, left + 2 : left + cell - 2 : 3, 0], images[i])


def test_level_samples_written(tmp_path):
  paths = pf.write_level_samples(tmp_path, num_per_level=4, seed=1)
  assert sorted(paths) == sorted(pf.LEVELS)
  assert all(p.exists() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths.values())


def test_png_bad_input_raises(tmp_path):
  with pytest.raises(ValueError, match="uint8"):
    pf.write_samples_png(np.zeros((2, 4, 4), np.float32), np.zeros(2), tmp_path / "x.png")
  with pytest.raises(ValueError, match="labels"):
    pf.write_samples_png(np.zeros((2, 4, 4), np.uint8), np.zeros(3), tmp_path / "x.png")


# ----------------------------------------------------------------------------- pipeline


def test_pipeline_batches(cache):
  from primal_jax.data import registry

  config = make_config()
  p = registry.get_input_pipeline(config)
  info = p.info
  assert info.name == "pathfinder" and info.vocab_size == 257 and info.seq_len == 1024 and info.num_classes == 2
  assert info.class_names == ("disconnected", "connected")
  assert dict(info.split_sizes) == {"train": 40, "validation": 8, "test": 12}
  assert p.steps_per_epoch == 3

  images, labels = pf.load_or_generate_split("train", 40, seed=0, difficulty="easy")
  for epoch in range(2):
    seen = []
    for batch in p.train_batches(epoch):
      assert batch["inputs"].shape == (16, 1024) and batch["inputs"].dtype == np.int32
      real = batch["index"] >= 0
      assert batch["mask"].shape == (16, 1024) and batch["mask"][real].all()  # padding rows: only position 0
      assert batch["inputs"][real].min() >= 1 and batch["inputs"][real].max() <= 256
      np.testing.assert_array_equal(
        batch["inputs"][real], images[batch["index"][real]].reshape(-1, 1024).astype(np.int32) + 1
      )
      np.testing.assert_array_equal(batch["label"][real], labels[batch["index"][real]])
      np.testing.assert_array_equal(batch["weight"], real.astype(np.float32))
      seen.extend(batch["index"][real].tolist())
    assert sorted(seen) == list(range(40))  # every training image exactly once per epoch
  for split, n in (("validation", 8), ("test", 12)):
    indices = np.concatenate([b["index"] for b in p.eval_batches(split)])
    assert sorted(indices[indices >= 0].tolist()) == list(range(n))


def test_pipeline_caches_splits(cache, monkeypatch):
  first = pf.make_pathfinder_pipeline(make_config())
  files = sorted((cache / "pathfinder").glob("*.npz"))
  assert len(files) == 3

  def refuse(*args, **kwargs):
    raise AssertionError("a cached split was generated again")

  monkeypatch.setattr(pf_input_pipeline, "generate_pathfinder", refuse)
  again = pf.make_pathfinder_pipeline(make_config(seed=5, data_seed=0))  # another epoch order, same images
  for split in ("train", "validation", "test"):
    np.testing.assert_array_equal(first.sources[split].images, again.sources[split].images)


def test_splits_independent_and_seeded(cache):
  base = pf.make_pathfinder_pipeline(make_config())
  bigger = pf.make_pathfinder_pipeline(make_config(num_train=48))
  other = pf.make_pathfinder_pipeline(make_config(seed=1))
  np.testing.assert_array_equal(base.sources["test"].images, bigger.sources["test"].images)
  assert not np.array_equal(base.sources["test"].images, other.sources["test"].images)
  assert not np.array_equal(base.sources["train"].images[:8], base.sources["validation"].images)


def test_corrupt_cache_is_regenerated(cache):
  images, labels = pf.load_or_generate_split("test", 6, seed=0, difficulty="easy")
  (path,) = (cache / "pathfinder").glob("*.npz")
  path.write_bytes(b"not a zip")
  with pytest.warns(UserWarning, match="regenerating"):
    again, _ = pf.load_or_generate_split("test", 6, seed=0, difficulty="easy")
  np.testing.assert_array_equal(images, again)


def test_split_left_out_and_defaults(cache, monkeypatch):
  p = pf.make_pathfinder_pipeline(make_config(num_validation=0))
  assert set(p.sources) == {"train", "test"}

  calls = []

  def fake(split, n, *, seed, difficulty, cache_dir, contour_length, num_distractors):
    calls.append((split, n, difficulty, contour_length, num_distractors))
    return np.zeros((4, 32, 32), np.uint8), np.array([0, 1, 0, 1])

  monkeypatch.setattr(pf_input_pipeline, "load_or_generate_split", fake)
  config = make_config()
  for key in ("difficulty", "num_train", "num_validation", "num_test"):
    delattr(config, key)
  pf.make_pathfinder_pipeline(config)
  sizes = (("train", 160_000), ("validation", 20_000), ("test", 20_000))
  assert calls == [(split, n, "hard", None, None) for split, n in sizes]


def test_geometry_overrides_reach_the_pipeline(cache):
  """contour_length / num_distractors replace the level's; 0 / -1 keep it (the LRA config's placeholders)."""
  from scipy import ndimage

  def components(images):  # 8-connected groups of nonzero pixels per image: one per path
    return [ndimage.label(im > 0, structure=np.ones((3, 3)))[1] for im in images]

  plain = pf.make_pathfinder_pipeline(make_config(num_train=24, contour_length=0, num_distractors=-1))
  default = pf.make_pathfinder_pipeline(make_config(num_train=24))
  np.testing.assert_array_equal(plain.sources["train"].images, default.sources["train"].images)
  assert min(components(default.sources["train"].images)) > 2  # the easy level has distractors

  bare = pf.make_pathfinder_pipeline(make_config(num_train=24, contour_length=4, num_distractors=0))
  images, labels = bare.sources["train"].images, bare.sources["train"].labels
  assert components(images) == [2] * 24  # the two target paths and nothing else
  assert [pf.markers_connected(im) for im in images] == [bool(y) for y in labels]
  assert pf.level_geometry("easy", contour_length=4, num_distractors=0).distractor_length == 1
  again, _ = pf.load_or_generate_split("train", 24, seed=0, difficulty="easy", contour_length=4, num_distractors=0)
  np.testing.assert_array_equal(images, again)  # read back from its own cache file
  assert len(list((cache / "pathfinder").glob("*.npz"))) == 6  # 3 splits x 2 geometries


@pytest.mark.parametrize(
  ("overrides", "match"),
  [
    (dict(difficulty="medium"), "difficulty"),
    (dict(seq_len=2000), "seq_len"),
    (dict(num_train=0), "num_train"),
    (dict(num_test=-1), "num_test"),
    (dict(batch_size=None), "batch_size"),
    (dict(contour_length=2), "contour_length must be an integer >= 4, got 2"),
    (dict(num_distractors=-2), "num_distractors must be an integer >= 0, got -2"),
    (dict(contour_length=4.5), "contour_length must be an integer"),
  ],
)
def test_pipeline_config_errors(cache, overrides, match):
  with pytest.raises(ValueError, match=match):
    pf.make_pathfinder_pipeline(make_config(**overrides))
