"""Fashion-MNIST (Zalando; 28 x 28 grayscale, 10 classes, 60,000 / 10,000) from Debian's package, offline.

The default data of the LRA Image task (`primal_jax.tasks.lra.image`), since CIFAR-10 needs the
network and TensorFlow once. Debian's package `dataset-fashion-mnist` is
obtained through the package registry alone (`debian.fetch_deb_files`), and
the four idx files are checked against SHA-256 sums pinned here before
anything is cached under `<default_cache_dir()>/fashion_mnist/`.

Pinned checksums (measured from dataset-fashion-mnist 0.0~git20200523.55506a9-1,
Debian bookworm): the `.deb` SHA-256 is the one in Debian's signed Packages index
(`apt-cache show dataset-fashion-mnist`); the idx SHA-256s are of the
decompressed files, since the data depends on them and not on gzip headers (the
package's `.gz` files differ from Zalando's originals only by the file name and
mtime in the gzip header: each is exactly len(name) + 1 bytes shorter).
"""

from __future__ import annotations

import struct
import types
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from primal_jax.data.cache import cache_root, sha256_bytes
from primal_jax.data.sources.debian import DEBIAN_MIRROR, DebianPackage, decompressed, fetch_deb_files
from primal_jax.errors import MissingFileError

FASHION_MNIST_CLASSES: tuple[str, ...] = (
  "T-shirt/top",
  "Trouser",
  "Pullover",
  "Dress",
  "Coat",
  "Sandal",
  "Shirt",
  "Sneaker",
  "Bag",
  "Ankle boot",
)  # the label order of Fashion-MNIST's README
FASHION_MNIST_DEB = DebianPackage(
  name="dataset-fashion-mnist",
  version="0.0~git20200523.55506a9-1",
  pool_path="pool/main/d/dataset-fashion-mnist/dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb",
  sha256="39e172fe32dd318ebb3e512220c3beea2fa47d7e20bab348fb4e0922d6beefc0",
  size=30900652,
)
FASHION_MNIST_MEMBER_DIR = "usr/share/datasets/fashion-mnist"
# SHA-256 of the decompressed idx files (the package ships them as <name>.gz).
FASHION_MNIST_FILES: Mapping[str, str] = types.MappingProxyType(
  {
    "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
  }
)
FASHION_MNIST_SPLITS: Mapping[str, tuple[str, str]] = types.MappingProxyType(
  {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
  }
)
FASHION_MNIST_SIZES: Mapping[str, int] = types.MappingProxyType({"train": 60000, "test": 10000})


def fetch_fashion_mnist(
  cache_dir: str | Path | None = None, *, deb_path: str | Path | None = None, mirror: str = DEBIAN_MIRROR
) -> Path:
  """`<cache_dir>/fashion_mnist/` holding the four pinned idx files, fetched from Debian's package if needed.

  cache_dir defaults to `default_cache_dir()` ($PRIMAL_JAX_DATA or
  ~/.cache/primal_jax). `deb_path` is a `dataset-fashion-mnist` .deb obtained
  by other means (for machines without apt or mirror access).
  """
  cache_dir = cache_root(cache_dir)
  return fetch_deb_files(
    FASHION_MNIST_DEB,
    FASHION_MNIST_MEMBER_DIR,
    FASHION_MNIST_FILES,
    cache_dir / "fashion_mnist",
    deb_path=deb_path,
    mirror=mirror,
  )


_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def parse_idx(data: bytes, where: str = "idx data") -> np.ndarray:
  """The array in idx format (MNIST's): 0, 0, type code, ndim, then ndim big-endian uint32 sizes, then data."""
  data = decompressed(data)
  if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
    raise ValueError(f"{where} is not an idx file (magic {data[:4].hex()})")
  ndim = data[3]
  header = 4 + 4 * ndim
  if len(data) < header:
    raise ValueError(f"{where}: truncated idx header")
  shape = struct.unpack(f">{ndim}I", data[4:header])
  dtype = np.dtype(_IDX_DTYPES[data[2]])
  expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  if len(data) - header != expected:
    raise ValueError(f"{where}: {len(data) - header} data bytes for shape {shape} of {dtype}, expected {expected}")
  return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)


def _read_verified(directory: Path, name: str) -> bytes:
  candidates = [directory / name, directory / f"{name}.gz"]
  path = next((p for p in candidates if p.is_file()), None)
  if path is None:
    raise MissingFileError(
      f"Fashion-MNIST: neither {candidates[0]} nor {candidates[1]} exists; fetch_fashion_mnist() obtains the files "
      "from Debian's dataset-fashion-mnist package, or use the idx files of github.com/zalandoresearch/fashion-mnist"
    )
  data = decompressed(path.read_bytes())
  actual, pinned = sha256_bytes(data), FASHION_MNIST_FILES[name]
  if actual != pinned:
    raise ValueError(f"{path}: decompressed sha256 {actual}, pinned {pinned}; not the Fashion-MNIST release")
  return data


def load_fashion_mnist(split: str, directory: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(images uint8 [n, 28, 28], labels int64 [n]) of "train" (60,000) or "test" (10,000), checksums verified.

  directory holds the idx files (plain or .gz); by default the cache that
  `fetch_fashion_mnist()` fills (fetching if needed).
  """
  if split not in FASHION_MNIST_SPLITS:
    raise ValueError(f"split must be one of {', '.join(FASHION_MNIST_SPLITS)}, got {split!r}")
  directory = Path(directory).expanduser() if directory is not None else fetch_fashion_mnist()
  images_name, labels_name = FASHION_MNIST_SPLITS[split]
  images = parse_idx(_read_verified(directory, images_name), images_name)
  labels = parse_idx(_read_verified(directory, labels_name), labels_name).astype(np.int64)
  return images, labels
