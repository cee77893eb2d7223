"""The `images` task (primal_jax.tasks.vision.input_pipeline), the `vit` builder and the `vit` config, offline.

A tiny image folder (PNG files written here) stands in for ImageNet-100 and Fashion-MNIST; the train loop
runs the config's smoke variant on it, and fine-tunes Primal.+DeiT from a converted random timm DeiT
through `config.init_from` with `init_from_mode="matching"`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import ml_collections
import numpy as np
import pytest

from primal_jax.cli.config_lookup import load_config
from primal_jax.convert.timm import write_params_checkpoint
from primal_jax.convert.vit import model_from_state_dict
from primal_jax.data import registry
from primal_jax.models.registry import build_model
from primal_jax.models.vit import VisionTransformer
from primal_jax.tasks.vision.config import IMAGENET_MEAN, IMAGENET_STD
from primal_jax.tasks.vision.input_pipeline import ImageArrays, ImageCollate, make_image_pipeline
from primal_jax.training.loop import train_and_evaluate

CONFIG = "vit"  # primal_jax/tasks/vision/config.py, by name
TIMM_CASE = Path(__file__).resolve().parent / "data" / "timm_vit_small.npz"
CLASSES = ("cat", "dog", "eel")


def _write_folder(root: Path, sizes: dict[str, int], size: int = 20, seed: int = 0) -> np.ndarray:
  """root/<split>/<class>/<i>.png RGB images of varied sizes (resized by the pipeline); returns train's pixels."""
  from PIL import Image

  rng = np.random.default_rng(seed)
  for split, per_class in sizes.items():
    for name in CLASSES:
      (root / split / name).mkdir(parents=True)
      for i in range(per_class):
        pixels = rng.integers(0, 256, (size + i, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / split / name / f"{i:03d}.png")
  return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  return _write_folder(tmp_path_factory.mktemp("images"), {"train": 8, "test": 3})


def _data(folder, **overrides):
  data = dict(
    task="images", dataset="image_folder", source=str(folder), image_size=16, channels=3, batch_size=8,
    eval_batch_size=8, seed=0, val_fraction=0.25, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25),
  )  # fmt: skip
  data.update(overrides)
  return ml_collections.ConfigDict(data)


def test_image_folder_pipeline(folder):
  from PIL import Image

  p = registry.get_input_pipeline(_data(folder))
  assert p.info.class_names == CLASSES and p.info.image_shape == (16, 16, 3) and p.info.num_classes == 3
  assert dict(p.info.split_sizes) == {"train": 18, "validation": 6, "test": 9}  # 2 of each class held out
  batches = list(p.train_batches(0))
  assert len(batches) == p.steps_per_epoch == 3
  batch = batches[0]
  assert batch["inputs"].shape == (8, 16, 16, 3) and batch["inputs"].dtype == np.float32
  real = np.concatenate([b["index"][b["weight"] > 0] for b in batches])
  train_files = [p.sources["train"][i]["index"] for i in range(18)]
  np.testing.assert_array_equal(np.sort(real), np.sort(train_files))  # every training example once per epoch
  # Pixels: PIL's bilinear resize to 16 x 16, then (x / 255 - 0.5) / 0.25; examples ordered by class, then file.
  i = int(batch["index"][0])
  label, k = divmod(i, 8)
  with Image.open(folder / "train" / CLASSES[label] / f"{k:03d}.png") as image:
    expected = np.asarray(image.convert("RGB").resize((16, 16), Image.Resampling.BILINEAR), np.float32)
  np.testing.assert_allclose(batch["inputs"][0], (expected / 255 - 0.5) / 0.25, atol=1e-6)
  assert batch["label"][0] == label
  # Deterministic by seed; another epoch is another order.
  again = next(iter(registry.get_input_pipeline(_data(folder)).train_batches(0)))
  np.testing.assert_array_equal(again["index"], batch["index"])
  assert not np.array_equal(next(iter(p.train_batches(1)))["index"], batch["index"])
  gray = registry.get_input_pipeline(_data(folder, channels=1, mean=(0.5,), std=(0.5,), val_fraction=0.0))
  assert gray.info.image_shape == (16, 16, 1) and set(gray.info.split_sizes) == {"train", "test"}


def _labels(source) -> np.ndarray:
  return np.asarray([source[i]["label"] for i in range(len(source))])


