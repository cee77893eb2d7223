"""Image classification pipelines for the ViT (`images` task): batches of float images [b, H, W, C].

Datasets (`data.dataset`):
  fashion_mnist  (default) 28 x 28 grayscale, 10 classes, 60,000 / 10,000, offline from Debian's package
                 (`fashion_mnist`, as LRA Image uses it); `data.source` may name a directory of its idx files.
  cifar10, cifar100  the TFDS catalog (`tfds.data_source` via `lra_catalog.catalog_splits`; prepared under
                 `data.data_dir`, which needs the network and TensorFlow once).
  image_folder   `data.source` holds train/ and test/ (and optionally validation/), each with one
                 sub-folder per class (the sub-folder names, sorted, are the classes); every image is read
                 with Pillow, converted to `data.channels` (1 or 3) and resized to `data.image_size`.
Without a validation split, the tail `data.val_fraction` of train is held out (LRA's rule), so model
selection never looks at test. Pixels become (x / 255 - mean) / std per channel (`data.mean`, `data.std`:
0.5 by default; DeiT's ImageNet values are (0.485, 0.456, 0.406) / (0.229, 0.224, 0.225)).
DeiT's augmentations (random resized crop, flip, RandAugment, Mixup/CutMix, random erasing) are not
applied here yet: the images arrive as stored.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from primal_jax.data.checks import check_nonnegative_int, check_positive_int, config_get
from primal_jax.data.core import DatasetInfo, InputPipeline
from primal_jax.data.fashion_mnist import FASHION_MNIST_CLASSES, fetch_fashion_mnist, load_fashion_mnist
from primal_jax.data.lra_catalog import catalog_splits, holdout_tail
from primal_jax.data.lra_image import CIFAR10_CLASSES
from primal_jax.data.pipeline import PAD_INDEX, Example

DATASETS = ("fashion_mnist", "cifar10", "cifar100", "image_folder")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
DEFAULT_VAL_FRACTION = 0.1


@dataclasses.dataclass(frozen=True)
class ImageDatasetInfo(DatasetInfo):
  """`DatasetInfo` plus the image shape (H, W, C) every batch has."""

  image_shape: tuple[int, int, int] = (0, 0, 0)


@dataclasses.dataclass(frozen=True, eq=False)
class ImageArrays(Sequence):
  """Examples {"image": uint8 [H, W, C], "label", "index"} of in-memory images uint8 [n, H, W(, C)] and labels [n]."""

  images: np.ndarray
  labels: np.ndarray

  def __post_init__(self) -> None:
    images = self.images[..., None] if self.images.ndim == 3 else self.images
    if images.ndim != 4 or images.dtype != np.uint8 or len(images) != len(self.labels):
      raise ValueError(
        f"images must be uint8 [n, H, W(, C)] with n labels, got {self.images.shape}, {self.labels.shape}"
      )
    object.__setattr__(self, "images", images)

  def __len__(self) -> int:
    return len(self.labels)

  def __getitem__(self, i):
    i = int(i)
    return {"image": self.images[i], "label": int(self.labels[i]), "index": i}


@dataclasses.dataclass(frozen=True, eq=False)
class CatalogImages(Sequence):
  """Examples of a TFDS image data source ({"image": uint8 [H, W, C], "label"}), with their positions as index."""

  source: Sequence[Example]

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, i):
    i = int(i)
    example = self.source[i]
    return {"image": np.asarray(example["image"], np.uint8), "label": int(example["label"]), "index": i}


def read_image_folder(directory: Path, classes: Sequence[str], size: int, channels: int) -> ImageArrays:
  """Every image under `directory/<class>/`, as uint8 [n, size, size, channels] (sorted paths, so reproducible)."""
  from PIL import Image

  mode = {1: "L", 3: "RGB"}[channels]
  images, labels = [], []
  for label, name in enumerate(classes):
    folder = directory / name
    if not folder.is_dir():
      raise ValueError(f"{directory} has no sub-folder {name!r} (the classes come from the train folder)")
    for path in sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES):
      with Image.open(path) as image:
        image = image.convert(mode).resize((size, size), Image.Resampling.BILINEAR)
        images.append(np.asarray(image, np.uint8).reshape(size, size, channels))
      labels.append(label)
  if not images:
    raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) under {directory}")
  return ImageArrays(np.stack(images), np.asarray(labels, np.int64))


@dataclasses.dataclass(frozen=True)
class ImageCollate:
  """(position, example or None) pairs -> {"inputs" float32 [b, H, W, C] normalised, "label", "weight", "index"}.

  A padding row (None) is zeros with weight 0 and index -1, as in `core.Collate`.
  """

  shape: tuple[int, int, int]
  mean: tuple[float, ...]
  std: tuple[float, ...]

  def __call__(self, items: Sequence[tuple[int, Example | None]]) -> dict[str, np.ndarray]:
    b = len(items)
    inputs = np.zeros((b, *self.shape), np.float32)  # [b, H, W, C]
    label = np.zeros(b, np.int32)
    weight = np.zeros(b, np.float32)
    index = np.full(b, PAD_INDEX, np.int64)
    mean, std = np.asarray(self.mean, np.float32), np.asarray(self.std, np.float32)
    for row, (position, example) in enumerate(items):
      if example is None:
        continue
      image = np.asarray(example["image"])
      if image.shape != self.shape:
        raise ValueError(f"example {example.get('index', position)}: image shape {image.shape}, expected {self.shape}")
      inputs[row] = (image.astype(np.float32) / 255.0 - mean) / std
      label[row], weight[row] = int(example["label"]), 1.0
      index[row] = int(example.get("index", position))
    return {"inputs": inputs, "label": label, "weight": weight, "index": index}


def _per_channel(value, channels: int, name: str) -> tuple[float, ...]:
  values = (float(value),) * channels if np.ndim(value) == 0 else tuple(float(v) for v in value)
  if len(values) != channels:
    raise ValueError(f"data.{name} must be one number or {channels} (one per channel), got {value!r}")
  if name == "std" and min(values) <= 0:
    raise ValueError(f"data.std must be > 0, got {value!r}")
  return values


def _splits(data_config) -> tuple[str, dict[str, Sequence[Example]], tuple[str, ...]]:
  """(name, {"train", "test"[, "validation"]}, class names) of `data.dataset`."""
  dataset = config_get(data_config, "dataset", "fashion_mnist")
  source = config_get(data_config, "source", "") or None
  if dataset == "fashion_mnist":
    directory = Path(source).expanduser() if source else fetch_fashion_mnist()
    splits = {split: ImageArrays(*load_fashion_mnist(split, directory)) for split in ("train", "test")}
    return dataset, splits, FASHION_MNIST_CLASSES
  if dataset in ("cifar10", "cifar100"):
    data_dir = config_get(data_config, "data_dir", "") or None
    sources = catalog_splits(dataset, ("train", "test"), data_dir, download=config_get(data_config, "download", True))
    classes = CIFAR10_CLASSES if dataset == "cifar10" else tuple(f"class_{i}" for i in range(100))
    return dataset, {k: CatalogImages(v) for k, v in sources.items()}, classes
  if dataset == "image_folder":
    if not source:
      raise ValueError("data.source must name the image folder (train/ and test/, one sub-folder per class)")
    root = Path(source).expanduser()
    if not (root / "train").is_dir():
      raise ValueError(f"data.source {root} has no train/ folder")
    classes = tuple(sorted(p.name for p in (root / "train").iterdir() if p.is_dir()))
    size = check_positive_int(config_get(data_config, "image_size", 32), "image_size")
    channels = config_get(data_config, "channels", 3)
    if channels not in (1, 3):
      raise ValueError(f"data.channels must be 1 or 3, got {channels!r}")
    names = [s for s in ("train", "validation", "test") if (root / s).is_dir()]
    return "image_folder", {s: read_image_folder(root / s, classes, size, channels) for s in names}, classes
  raise ValueError(f"data.dataset must be one of {', '.join(DATASETS)}, got {dataset!r}")


def make_image_pipeline(data_config: Any, *, process_index: int = 0, process_count: int = 1) -> InputPipeline:
  """The `images` task's InputPipeline (module doc); data_config also holds batch_size, eval_batch_size, seed."""
  name, splits, classes = _splits(data_config)
  val_fraction = float(config_get(data_config, "val_fraction", DEFAULT_VAL_FRACTION))
  if "validation" not in splits and val_fraction > 0:
    splits["train"], splits["validation"] = holdout_tail(splits["train"], val_fraction)
  shape = tuple(int(d) for d in np.shape(splits["train"][0]["image"]))
  mean = _per_channel(config_get(data_config, "mean", 0.5), shape[2], "mean")
  std = _per_channel(config_get(data_config, "std", 0.5), shape[2], "std")
  info = ImageDatasetInfo(
    name=name,
    num_classes=len(classes),
    num_features=shape[2],
    seq_len=shape[0] * shape[1],
    max_length=shape[0] * shape[1],
    split_sizes=types.MappingProxyType({k: len(v) for k, v in splits.items()}),
    class_names=tuple(classes),
    image_shape=shape,
  )
  return InputPipeline(
    info=info,
    sources=types.MappingProxyType(splits),
    transform=None,
    batch_size=config_get(data_config, "batch_size"),
    eval_batch_size=config_get(data_config, "eval_batch_size"),
    seed=check_nonnegative_int(config_get(data_config, "seed", 0), "seed"),
    process_index=process_index,
    process_count=process_count,
    collate=ImageCollate(shape, mean, std),
  )
