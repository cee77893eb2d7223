"""Out-of-distribution images: the 8 x 8 handwritten digits shipped with scikit-learn, brought to the ViT's size.

The digits (UCI optical recognition of handwritten digits, 1,797 images of 8 x 8 pixels with values 0-16, the
`load_digits` set) are read from the file scikit-learn ships, `sklearn/datasets/data/digits.csv.gz`, taken from
Debian's `python3-sklearn` package as Fashion-MNIST is taken from Debian's `dataset-fashion-mnist`
(`primal_jax.data.sources.debian`: apt or a Debian mirror, the `.deb` and the file checked against pinned
SHA-256 sums), so neither scikit-learn nor the network beyond the package registry is a dependency. Cached under
`<default_cache_dir()>/sklearn_digits/`.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from primal_jax.data.cache import cache_root, sha256_bytes
from primal_jax.data.sources.debian import DEBIAN_MIRROR, DebianPackage, fetch_deb_files

SKLEARN_DEB = DebianPackage(
  name="python3-sklearn",
  version="1.2.1+dfsg-1",
  pool_path="pool/main/s/scikit-learn/python3-sklearn_1.2.1+dfsg-1_all.deb",
  sha256="ca0c6be401d14871c7e93cfdd8d1f561595dc65e6e2ad2501d568aee7f7efc58",
  size=2102964,
)
DIGITS_MEMBER_DIR = "usr/lib/python3/dist-packages/sklearn/datasets/data"
DIGITS_FILE = "digits.csv"  # shipped as digits.csv.gz; the SHA-256 is of the decompressed file
DIGITS_FILES: Mapping[str, str] = types.MappingProxyType(
  {DIGITS_FILE: "6ebb3d2fee246a4e99363262ddf8a00a3c41bee6014c373ed9d9216ba7f651b8"}
)
NUM_DIGITS = 1797


def fetch_digits(cache_dir=None, *, deb_path=None, mirror: str = DEBIAN_MIRROR) -> Path:
  """`<cache_dir>/sklearn_digits/digits.csv`, fetched from Debian's python3-sklearn package if needed."""
  folder = fetch_deb_files(
    SKLEARN_DEB, DIGITS_MEMBER_DIR, DIGITS_FILES, cache_root(cache_dir) / "sklearn_digits", deb_path=deb_path,
    mirror=mirror,
  )  # fmt: skip
  return folder / DIGITS_FILE


def parse_digits(text: str) -> tuple[np.ndarray, np.ndarray]:
  """(images uint8 [n, 8, 8] in 0-16, labels [n]) of scikit-learn's digits.csv (64 pixels then the label a row)."""
  table = np.loadtxt(text.splitlines(), delimiter=",", dtype=np.int64)
  if table.ndim != 2 or table.shape[1] != 65 or table[:, :64].min() < 0 or table[:, :64].max() > 16:
    raise ValueError(f"digits.csv must hold rows of 64 pixels in 0-16 and a label, got shape {table.shape}")
  return table[:, :64].reshape(-1, 8, 8).astype(np.uint8), table[:, 64]


def resize_digits(digits, size: int, channels: int = 1) -> np.ndarray:
  """uint8 [n, size, size, channels]: values 0-16 scaled to 0-255, resized bilinearly (Pillow), the grey value
  repeated over `channels`."""
  from PIL import Image

  digits = np.asarray(digits)
  if digits.ndim != 3 or digits.shape[1:] != (8, 8):
    raise ValueError(f"digits must be [n, 8, 8], got {digits.shape}")
  if size < 1 or channels not in (1, 3):
    raise ValueError(f"size must be >= 1 and channels 1 or 3, got {size!r}, {channels!r}")
  grey = np.round(digits.astype(np.float64) * 255.0 / 16.0).astype(np.uint8)
  out = np.stack([np.asarray(Image.fromarray(d).resize((size, size), Image.Resampling.BILINEAR)) for d in grey])
  return np.repeat(out[..., None], channels, axis=-1)


def ood_digits(size: int, channels: int = 1, cache_dir=None) -> np.ndarray:
  """The 1,797 digits as uint8 [1797, size, size, channels] OOD images (`fetch_digits`, `resize_digits`)."""
  path = fetch_digits(cache_dir)
  data = path.read_bytes()
  if sha256_bytes(data) != DIGITS_FILES[DIGITS_FILE]:
    raise ValueError(f"{path}: sha256 differs from the pinned digits.csv of {SKLEARN_DEB.name} {SKLEARN_DEB.version}")
  images, _ = parse_digits(data.decode())
  return resize_digits(images, size, channels)