def test_validation_is_drawn_per_class_by_seed(tmp_path):
  """Issue 26, item 1: validation takes its share of every class (at least one example of each stays in train),
  drawn by `data.seed`; it used to be the tail of the class-sorted file list, so whole classes were
  validation-only (never trained)."""
  folder = _write_folder(tmp_path / "images", {"train": 8, "test": 1}, size=8)
  p = make_image_pipeline(_data(folder, image_size=8, val_fraction=0.25))
  train, validation = _labels(p.sources["train"]), _labels(p.sources["validation"])
  assert np.bincount(validation, minlength=3).tolist() == [2, 2, 2]
  assert np.bincount(train, minlength=3).tolist() == [6, 6, 6]
  files = {split: {p.sources[split][i]["index"] for i in range(len(p.sources[split]))} for split in p.sources}
  assert not files["train"] & files["validation"] and len(files["train"] | files["validation"]) == 24
  again = make_image_pipeline(_data(folder, image_size=8, val_fraction=0.25))
  assert {again.sources["validation"][i]["index"] for i in range(6)} == files["validation"]  # by seed
  other = make_image_pipeline(_data(folder, image_size=8, val_fraction=0.25, seed=1))
  assert {other.sources["validation"][i]["index"] for i in range(6)} != files["validation"]
  # A class too small to spare one (1 image) stays wholly in train; ImageNet-100's 5% leaves every class trained.
  small = _write_folder(tmp_path / "small", {"train": 1, "test": 1}, size=8)
  (small / "train" / "cat" / "001.png").write_bytes((small / "train" / "cat" / "000.png").read_bytes())
  p = make_image_pipeline(_data(small, image_size=8, val_fraction=0.25))
  assert set(_labels(p.sources["train"])) == {0, 1, 2}


def test_empty_class_folder_and_unreadable_image_are_named(tmp_path):
  """Issue 26, item 1: an empty class folder is refused (it would be evaluated, never trained), and an image
  that is no image is refused when the pipeline is built, naming the file; one cut short (its header reads)
  is named when it is read."""
  from primal_jax.errors import ConfigError

  folder = _write_folder(tmp_path / "images", {"train": 2, "test": 1}, size=8)
  for child in (folder / "train" / "dog").iterdir():
    child.unlink()
  with pytest.raises(ConfigError, match="^class folder " + re.escape(f"{folder / 'train' / 'dog'} holds no images")):
    make_image_pipeline(_data(folder, image_size=8, val_fraction=0.0))
  folder = _write_folder(tmp_path / "garbage", {"train": 2, "test": 1}, size=8)
  bad = folder / "train" / "dog" / "001.png"
  bad.write_bytes(b"not an image at all")
  with pytest.raises(ConfigError, match="^" + re.escape(f"{bad}: not a readable image")):
    make_image_pipeline(_data(folder, image_size=8, val_fraction=0.0))
  folder = _write_folder(tmp_path / "truncated", {"train": 2, "test": 1}, size=64)
  cut = folder / "train" / "eel" / "000.png"
  cut.write_bytes(cut.read_bytes()[:200])
  p = make_image_pipeline(_data(folder, image_size=8, val_fraction=0.0, batch_size=6))
  with pytest.raises(ConfigError, match=re.escape(f"{cut}: cannot read the image")):
    list(p.train_batches(0))


def test_imagenet100_and_centre_crop(tmp_path):
  """imagenet100 keeps CMC's 100 classes of an ImageNet-style folder (val/ read as test), labels by sorted wnid;
  crop_pct < 1 resizes the shorter side to size / crop_pct and crops the centre."""
  from PIL import Image

  from primal_jax.tasks.vision.input_pipeline import IMAGENET_100_CLASSES

  rng = np.random.default_rng(1)
  for split in ("train", "val"):
    for wnid in (*IMAGENET_100_CLASSES, "n01440764"):  # tench: not one of the 100
      (tmp_path / split / wnid).mkdir(parents=True)
      Image.fromarray(rng.integers(0, 256, (20, 40, 3), dtype=np.uint8)).save(tmp_path / split / wnid / "a.png")
  data = _data(tmp_path, dataset="imagenet100", image_size=8, crop_pct=0.5, val_fraction=0.0)
  p = make_image_pipeline(data)
  assert p.info.num_classes == 100 and p.info.class_names == tuple(sorted(IMAGENET_100_CLASSES))
  assert dict(p.info.split_sizes) == {"train": 100, "test": 100}
  example = p.sources["test"][3]
  with Image.open(tmp_path / "val" / sorted(IMAGENET_100_CLASSES)[3] / "a.png") as image:
    expected = np.asarray(image.resize((32, 16), Image.Resampling.BICUBIC).crop((12, 4, 20, 12)))
  np.testing.assert_array_equal(example["image"], expected)
  assert example["label"] == 3


