"""Tests of primal_jax.tasks.lra.image: grayscale tokens, the Debian Fashion-MNIST fetch, and the lra_image pipeline.

Fashion-MNIST is the real data: fetched once per session from Debian's
`dataset-fashion-mnist` package (apt-get download, else the Debian mirror) into
a session tmp dir, or read from the default cache when it already holds the
pinned files; those tests are skipped only when the package registry cannot be
reached. The fetch logic itself (fallback to the mirror, checksums, caching) is
tested on small fake `.deb` files built here. CIFAR-10 is faked twice: with
`tfds.testing.mock_data` (the data_source call path) and as a tiny real
ArrayRecord dataset written with the catalog builder's own feature spec (so
PNG decoding on read, without TensorFlow, is exercised too).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import struct
import tarfile
import types

import numpy as np
import pytest

from primal_jax.data import registry
from primal_jax.data.cache import DatasetFetchError, default_cache_dir
from primal_jax.data.sources import debian, fashion_mnist
from primal_jax.data.sources.debian import DebianFetchUnavailable, DebianPackage, fetch_deb_files
from primal_jax.data.sources.fashion_mnist import load_fashion_mnist, parse_idx
from primal_jax.data.sources.tfds_catalog import catalog_splits
from primal_jax.tasks.lra import image as lra_image
from primal_jax.tasks.lra.image import image_tokens, make_lra_image_pipeline, rgb_to_grayscale

tfds = pytest.importorskip("tensorflow_datasets")


def concat(batches) -> dict[str, np.ndarray]:
  batches = list(batches)
  return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def config(**overrides):
  values = dict(task="lra_image", batch_size=8, eval_batch_size=8, seed=0)
  values.update(overrides)
  return types.SimpleNamespace(**values)


# --- grayscale ------------------------------------------------------------------------------------------------------


def test_grayscale_matches_float64_formula_on_every_colour():
  """All 2^24 colours against floor(255.5 * sum_c w_c v_c / 255) in float64 (tf's formula, exact arithmetic)."""
  weights = np.array([0.2989, 0.5870, 0.1140], dtype=np.float64)
  levels = np.arange(256)
  off_by_one = 0
  for red in range(256):
    rgb = np.stack(np.meshgrid([red], levels, levels, indexing="ij"), axis=-1).reshape(-1, 3).astype(np.uint8)
    exact = 255.5 * ((rgb / 255.0) @ weights)  # [65536] float64
    diff = rgb_to_grayscale(rgb).astype(np.int64) - np.floor(exact).astype(np.int64)
    near_integer = np.abs(exact - np.round(exact)) < 1e-4  # where float32 rounding may fall either way
    assert not diff[~near_integer].any()
    assert np.abs(diff).max() <= 1
    off_by_one += int(np.count_nonzero(diff))
  assert off_by_one == 237  # of 16,777,216; see rgb_to_grayscale's docstring
  gray = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1)  # r = g = b = v stays v
  np.testing.assert_array_equal(rgb_to_grayscale(gray), np.arange(256))


def test_image_tokens_flatten_row_major_plus_one():
  rng = np.random.default_rng(0)
  rgb = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
  tokens = image_tokens(rgb)
  assert tokens.shape == (1024,) and tokens.dtype == np.int32
  np.testing.assert_array_equal(tokens.reshape(32, 32), rgb_to_grayscale(rgb).astype(np.int32) + 1)
  gray = np.array([[0, 255], [7, 8]], dtype=np.uint8)
  np.testing.assert_array_equal(image_tokens(gray), [1, 256, 8, 9])
  np.testing.assert_array_equal(image_tokens(gray[..., None]), [1, 256, 8, 9])
  with pytest.raises(ValueError, match="image must be uint8"):
    image_tokens(gray.astype(np.float32))
  with pytest.raises(ValueError, match=r"images must be uint8 \[..., 3\] RGB"):
    rgb_to_grayscale(rgb[..., :2])


# --- idx files and fake .deb packages -------------------------------------------------------------------------------


