"""Image classification pipelines for the ViT (`images` task): batches of float images [b, H, W, C].

Datasets (`data.dataset`)::

  fashion_mnist  (default) 28 x 28 grayscale, 10 classes, 60,000 / 10,000, offline from Debian's package
                 (`fashion_mnist`, as LRA Image uses it); `data.source` may name a directory of its idx files.
  cifar10, cifar100, imagenet2012  the TFDS catalog (`tfds.data_source` via `data.sources.tfds_catalog.catalog_splits`;
                 prepared under `data.data_dir`, which needs the network and TensorFlow once; ImageNet's
                 files must be downloaded by hand first, TFDS explains how). ImageNet's images are brought to
                 `data.image_size` as image folders' are, and its validation split is our test split.
  image_folder   `data.source` holds train/ and test/ (or ImageNet's val/, read as test) and optionally
                 validation/, each with one sub-folder per class (the train sub-folder names, sorted, are the
                 classes). Images are read lazily with Pillow, converted to `data.channels` (1 or 3) and
                 brought to `data.image_size`: resized, or with `data.crop_pct` < 1 the shorter side resized
                 to size / crop_pct (bicubic) and the centre cropped (DeiT's evaluation: 0.875).
  imagenet100    an ImageNet-1k folder (train/, val/) read as image_folder but restricted to the 100 classes
                 of `IMAGENET_100_CLASSES` (CMC's list, the paper's ImageNet-100).

Without a validation split, `data.val_fraction` of train is held out, so model selection never looks at test:
for the catalog datasets the tail of train (LRA's rule; their train split is not sorted by class), for image
folders (sorted by class) a share of every class drawn by `data.seed` (`data.splits.validation_split`: stratified, at
least one image of each class left in train). Image folders are checked when the pipeline is built: an empty
class folder is refused, and so is a file whose header Pillow cannot read, each naming the path; an image that
fails later (cut short after its header) is named when it is read.

Pixels become (x / 255 - mean) / std per channel (`data.mean`, `data.std`: 0.5 by default; DeiT's ImageNet
values are (0.485, 0.456, 0.406) / (0.229, 0.224, 0.225)).
Training images may be augmented (`data.augment`: random resized crop, flip, RandAugment, random erasing;
all off by default; `image_augment`), deterministically per (seed, epoch, example), and training batches
mixed (`data.mix`: Mixup, CutMix, label smoothing; off by default; `label_mixing`), per (seed, epoch, batch).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from primal_jax.data.checks import check_fraction, check_positive_int, config_get
from primal_jax.data.core import DatasetInfo, InputPipeline, pipeline_from_config
from primal_jax.data.pipeline import PAD_INDEX, Example, Subset
from primal_jax.data.sources.fashion_mnist import FASHION_MNIST_CLASSES, fetch_fashion_mnist, load_fashion_mnist
from primal_jax.data.sources.tfds_catalog import CIFAR10_CLASSES, catalog_splits
from primal_jax.data.splits import holdout_tail, validation_split
from primal_jax.errors import ConfigError
from primal_jax.tasks.vision.augment import image_augment
from primal_jax.tasks.vision.label_mixing import label_mixing

DATASETS = ("fashion_mnist", "cifar10", "cifar100", "imagenet2012", "image_folder", "imagenet100")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
DEFAULT_VAL_FRACTION = 0.1
# ImageNet-100: the 100 ImageNet-1k classes of CMC (Tian et al., 2020; github.com/HobbitLong/CMC imagenet100.txt),
# the subset the Primal-Attention paper's Table 5 uses. Labels follow the sorted wnids (torchvision's ImageFolder).
IMAGENET_100_CLASSES = (
  "n02869837 n01749939 n02488291 n02107142 n13037406 n02091831 n04517823 n04589890 n03062245 n01773797 "
  "n01735189 n07831146 n07753275 n03085013 n04485082 n02105505 n01983481 n02788148 n03530642 n04435653 "
  "n02086910 n02859443 n13040303 n03594734 n02085620 n02099849 n01558993 n04493381 n02109047 n04111531 "
  "n02877765 n04429376 n02009229 n01978455 n02106550 n01820546 n01692333 n07714571 n02974003 n02114855 "
  "n03785016 n03764736 n03775546 n02087046 n07836838 n04099969 n04592741 n03891251 n02701002 n03379051 "
  "n02259212 n07715103 n03947888 n04026417 n02326432 n03637318 n01980166 n02113799 n02086240 n03903868 "
  "n02483362 n04127249 n02089973 n03017168 n02093428 n02804414 n02396427 n04418357 n02172182 n01729322 "
  "n02113978 n03787032 n02089867 n02119022 n03777754 n04238763 n02231487 n03032252 n02138441 n02104029 "
  "n03837869 n03494278 n04136333 n03794056 n03492542 n02018207 n04067472 n03930630 n03584829 n02123045 "
  "n04229816 n02100583 n03642806 n04336792 n03259280 n02116738 n02108089 n03424325 n01855672 n02090622"
).split()


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


def fit_image(image, size: int, channels: int, crop_pct: float = 1.0) -> np.ndarray:
  """A Pillow image (or uint8 array) as uint8 [size, size, channels]: converted to "L" or "RGB", then resized
  (bilinear; crop_pct 1) or its shorter side resized to round(size / crop_pct) (bicubic) and the centre cropped
  (DeiT's evaluation: crop_pct 0.875)."""
  from PIL import Image

  if isinstance(image, np.ndarray):
    image = Image.fromarray(image[..., 0] if image.ndim == 3 and image.shape[-1] == 1 else image)
  image = image.convert({1: "L", 3: "RGB"}[channels])
  if crop_pct >= 1.0:
    image = image.resize((size, size), Image.Resampling.BILINEAR)
  else:
    scale = round(size / crop_pct) / min(image.size)
    w, h = max(size, round(image.size[0] * scale)), max(size, round(image.size[1] * scale))
    image = image.resize((w, h), Image.Resampling.BICUBIC)
    left, top = (w - size) // 2, (h - size) // 2
    image = image.crop((left, top, left + size, top + size))
  return np.asarray(image, np.uint8).reshape(size, size, channels)


@dataclasses.dataclass(frozen=True, eq=False)
class CatalogImages(Sequence):
  """Examples of a TFDS image data source ({"image": uint8 [H, W, C], "label"}), with their positions as index;
  with `size`, every image is brought to size x size (`fit_image`: ImageNet's images differ in size)."""

  source: Sequence[Example]
  size: int | None = None
  crop_pct: float = 1.0

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, i):
    i = int(i)
    example = self.source[i]
    image = np.asarray(example["image"], np.uint8)
    if self.size is not None:
      image = fit_image(image, self.size, image.shape[-1], self.crop_pct)
    return {"image": image, "label": int(example["label"]), "index": i}