def test_fashion_mnist_default():
  """The offline default (when the pinned idx files are cached; test_lra_image.py covers fetching them)."""
  from primal_jax.data.cache import default_cache_dir
  from primal_jax.data.sources.fashion_mnist import load_fashion_mnist

  cached = default_cache_dir() / "fashion_mnist"
  try:
    test_images, test_labels = load_fashion_mnist("test", cached)
  except (FileNotFoundError, ValueError):
    pytest.skip(f"Fashion-MNIST is not cached under {cached}")
  data = ml_collections.ConfigDict(dict(task="images", source=str(cached), batch_size=512, eval_batch_size=512, seed=0))
  p = registry.get_input_pipeline(data)
  assert p.info.name == "fashion_mnist" and p.info.image_shape == (28, 28, 1) and p.info.num_classes == 10
  assert dict(p.info.split_sizes) == {"train": 54000, "validation": 6000, "test": 10000}
  batch = next(iter(p.eval_batches("test")))
  np.testing.assert_allclose(batch["inputs"][:, :, :, 0], (test_images[:512] / 255 - 0.5) / 0.5, atol=1e-6)
  np.testing.assert_array_equal(batch["label"], test_labels[:512])


@pytest.mark.parametrize("dataset,classes", [("cifar10", 10), ("cifar100", 100)])
def test_catalog_datasets_from_mock_data(tmp_path, dataset, classes):
  """CIFAR through `tfds.data_source` (faked offline by tfds.testing.mock_data): RGB 32 x 32 batches."""
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=10):
    p = make_image_pipeline(
      _data(tmp_path, dataset=dataset, data_dir=str(tmp_path), val_fraction=0.2, mean=0.5, std=0.5)
    )
    assert p.info.image_shape == (32, 32, 3) and p.info.num_classes == classes
    assert dict(p.info.split_sizes) == {"train": 8, "validation": 2, "test": 10}
    batch = next(iter(p.train_batches(0)))
    assert batch["inputs"].shape == (8, 32, 32, 3) and np.all(np.abs(batch["inputs"]) <= 1.0)
    assert np.all((0 <= batch["label"]) & (batch["label"] < classes))
  if dataset == "cifar10":
    assert p.info.class_names[0] == "airplane"


def test_imagenet_catalog_from_mock_data(tmp_path):
  """ImageNet-1k through tfds.data_source: images of any size brought to image_size, TFDS validation = test."""
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=4):
    p = make_image_pipeline(
      _data(tmp_path, dataset="imagenet2012", data_dir=str(tmp_path), image_size=24, crop_pct=0.875, val_fraction=0.0)
    )
    assert p.info.image_shape == (24, 24, 3) and p.info.num_classes == 1000
    assert dict(p.info.split_sizes) == {"train": 4, "test": 4}
    assert next(iter(p.eval_batches("test")))["inputs"].shape == (8, 24, 24, 3)


def test_pipeline_errors(folder, tmp_path):
  with pytest.raises(ValueError, match="data.dataset must be one of"):
    make_image_pipeline(_data(folder, dataset="mnist"))
  with pytest.raises(ValueError, match="no train/ folder"):
    make_image_pipeline(_data(tmp_path))
  with pytest.raises(ValueError, match="data.mean must be one number or 3"):
    make_image_pipeline(_data(folder, mean=(0.5, 0.5)))
  with pytest.raises(ValueError, match="data.channels must be 1 or 3"):
    make_image_pipeline(_data(folder, channels=2))
  with pytest.raises(ValueError, match="data.crop_pct"):
    make_image_pipeline(_data(folder, crop_pct=0.0))
  with pytest.raises(ValueError, match="no sub-folder 'n"):
    make_image_pipeline(_data(folder, dataset="imagenet100"))
  collate = ImageCollate((2, 2, 1), (0.0,), (1.0,))
  with pytest.raises(ValueError, match="image shape"):
    collate([(0, {"image": np.zeros((3, 2, 1), np.uint8), "label": 0})])
  padded = collate([(-1, None), (0, ImageArrays(np.full((1, 2, 2), 255, np.uint8), np.array([1]))[0])])
  np.testing.assert_array_equal(padded["weight"], [0, 1])
  np.testing.assert_array_equal(padded["inputs"][1], np.ones((2, 2, 1)))


