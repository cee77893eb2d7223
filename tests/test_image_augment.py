"""DeiT's per-image augmentations (primal_jax.tasks.vision.augment) and their place in the pipeline (core.Augmented).

Checked: shapes and dtype kept, determinism by (seed, epoch, index), identity when switched off, each
operation against a direct NumPy/Pillow computation of what it should do, the box samplers' ranges, and
that evaluation batches are never augmented.
"""

from __future__ import annotations

import ml_collections
import numpy as np
import pytest
from PIL import Image

from primal_jax.data.core import Augmented
from primal_jax.tasks.vision.augment import ImageAugment, crop_box, erase_box, image_augment
from primal_jax.tasks.vision.input_pipeline import ImageArrays, make_image_pipeline


def _example(shape=(12, 16, 3), seed=0):
  return {"image": np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8), "label": 1, "index": 0}


def test_off_is_identity_and_none():
  assert image_augment(None) is None and image_augment({}) is None
  assert image_augment({"flip_prob": 0.0, "erase_prob": 0.0, "random_resized_crop": False}) is None
  example = _example()
  out = ImageAugment()(example, np.random.default_rng(0))
  np.testing.assert_array_equal(out["image"], example["image"])
  assert out["label"] == 1


@pytest.mark.parametrize("shape", [(12, 16, 3), (9, 9, 1)])
def test_shapes_dtype_and_determinism(shape):
  augment = ImageAugment(random_resized_crop=True, flip_prob=0.5, erase_prob=0.5)
  images = np.random.default_rng(1).integers(0, 256, (6, *shape), dtype=np.uint8)
  source = ImageArrays(images, np.arange(6))
  first, again = Augmented(source, augment, seed=3, epoch=2), Augmented(source, augment, seed=3, epoch=2)
  other_epoch, other_seed = Augmented(source, augment, 3, 5), Augmented(source, augment, 4, 2)
  for i in range(6):
    out = first[i]["image"]
    assert out.shape == shape and out.dtype == np.uint8
    np.testing.assert_array_equal(out, again[i]["image"])  # an example's augmentation depends on (seed, epoch, i)
  differs = [not np.array_equal(first[i]["image"], other_epoch[i]["image"]) for i in range(6)]
  assert sum(differs) >= 4
  assert any(not np.array_equal(first[i]["image"], other_seed[i]["image"]) for i in range(6))


def test_flip():
  example = _example()
  np.testing.assert_array_equal(
    ImageAugment(flip_prob=1.0)(example, np.random.default_rng(0))["image"], example["image"][:, ::-1]
  )
  flips = [
    np.array_equal(ImageAugment(flip_prob=0.5)(example, np.random.default_rng(s))["image"], example["image"][:, ::-1])
    for s in range(400)
  ]
  assert 160 <= sum(flips) <= 240


def test_random_resized_crop_is_the_sampled_box_resized():
  example = _example()
  augment = ImageAugment(random_resized_crop=True)
  out = augment(example, np.random.default_rng(7))["image"]
  top, left, h, w = crop_box(12, 16, augment.crop_scale, augment.crop_ratio, np.random.default_rng(7))
  crop = Image.fromarray(example["image"][top : top + h, left : left + w])
  np.testing.assert_array_equal(out, np.asarray(crop.resize((16, 12), Image.Resampling.BICUBIC)))
  # The whole image at scale 1 and its own aspect ratio: unchanged.
  whole = ImageAugment(random_resized_crop=True, crop_scale=(1.0, 1.0), crop_ratio=(4 / 3, 4 / 3))
  np.testing.assert_array_equal(whole(example, np.random.default_rng(0))["image"], example["image"])


def test_crop_box_ranges_and_fallback():
  rng = np.random.default_rng(0)
  for _ in range(500):
    top, left, h, w = crop_box(224, 224, (0.08, 1.0), (3 / 4, 4 / 3), rng)
    assert 0 <= top <= 224 - h and 0 <= left <= 224 - w
    assert 0.08 * 0.9 <= h * w / 224**2 <= 1.0 and 3 / 4 * 0.9 <= w / h <= 4 / 3 * 1.1
  # Impossible scale (area > image): the central crop of the nearest allowed ratio (torchvision's fallback).
  assert crop_box(10, 40, (2.0, 2.0), (3 / 4, 4 / 3), rng) == (0, 13, 10, 13)
  assert crop_box(20, 20, (2.0, 2.0), (3 / 4, 4 / 3), rng) == (0, 0, 20, 20)