def idx_bytes(array: np.ndarray) -> bytes:
  codes = {np.dtype(np.uint8): 0x08, np.dtype(">i4"): 0x0C}
  return bytes([0, 0, codes[array.dtype], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def test_parse_idx_plain_gzip_and_errors():
  images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
  np.testing.assert_array_equal(parse_idx(idx_bytes(images)), images)
  np.testing.assert_array_equal(parse_idx(gzip.compress(idx_bytes(images))), images)
  ints = np.array([1, -2, 70000], dtype=">i4")
  np.testing.assert_array_equal(parse_idx(idx_bytes(ints)), [1, -2, 70000])
  with pytest.raises(ValueError, match="x is not an idx file"):
    parse_idx(b"\x01\x02\x03\x04", "x")
  with pytest.raises(ValueError, match="y: 23 data bytes for shape"):
    parse_idx(idx_bytes(images)[:-1], "y")


def ar_archive(members: dict[str, bytes]) -> bytes:
  out = [b"!<arch>\n"]
  for name, data in members.items():
    out += [f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode(), data, b"\n" * (len(data) % 2)]
  return b"".join(out)


def tar_xz(files: dict[str, bytes]) -> bytes:
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
    directory = tarfile.TarInfo("./usr/")
    directory.type = tarfile.DIRTYPE
    tar.addfile(directory)
    for name, data in files.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return buffer.getvalue()


def fake_deb(files: dict[str, bytes]) -> bytes:
  """A .deb as dpkg builds it: ar of debian-binary, control.tar.xz, data.tar.xz (odd sizes pad to even)."""
  control = tar_xz({"./control": b"Package: fake\n"})
  return ar_archive({"debian-binary": b"2.0\n", "control.tar.xz": control, "data.tar.xz": tar_xz(files)})


@pytest.fixture
def fake_package(tmp_path):
  """(package, pinned, contents, mirror dir): a .deb shipping a.gz (gzipped) and b (plain) under usr/share/x."""
  contents = {"a": idx_bytes(np.arange(5, dtype=np.uint8)), "b": idx_bytes(np.arange(7, dtype=np.uint8))}
  deb = fake_deb({"./usr/share/x/a.gz": gzip.compress(contents["a"]), "./usr/share/x/b": contents["b"]})
  mirror = tmp_path / "mirror"
  pool_path = "pool/main/f/fake/fake_1.0-1_all.deb"
  (mirror / pool_path).parent.mkdir(parents=True)
  (mirror / pool_path).write_bytes(deb)
  package = DebianPackage("fake", "1.0-1", pool_path, hashlib.sha256(deb).hexdigest(), len(deb))
  pinned = {name: hashlib.sha256(data).hexdigest() for name, data in contents.items()}
  return package, pinned, contents, mirror


def no_apt(package, dest_dir):
  raise DebianFetchUnavailable("apt-get is not installed")


def test_fetch_deb_files_from_mirror_when_apt_fails(tmp_path, monkeypatch, fake_package):
  package, pinned, contents, mirror = fake_package
  monkeypatch.setattr(debian, "_apt_get_download", no_apt)
  out = fetch_deb_files(package, "usr/share/x", pinned, tmp_path / "cache", mirror=mirror.as_uri())
  assert out == tmp_path / "cache"
  assert {p.name: p.read_bytes() for p in out.iterdir()} == contents  # decompressed, only the pinned files

  def fail(*args, **kwargs):
    raise AssertionError("cached files must not be downloaded again")

  monkeypatch.setattr(debian, "download_deb", fail)
  assert fetch_deb_files(package, "usr/share/x", pinned, out) == out


def test_fetch_deb_files_from_local_deb_and_checksum_errors(tmp_path, monkeypatch, fake_package):
  package, pinned, contents, mirror = fake_package
  deb_path = mirror / package.pool_path
  out = fetch_deb_files(package, "usr/share/x", pinned, tmp_path / "local", deb_path=deb_path)
  assert (out / "a").read_bytes() == contents["a"]

  bad = {**pinned, "b": "0" * 64}
  with pytest.raises(DatasetFetchError, match="checksum mismatch for b from fake_1.0-1_all.deb"):
    fetch_deb_files(package, "usr/share/x", bad, tmp_path / "bad", deb_path=deb_path)
  assert not (tmp_path / "bad").exists()  # nothing written
  with pytest.raises(DatasetFetchError, match=r"has no usr/share/x/c\(.gz\)"):
    fetch_deb_files(package, "usr/share/x", {"c": "0" * 64}, tmp_path / "c", deb_path=deb_path)

  monkeypatch.setattr(debian, "_apt_get_download", no_apt)
  wrong_deb = DebianPackage("fake", "1.0-1", package.pool_path, "f" * 64, package.size)
  with pytest.raises(DatasetFetchError, match="sha256 .*, pinned f{64}") as err:
    fetch_deb_files(wrong_deb, "usr/share/x", pinned, tmp_path / "wrong", mirror=mirror.as_uri())
  assert not isinstance(err.value, DebianFetchUnavailable)  # a bad file is an error, never a reason to skip
  with pytest.raises(DebianFetchUnavailable, match=r"(?s)apt-get is not installed.*GET file:.*failed"):
    fetch_deb_files(package, "usr/share/x", pinned, tmp_path / "none", mirror=(tmp_path / "nowhere").as_uri())
  with pytest.raises(DatasetFetchError, match="is not a Debian package"):
    fetch_deb_files(package, "usr/share/x", pinned, tmp_path / "x", deb_path=tmp_path / "local" / "a")


# --- real Fashion-MNIST ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def fashion_mnist_dir(tmp_path_factory):
  """The four pinned idx files: the default cache if it holds them, else fetched once into a session tmp dir."""
  cached = default_cache_dir() / "fashion_mnist"
  try:
    for split in ("train", "test"):
      load_fashion_mnist(split, cached)
    return cached
  except (FileNotFoundError, ValueError):
    pass
  try:
    return fashion_mnist.fetch_fashion_mnist(tmp_path_factory.mktemp("primal_jax_cache"))
  except DebianFetchUnavailable as e:
    pytest.skip(f"Debian package registry unreachable (apt-get download and the mirror both failed): {e}")


def test_fashion_mnist_arrays(fashion_mnist_dir):
  for split, n in (("train", 60000), ("test", 10000)):
    images, labels = load_fashion_mnist(split, fashion_mnist_dir)
    assert images.shape == (n, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (n,) and labels.dtype == np.int64
    np.testing.assert_array_equal(np.bincount(labels), [n // 10] * 10)  # Fashion-MNIST is balanced
    assert images.max() == 255 and images.min() == 0
  np.testing.assert_array_equal(labels[:5], [9, 2, 1, 1, 6])  # Ankle boot, Pullover, Trouser, Trouser, Shirt


def test_fashion_mnist_pipeline(fashion_mnist_dir):
  images, labels = load_fashion_mnist("train", fashion_mnist_dir)
  test_images, test_labels = load_fashion_mnist("test", fashion_mnist_dir)
  cfg = config(source=str(fashion_mnist_dir), batch_size=4096, eval_batch_size=4096)
  p = registry.get_input_pipeline(cfg)
  assert p.info.name == "fashion_mnist" and (p.info.seq_len, p.info.vocab_size, p.info.num_classes) == (784, 257, 10)
  assert dict(p.info.split_sizes) == {"train": 54000, "validation": 6000, "test": 10000}

  epoch = concat(p.train_batches(0))
  real = epoch["weight"] > 0
  assert epoch["inputs"].shape == (p.steps_per_epoch * 4096, 784) and epoch["inputs"].dtype == np.int32
  np.testing.assert_array_equal(np.sort(epoch["index"][real]), np.arange(54000))  # every example once, no val
  assert epoch["mask"][real].all()
  idx = epoch["index"][real]
  np.testing.assert_array_equal(epoch["inputs"][real], images[idx].reshape(-1, 784).astype(np.int32) + 1)
  np.testing.assert_array_equal(epoch["label"][real], labels[idx])
  assert 1 <= epoch["inputs"][real].min() and epoch["inputs"][real].max() <= 256

  validation = concat(p.eval_batches("validation"))
  np.testing.assert_array_equal(validation["index"][validation["weight"] > 0], np.arange(54000, 60000))  # LRA tail
  test = concat(p.eval_batches("test"))
  np.testing.assert_array_equal(test["inputs"][:10000], test_images.reshape(-1, 784).astype(np.int32) + 1)
  np.testing.assert_array_equal(test["label"][:10000], test_labels)

  small = config(source=str(fashion_mnist_dir), batch_size=64)  # small batches: the iterators read ahead
  first = next(iter(make_lra_image_pipeline(small).train_batches(0)))
  again = next(iter(make_lra_image_pipeline(small).train_batches(0)))
  for key in ("inputs", "label", "index"):
    np.testing.assert_array_equal(again[key], first[key])  # deterministic given the seed
  assert not np.array_equal(next(iter(make_lra_image_pipeline(small).train_batches(1)))["index"], first["index"])
  assert dict(make_lra_image_pipeline(config(source=str(fashion_mnist_dir), val_fraction=0.0)).info.split_sizes) == {
    "train": 60000,
    "test": 10000,
  }


def test_fashion_mnist_directory_errors(tmp_path, fashion_mnist_dir):
  with pytest.raises(FileNotFoundError, match=r"train-images-idx3-ubyte nor .*\.gz exists; fetch_fashion_mnist"):
    make_lra_image_pipeline(config(source=str(tmp_path)))
  for name in fashion_mnist.FASHION_MNIST_FILES:  # train files plain, test files gzipped: both are read
    data = (fashion_mnist_dir / name).read_bytes()
    if name.startswith("t10k"):
      (tmp_path / f"{name}.gz").write_bytes(gzip.compress(data, compresslevel=1))
    else:
      (tmp_path / name).write_bytes(data)
  assert len(make_lra_image_pipeline(config(source=str(tmp_path))).sources["test"]) == 10000
  (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(np.zeros(10000, np.uint8))))
  with pytest.raises(ValueError, match="t10k-labels-idx1-ubyte.gz: decompressed sha256 .* not the Fashion-MNIST"):
    make_lra_image_pipeline(config(source=str(tmp_path)))
  with pytest.raises(ValueError, match="seq_len 100 would cut fashion_mnist images of 784 pixels"):
    make_lra_image_pipeline(config(source=str(fashion_mnist_dir), seq_len=100))
  with pytest.raises(ValueError, match="dataset must be one of fashion_mnist, cifar10 for the lra_image task"):
    make_lra_image_pipeline(config(dataset="mnist"))


# --- CIFAR-10 from the TFDS catalog, faked ---------------------------------------------------------------------------


def test_cifar10_pipeline_from_mock_data(tmp_path):
  with tfds.testing.mock_data(num_examples=20):
    p = make_lra_image_pipeline(config(dataset="cifar10", data_dir=str(tmp_path)))
    mock = tfds.data_source("cifar10", split="train")  # mock_data serves the same examples for every split
    expected = np.stack([rgb_to_grayscale(mock[i]["image"]).reshape(-1).astype(np.int32) + 1 for i in range(20)])
    expected_labels = np.array([int(mock[i]["label"]) for i in range(20)])
    epoch = concat(p.train_batches(0))
    validation = concat(p.eval_batches("validation"))
    test = concat(p.eval_batches("test"))
  assert p.info.name == "cifar10" and (p.info.seq_len, p.info.vocab_size) == (1024, 257)
  assert p.info.class_names == lra_image.CIFAR10_CLASSES
  assert dict(p.info.split_sizes) == {"train": 18, "validation": 2, "test": 20}
  assert epoch["inputs"].shape == (24, 1024) and epoch["mask"].shape == (24, 1024)
  real = epoch["weight"] > 0
  np.testing.assert_array_equal(np.sort(epoch["index"][real]), np.arange(18))
  np.testing.assert_array_equal(epoch["inputs"][real], expected[epoch["index"][real]])
  np.testing.assert_array_equal(epoch["label"][real], expected_labels[epoch["index"][real]])
  assert epoch["mask"][real].all() and not epoch["mask"][~real][:, 1:].any()  # padding rows: one position
  np.testing.assert_array_equal(validation["index"][validation["weight"] > 0], [18, 19])
  np.testing.assert_array_equal(test["inputs"][:20], expected)


def prepare_tiny_cifar10(data_dir, images: np.ndarray, labels: np.ndarray) -> None:
  """A real ArrayRecord `cifar10` (catalog feature spec and version) with `images` in both splits.

  The catalog's own preparation needs TensorFlow (its reader and PNG
  encoder); images passed as PNG files are stored as they are, so PIL is enough.
  """
  from PIL import Image

  class Cifar10(tfds.image_classification.Cifar10, skip_registration=True):
    code_path = None  # no checksums file lookup (it needs importlib_resources)

    def _split_generators(self, dl_manager):
      self.info.features["label"].names = list(lra_image.CIFAR10_CLASSES)
      return {"train": self._examples(), "test": self._examples()}

    def _examples(self):
      for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        png = io.BytesIO()
        Image.fromarray(image).save(png, format="png")
        png.seek(0)
        yield i, {"id": f"{i:05d}", "image": png, "label": int(label)}

  Cifar10(data_dir=str(data_dir), file_format="array_record").download_and_prepare()


def test_cifar10_from_real_array_record_files(tmp_path):
  rng = np.random.default_rng(1)
  images = rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
  labels = np.arange(6) % 10
  prepare_tiny_cifar10(tmp_path, images, labels)
  raw = catalog_splits("cifar10", ("test",), tmp_path, download=False)["test"]
  order = [int(raw[i]["id"]) for i in range(6)]  # TFDS shuffles records by key when writing
  assert sorted(order) == list(range(6))
  p = make_lra_image_pipeline(config(dataset="cifar10", data_dir=str(tmp_path), download=False, val_fraction=0.0))
  test = concat(p.eval_batches("test"))
  expected = rgb_to_grayscale(images[order]).reshape(6, 1024).astype(np.int32) + 1
  np.testing.assert_array_equal(test["inputs"][:6], expected)
  np.testing.assert_array_equal(test["label"][:6], labels[order])