def test_vit_builder_and_config(folder):
  config = load_config(f"{CONFIG}:model=primal_plus,smoke")
  info = make_image_pipeline(_data(folder)).info
  built = build_model(config.model, info)
  module = built.module
  assert isinstance(module, VisionTransformer) and built.input_keys == ("inputs",)
  assert module.image_size == (16, 16) and module.patch_size == 4 and module.config.num_classes == 3
  assert module.config.layer_names == ("softmax", "primal") and module.config.layer_norm_eps == 1e-6
  assert module.config.layers[1].kwargs["init_style"] == "torch"
  full = load_config(f"{CONFIG}:model=deit")
  assert (full.model.dim, full.model.num_heads, full.model.patch_size, full.ksvd.eta) == (384, 6, 16, 0.0)
  assert full.optimizer.learning_rate == pytest.approx(1e-3)  # 5e-4 x 1024 / 512
  short = load_config(f"{CONFIG}:model=primal_plus,short")
  assert (short.data.dataset, short.model.layers[-1], short.ksvd.spec, short.test_eval) == (
    "fashion_mnist", "primal", "release_lra", "best_validation"
  )  # fmt: skip
  with pytest.raises(ValueError, match="needs an image task"):
    build_model(config.model, registry.get_input_pipeline(_data(folder)).info.__class__.__bases__[0](**{
      k: getattr(info, k) for k in ("name", "num_classes", "num_features", "seq_len", "max_length", "split_sizes",
                                    "class_names")
    }))  # fmt: skip


def _smoke_config(folder, **model):
  config = load_config(f"{CONFIG}:model=primal_plus,smoke")  # its data: Fashion-MNIST; here an RGB folder
  config.data.update(dataset="image_folder", source=str(folder), image_size=16, crop_pct=1.0, val_fraction=0.25)
  config.data.update(channels=3, mean=IMAGENET_MEAN, std=IMAGENET_STD, eval_batch_size=16)
  config.test_eval, config.best_metric = "best_validation", "validation/accuracy"
  config.model.update(model)
  return config


@pytest.mark.slow  # ~40 s on 2 shared CPU cores (compiles)
def test_smoke_training_run_and_its_spectrum(folder, tmp_path):
  """The train loop on the smoke config (Mixup/CutMix soft targets), then Figure 1's tool on the run: the softmax
  block's attention and the Primal block's induced kernel over the N = 17 tokens, per layer."""
  from experiments.spectrum import analyze

  config = _smoke_config(folder)
  with config.unlocked():  # DeiT's soft targets, end to end
    config.data.mix = dict(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1)
  summary = train_and_evaluate(config, tmp_path / "run", print_fn=lambda _: None)
  assert summary["steps"] == 4 and 0.0 <= summary["test_at_best_validation"]["accuracy"] <= 1.0
  result = analyze([str(tmp_path / "run")], tmp_path / "spectrum", num_examples=3, print_fn=lambda _: None)
  layers = {layer["name"]: layer for layer in result["runs"][0]["layers"]}
  assert {name: layer["kind"] for name, layer in layers.items()} == {
    "encoder/block_0/attention": "softmax",
    "encoder/block_1/attention": "primal",
  }
  assert all(layer["length"]["max"] == 17 for layer in layers.values())
  assert (tmp_path / "spectrum" / "explained_variance.png").is_file()


@pytest.mark.slow
def test_finetune_from_converted_timm_deit(tmp_path):
  """init_from a converted random timm DeiT (32 x 32 RGB, patch 8, width 48, 3 heads, 5 classes) into
  Primal.+DeiT on a 3-class folder: the run starts from the DeiT's blocks, the head re-initialised."""
  z = np.load(TIMM_CASE)
  sd = {str(k): z[str(k)] for k in z["param_keys"]}
  _, params = model_from_state_dict(sd, json.loads(str(z["config_json"]))["num_heads"])
  pretrained = write_params_checkpoint(params, tmp_path / "deit")
  folder = _write_folder(tmp_path / "images", {"train": 4, "test": 2}, size=32)
  config = _smoke_config(folder, patch_size=8, dim=48, num_heads=3, hidden_dim=192)
  config.data.image_size = 32
  config.init_from, config.init_from_mode = str(pretrained), "matching"
  logs = []
  train_and_evaluate(config, tmp_path / "run", print_fn=logs.append)
  assert any("where they match" in line and "2 reinitialised" in line for line in logs), logs[:3]