@dataclasses.dataclass(frozen=True, eq=False)
class ImageFiles(Sequence):
  """Examples of image files read lazily with Pillow and brought to size x size by `fit_image`."""

  paths: tuple[Path, ...]
  labels: np.ndarray
  size: int
  channels: int = 3
  crop_pct: float = 1.0

  def __len__(self) -> int:
    return len(self.paths)

  def __getitem__(self, i):
    from PIL import Image

    i = int(i)
    try:
      with Image.open(self.paths[i]) as image:
        pixels = fit_image(image, self.size, self.channels, self.crop_pct)
    except (OSError, ValueError, SyntaxError) as err:  # Pillow's errors for a damaged file
      raise ConfigError(f"{self.paths[i]}: cannot read the image ({err}); replace or remove the file") from err
    return {"image": pixels, "label": int(self.labels[i]), "index": i}


def _check_header(path: Path) -> None:
  """Refuses a file whose image header Pillow cannot read (reads the header only, not the pixels)."""
  from PIL import Image

  try:
    with Image.open(path):
      pass
  except (OSError, ValueError, SyntaxError) as err:
    raise ConfigError(f"{path}: not a readable image ({err}); replace or remove the file") from None


def image_files(directory: Path, classes: Sequence[str], **options) -> ImageFiles:
  """The images under `directory/<class>/` (label = position in `classes`), in sorted order so reproducible.

  Every class folder must hold images (an empty one is refused) whose headers read (`_check_header`)."""
  if not classes:
    raise ConfigError(f"{directory} has no class sub-folders (one per class, holding its images)")
  paths, labels = [], []
  for label, name in enumerate(classes):
    folder = directory / name
    if not folder.is_dir():
      raise ConfigError(f"{directory} has no sub-folder {name!r} (the classes come from the train folder)")
    found = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not found:
      raise ConfigError(
        f"class folder {folder} holds no images ({', '.join(IMAGE_SUFFIXES)}): its class would never be "
        "trained or never tested; add its images or remove the folder"
      )
    for path in found:
      _check_header(path)
    paths += found
    labels += [label] * len(found)
  return ImageFiles(tuple(paths), np.asarray(labels, np.int64), **options)


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