def test_random_erasing_changes_one_rectangle():
  example = _example((20, 20, 3))
  augment = ImageAugment(erase_prob=1.0)
  out = augment(example, np.random.default_rng(5))["image"]
  changed = np.any(out != example["image"], axis=-1)
  rows, cols = np.nonzero(changed)
  assert rows.size > 0
  box = changed[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
  assert box.mean() > 0.9  # a filled rectangle (a noise pixel may equal the original by chance)
  area = box.size / 400
  assert 0.02 * 0.7 <= area <= 1 / 3 * 1.3
  assert erase_box(20, 20, (2.0, 2.0), (1.0, 1.0), np.random.default_rng(0)) is None


def test_bad_options():
  with pytest.raises(ValueError, match="unknown keys"):
    image_augment({"mixup": 0.8})
  with pytest.raises(ValueError, match="flip_prob"):
    ImageAugment(flip_prob=1.5)
  with pytest.raises(ValueError, match="crop_scale"):
    ImageAugment(crop_scale=(0.9, 0.1))


def test_pipeline_augments_training_batches_only(tmp_path):
  from PIL import Image as PILImage

  rng = np.random.default_rng(0)
  for split in ("train", "test"):
    for c in ("a", "b"):
      (tmp_path / split / c).mkdir(parents=True)
      for i in range(4):
        PILImage.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(tmp_path / split / c / f"{i}.png")

  def pipeline(augment):
    data = dict(task="images", dataset="image_folder", source=str(tmp_path), image_size=8, batch_size=4,
                eval_batch_size=4, seed=0, val_fraction=0.0, augment=augment)  # fmt: skip
    return make_image_pipeline(ml_collections.ConfigDict(data))

  plain, augmented = pipeline({}), pipeline({"flip_prob": 1.0})
  assert plain.augment is None
  for a, b in zip(plain.train_batches(0), augmented.train_batches(0), strict=True):
    np.testing.assert_array_equal(a["index"], b["index"])
    np.testing.assert_array_equal(b["inputs"], a["inputs"][:, :, ::-1])
  for a, b in zip(plain.eval_batches("test"), augmented.eval_batches("test"), strict=True):
    np.testing.assert_array_equal(a["inputs"], b["inputs"])
  assert next(iter(augmented.train_batches(1)))["inputs"].shape == (4, 8, 8, 3)


# --- RandAugment --------------------------------------------------------------------------------------------------


def test_rand_augment_level_arguments_follow_timm():
  from primal_jax.tasks.vision.rand_augment import level_argument

  rng = np.random.default_rng(0)
  assert abs(level_argument("Rotate", 10.0, rng)) == pytest.approx(30.0)
  assert abs(level_argument("ShearX", 5.0, rng)) == pytest.approx(0.15)
  assert abs(level_argument("TranslateYRel", 10.0, rng)) == pytest.approx(0.45)
  assert abs(level_argument("ContrastIncreasing", 9.0, rng) - 1.0) == pytest.approx(0.81)
  assert level_argument("PosterizeIncreasing", 9.0, rng) == 1  # 4 - int(3.6)
  assert level_argument("SolarizeIncreasing", 9.0, rng) == 26  # 256 - int(230.4)
  assert level_argument("SolarizeAdd", 9.0, rng) == 99
  signs = {np.sign(level_argument("Rotate", 9.0, np.random.default_rng(s))) for s in range(20)}
  assert signs == {-1.0, 1.0}


@pytest.mark.parametrize("channels", [1, 3])
def test_every_rand_augment_op_keeps_shape(channels):
  from primal_jax.tasks.vision.rand_augment import IMAGENET_FILL, OPS, apply_op, level_argument

  image = np.random.default_rng(2).integers(0, 256, (10, 12, channels), dtype=np.uint8)
  pil = Image.fromarray(image[..., 0] if channels == 1 else image)
  fill = 115 if channels == 1 else IMAGENET_FILL
  for op in OPS:
    out = np.asarray(apply_op(pil, op, level_argument(op, 9.0, np.random.default_rng(0)), fill))
    assert out.shape == image.shape[:2] + ((channels,) if channels == 3 else ()) and out.dtype == np.uint8, op


def test_rand_augment_ops_against_direct_formulas():
  from primal_jax.tasks.vision.rand_augment import apply_op

  image = np.arange(256, dtype=np.uint8).reshape(16, 16)
  pil = Image.fromarray(image)
  np.testing.assert_array_equal(
    np.asarray(apply_op(pil, "SolarizeAdd", 99, 0)),
    np.where(image < 128, np.minimum(255, image.astype(int) + 99), image),
  )
  np.testing.assert_array_equal(
    np.asarray(apply_op(pil, "SolarizeIncreasing", 26, 0)), np.where(image >= 26, 255 - image, image)
  )
  np.testing.assert_array_equal(np.asarray(apply_op(pil, "PosterizeIncreasing", 1, 0)), image & 0x80)
  np.testing.assert_array_equal(np.asarray(apply_op(pil, "Invert", 0.0, 0)), 255 - image)
  shifted = np.asarray(apply_op(pil, "TranslateXRel", 0.25, 7))  # x' = x + 4: content moves left, fill on the right
  np.testing.assert_array_equal(shifted[:, :12], image[:, 4:])
  assert np.all(shifted[:, 12:] == 7)


def test_rand_augment_in_image_augment():
  from primal_jax.tasks.vision.rand_augment import rand_augment

  example = _example((16, 16, 3))
  np.testing.assert_array_equal(rand_augment(example["image"], np.random.default_rng(0), num_ops=0), example["image"])
  augment = ImageAugment(rand_augment=True)
  outs = [augment(example, np.random.default_rng(s))["image"] for s in range(20)]
  assert all(o.shape == (16, 16, 3) and o.dtype == np.uint8 for o in outs)
  assert sum(not np.array_equal(o, example["image"]) for o in outs) >= 10  # p(no op applied) = 0.25
  np.testing.assert_array_equal(augment(example, np.random.default_rng(3))["image"], outs[3])
  with pytest.raises(ValueError, match="rand_magnitude"):
    ImageAugment(rand_augment=True, rand_magnitude=11.0)
