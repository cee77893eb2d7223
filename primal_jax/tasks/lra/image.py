"""LRA Image: a grayscale image as a sequence of pixel tokens, from CIFAR-10 (LRA) or Fashion-MNIST (offline).

LRA's image task (`lra_benchmarks/image/input_pipeline.py`) reads the TFDS
`cifar10` splits `train[:90%]`, `train[90%:]` and `test` (45,000 / 5,000 /
10,000), converts each image with `tf.image.rgb_to_grayscale` and flattens it
to 1,024 pixels. Here pixel value v becomes token v + 1 (id 0 is padding,
vocabulary 257), and the validation split is the same contiguous tail of train
(`primal_jax.data.splits.holdout_tail`, `val_fraction` 0.1 by default).

CIFAR-10 comes from the TFDS catalog, which needs the network (and TensorFlow,
once, to prepare it). The default dataset is therefore Fashion-MNIST (28 x 28
grayscale, 784 tokens, 10 classes, 60,000 / 10,000), obtained offline from
Debian's package through the package registry alone (`fashion_mnist`, which
fetches with `debian`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from primal_jax.data.core import InputPipeline
from primal_jax.data.pipeline import Example
from primal_jax.data.sources.fashion_mnist import FASHION_MNIST_CLASSES, fetch_fashion_mnist, load_fashion_mnist
from primal_jax.data.sources.tfds_catalog import CIFAR10_CLASSES, catalog_splits
from primal_jax.data.splits import holdout_tail
from primal_jax.tasks.lra.catalog import BYTE_VOCAB_SIZE, lra_settings
from primal_jax.tasks.lra.tokens import token_pipeline

IMAGE_DATASETS: tuple[str, ...] = ("fashion_mnist", "cifar10")
DEFAULT_VAL_FRACTION = 0.1  # LRA: train[:90%] / train[90%:]
# tf.image.rgb_to_grayscale's luma weights (ITU-R BT.601), as float32.
GRAYSCALE_WEIGHTS: tuple[float, float, float] = (0.2989, 0.5870, 0.1140)
# --- grayscale pixels -> tokens -------------------------------------------------------------------------------------


def rgb_to_grayscale(images: np.ndarray) -> np.ndarray:
  """uint8 [..., 3] -> uint8 [...]: `tf.image.rgb_to_grayscale` on uint8 images, step by step in float32.

  TensorFlow converts to float32 (x * float32(1/255)), takes the dot product
  with float32 weights (0.2989, 0.5870, 0.1140), multiplies by 255.5 and casts
  back to uint8 (truncation). Done here in that order, this agrees with the
  exact float64 value floor(255.5 * sum_c w_c x_c / 255) on all but 237 of the
  2^24 colours, each off by one and within 4e-5 of an integer, where float32
  rounding decides (and TensorFlow's own summation order may decide otherwise).
  """
  images = np.asarray(images)
  if images.dtype != np.uint8 or images.ndim < 1 or images.shape[-1] != 3:
    raise ValueError(f"images must be uint8 [..., 3] RGB, got {images.dtype} {images.shape}")
  x = images.astype(np.float32) * np.float32(1.0 / 255.0)  # [..., 3]
  w = np.asarray(GRAYSCALE_WEIGHTS, dtype=np.float32)
  gray = x[..., 0] * w[0] + x[..., 1] * w[1] + x[..., 2] * w[2]  # [...] float32
  return (gray * np.float32(255.5)).astype(np.uint8)


def image_tokens(image: np.ndarray) -> np.ndarray:
  """int32 [h * w]: an RGB [h, w, 3] image in grayscale, or a grayscale [h, w] / [h, w, 1] one, row-major, + 1."""
  image = np.asarray(image)
  if image.dtype != np.uint8:
    raise ValueError(f"image must be uint8, got {image.dtype}")
  if image.ndim == 3 and image.shape[-1] == 3:
    image = rgb_to_grayscale(image)
  elif image.ndim == 3 and image.shape[-1] == 1:
    image = image[..., 0]
  if image.ndim != 2:
    raise ValueError(f"image must be [h, w], [h, w, 1] or [h, w, 3], got {image.shape}")
  return image.reshape(-1).astype(np.int32) + 1


@dataclasses.dataclass(frozen=True, eq=False)
class ImageArraySource(Sequence):
  """Token examples of in-memory grayscale images: uint8 [n, h, w] and labels [n]."""

  images: np.ndarray
  labels: np.ndarray

  def __post_init__(self) -> None:
    if self.images.ndim != 3 or self.images.dtype != np.uint8 or len(self.images) != len(self.labels):
      raise ValueError(f"images must be uint8 [n, h, w] with n labels, got {self.images.shape}, {self.labels.shape}")

  def __len__(self) -> int:
    return len(self.labels)

  def __getitem__(self, i):  # integer indices only, as the pipeline uses them
    i = int(i)
    return {"tokens": image_tokens(self.images[i]), "label": int(self.labels[i]), "index": i}


@dataclasses.dataclass(frozen=True, eq=False)
class CatalogImageSource(Sequence):
  """Token examples of a TFDS image data source ({"image": uint8 [h, w, c], "label": int}), grayscale as LRA."""

  source: Sequence[Example]

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, i):
    i = int(i)
    example = self.source[i]
    return {"tokens": image_tokens(example["image"]), "label": int(example["label"]), "index": i}


# --- the pipeline --------------------------------------------------------------------------------------------------


def image_splits(train: Sequence[Example], test: Sequence[Example], val_fraction: float) -> dict[str, Sequence]:
  """{"train", "validation", "test"} with validation the tail of train (LRA), or just train/test for fraction 0."""
  if val_fraction == 0.0:
    return {"train": train, "test": test}
  train_part, validation = holdout_tail(train, val_fraction)
  return {"train": train_part, "validation": validation, "test": test}


def make_lra_image_pipeline(data_config: Any, *, process_index: int = 0, process_count: int = 1) -> InputPipeline:
  """The LRA Image task's InputPipeline: batches of inputs int32 [b, seq_len] in [0, 257), 10 classes.

  data_config keys (besides batch_size, eval_batch_size, seed)::

    dataset: "fashion_mnist" (default; offline from the Debian package, 784
      tokens) or "cifar10" (TFDS catalog, LRA's data, 1,024 tokens).
    source: fashion_mnist only, a directory holding the four idx files (plain
      or .gz, checked against the pinned checksums) instead of the fetched cache.
    data_dir: cifar10 only, the TFDS data_dir (default <default_cache_dir()>/tfds).
    download: cifar10 only, download and prepare it if absent (default True).
    seq_len: 0 (default) = the number of pixels; larger pads; smaller is refused.
    val_fraction: tail of train held out for validation (default 0.1, LRA's).
  """
  cfg = lra_settings(data_config, "lra_image", dataset="fashion_mnist", seq_len=0, val_fraction=DEFAULT_VAL_FRACTION)
  if cfg.dataset == "fashion_mnist":
    directory = Path(cfg.source).expanduser() if cfg.source is not None else fetch_fashion_mnist()
    train, test = (ImageArraySource(*load_fashion_mnist(split, directory)) for split in ("train", "test"))
    num_pixels, class_names = 28 * 28, FASHION_MNIST_CLASSES
  elif cfg.dataset == "cifar10":
    sources = catalog_splits("cifar10", ("train", "test"), cfg.data_dir, download=cfg.download)
    train, test = CatalogImageSource(sources["train"]), CatalogImageSource(sources["test"])
    num_pixels, class_names = 32 * 32, CIFAR10_CLASSES
  else:
    raise ValueError(f"dataset must be one of {', '.join(IMAGE_DATASETS)} for the lra_image task, got {cfg.dataset!r}")
  if cfg.seq_len and cfg.seq_len < num_pixels:
    raise ValueError(f"seq_len {cfg.seq_len} would cut {cfg.dataset} images of {num_pixels} pixels; use 0 or more")
  return token_pipeline(
    cfg.dataset,
    image_splits(train, test, cfg.val_fraction),
    class_names,
    BYTE_VOCAB_SIZE,
    data_config,
    seq_len=cfg.seq_len or num_pixels,
    process_index=process_index,
    process_count=process_count,
  )