def _crop_pct(data_config) -> float:
  crop_pct = float(config_get(data_config, "crop_pct", 1.0))
  if not 0.0 < crop_pct <= 1.0:
    raise ValueError(f"data.crop_pct must be in (0, 1], got {crop_pct!r}")
  return crop_pct


def _splits(data_config) -> tuple[str, dict[str, Sequence[Example]], tuple[str, ...]]:
  """(name, {"train", "test"[, "validation"]}, class names) of `data.dataset`."""
  dataset = config_get(data_config, "dataset", "fashion_mnist")
  source = config_get(data_config, "source", "") or None
  if dataset == "fashion_mnist":
    directory = Path(source).expanduser() if source else fetch_fashion_mnist()
    splits = {split: ImageArrays(*load_fashion_mnist(split, directory)) for split in ("train", "test")}
    return dataset, splits, FASHION_MNIST_CLASSES
  if dataset in ("cifar10", "cifar100", "imagenet2012"):
    data_dir = config_get(data_config, "data_dir", "") or None
    download = config_get(data_config, "download", True)
    if dataset == "imagenet2012":  # TFDS's "validation" is ImageNet's val/, the split papers report: our test
      sources = catalog_splits(dataset, ("train", "validation"), data_dir, download=download)
      sources = {"train": sources["train"], "test": sources["validation"]}
      size = check_positive_int(config_get(data_config, "image_size", 224), "image_size")
      crop_pct = _crop_pct(data_config)
      return dataset, {k: CatalogImages(v, size, crop_pct) for k, v in sources.items()}, tuple(map(str, range(1000)))
    sources = catalog_splits(dataset, ("train", "test"), data_dir, download=download)
    classes = CIFAR10_CLASSES if dataset == "cifar10" else tuple(f"class_{i}" for i in range(100))
    return dataset, {k: CatalogImages(v) for k, v in sources.items()}, classes
  if dataset in ("image_folder", "imagenet100"):
    if not source:
      raise ValueError("data.source must name the image folder (train/ and test/ or val/, a sub-folder per class)")
    root = Path(source).expanduser()
    if not (root / "train").is_dir():
      raise ValueError(f"data.source {root} has no train/ folder")
    if dataset == "imagenet100":
      classes = tuple(sorted(IMAGENET_100_CLASSES))  # torchvision ImageFolder's order, as the release's loader
    else:
      classes = tuple(sorted(p.name for p in (root / "train").iterdir() if p.is_dir()))
    channels = config_get(data_config, "channels", 3)
    if channels not in (1, 3):
      raise ValueError(f"data.channels must be 1 or 3, got {channels!r}")
    crop_pct = _crop_pct(data_config)
    size = check_positive_int(config_get(data_config, "image_size", 32), "image_size")
    folders = {"train": "train", "validation": "validation", "test": "test"}
    if not (root / "test").is_dir() and (root / "val").is_dir():
      folders["test"] = "val"  # ImageNet's val/: the split the paper reports
    splits = {
      split: image_files(root / folder, classes, size=size, channels=channels, crop_pct=crop_pct)
      for split, folder in folders.items()
      if (root / folder).is_dir()
    }
    return dataset, splits, classes
  raise ValueError(f"data.dataset must be one of {', '.join(DATASETS)}, got {dataset!r}")


def make_image_pipeline(data_config: Any, *, process_index: int = 0, process_count: int = 1) -> InputPipeline:
  """The `images` task's InputPipeline (module doc); data_config also holds batch_size, eval_batch_size, seed."""
  name, splits, classes = _splits(data_config)
  val_fraction = float(config_get(data_config, "val_fraction", DEFAULT_VAL_FRACTION))
  if "validation" not in splits and val_fraction > 0:
    train = splits["train"]
    if isinstance(train, ImageFiles):  # sorted by class: a tail would hold out whole classes
      seed = config_get(data_config, "seed", 0)
      kept, held = validation_split(train.labels, check_fraction(val_fraction, "val_fraction"), seed)
      splits["train"], splits["validation"] = Subset(train, kept), Subset(train, held)
    else:
      splits["train"], splits["validation"] = holdout_tail(train, val_fraction)
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
  return pipeline_from_config(
    data_config,
    info,
    splits,
    ImageCollate(shape, mean, std),
    process_index=process_index,
    process_count=process_count,
    augment=image_augment(config_get(data_config, "augment", None)),
    batch_mix=label_mixing(config_get(data_config, "mix", None), len(classes)),
  )