@pytest.mark.slow
def test_pretrained_weights_as_a_run_for_figure_1(tmp_path):
  """write_initial_run (experiments/pretrained_run.py) makes a workdir of a converted DeiT, restored exactly
  (the folder has the checkpoint's 5 classes); the spectrum tool then reads it like any trained run."""
  import jax

  from experiments.spectrum import analyze
  from primal_jax.training.experiment import load_run_config, load_state, write_initial_run

  z = np.load(TIMM_CASE)
  sd = {str(k): z[str(k)] for k in z["param_keys"]}
  _, params = model_from_state_dict(sd, json.loads(str(z["config_json"]))["num_heads"])
  pretrained = write_params_checkpoint(params, tmp_path / "deit")
  from PIL import Image

  folder, rng = tmp_path / "images", np.random.default_rng(2)
  for split in ("train", "test"):
    for c in range(5):  # one image per class, 5 classes as the checkpoint's head
      (folder / split / f"c{c}").mkdir(parents=True)
      Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / split / f"c{c}" / "a.png")
  config = load_config(f"{CONFIG}:model=deit,smoke")
  config.data.update(dataset="image_folder", source=str(folder), image_size=32, crop_pct=1.0, channels=3)
  config.data.update(mean=IMAGENET_MEAN, std=IMAGENET_STD)
  config.model.update(patch_size=8, dim=48, num_heads=3, hidden_dim=192, drop_path_rate=0.0)
  config.init_from = str(pretrained)
  origin = write_initial_run(config, tmp_path / "run")
  assert origin == f"params initialised from {pretrained}"
  _, state = load_state(load_run_config(tmp_path / "run"), tmp_path / "run")
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params), strict=True):
    np.testing.assert_array_equal(np.asarray(a), b)
  result = analyze([str(tmp_path / "run")], tmp_path / "spectrum", num_examples=2, print_fn=lambda _: None)
  assert [layer["kind"] for layer in result["runs"][0]["layers"]] == ["softmax", "softmax"]
  with pytest.raises(ValueError, match="already holds a run"):
    write_initial_run(config, tmp_path / "run")


@pytest.fixture(scope="module")
def fashion_mnist_cache(tmp_path_factory):
  """A cache root ($PRIMAL_JAX_DATA) holding the pinned Fashion-MNIST files: the default one if it has them,
  else a fresh one they are fetched into from Debian's package (skipped when the registry is unreachable)."""
  from primal_jax.data.cache import default_cache_dir
  from primal_jax.data.sources import fashion_mnist
  from primal_jax.data.sources.debian import DebianFetchUnavailable

  try:
    for split in ("train", "test"):
      fashion_mnist.load_fashion_mnist(split, default_cache_dir() / "fashion_mnist")
    return default_cache_dir()
  except (FileNotFoundError, ValueError):
    pass
  root = tmp_path_factory.mktemp("primal_jax_cache")
  try:
    fashion_mnist.fetch_fashion_mnist(root)
  except DebianFetchUnavailable as e:
    pytest.skip(f"Debian package registry unreachable: {e}")
  return root


@pytest.mark.slow  # ~60 s on 2 shared CPU cores: a fresh Python, compiles, 16,000 evaluation images
def test_vit_smoke_trains_on_the_embedded_fashion_mnist_through_the_binary(fashion_mnist_cache, tmp_path):
  """Issue 26.9: `--config=vit:smoke` needed an ImageNet folder and ended in a traceback."""
  import os
  import subprocess
  import sys

  root = Path(__file__).resolve().parents[1]
  env = {**os.environ, "PRIMAL_JAX_DATA": str(fashion_mnist_cache), "XLA_FLAGS": "", "PYTHONPATH": str(root)}
  command = [sys.executable, "-m", "experiments.main", "--config=vit:smoke", f"--workdir={tmp_path / 'run'}"]
  result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert summary["steps"] == 4 and summary["test_eval"] == "best_validation"
  test = summary["test_at_best_validation"]
  assert 0.0 <= test["accuracy"] <= 1.0 and test["accuracy"] * 10_000 == pytest.approx(round(test["accuracy"] * 1e4))
  config = json.loads((tmp_path / "run" / "config.json").read_text())
  assert config["data"]["dataset"] == "fashion_mnist" and config["data"]["channels"] == 1


def test_the_binary_refuses_a_mix_probability_above_one_in_one_line(folder, tmp_path):
  """Issue 26.10: `--config.data.mix.prob=1.5` ended in a ValueError traceback."""
  import os
  import subprocess
  import sys

  root = Path(__file__).resolve().parents[1]
  env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(root)}
  command = [
    sys.executable, "-m", "experiments.main", "--config=vit", f"--workdir={tmp_path / 'run'}",
    "--config.data.dataset=image_folder", f"--config.data.source={folder}", "--config.data.mix.prob=1.5",
  ]  # fmt: skip
  result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=600)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert lines == ["python -m experiments.main: error: data.mix.prob must be in [0, 1], got 1.5"], lines
