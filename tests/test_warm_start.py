"""`config.init_from` (primal_jax.training.checkpointing.warm_start): settings refused before anything is built, and a
"matching" start that loads (almost) nothing refused naming both models (issue 26, items 4 and 10).

The checkpoints are real runs' step-0 checkpoints (`write_initial_run`: orbax, config.json beside them) of a
UEA smoke model and of vision smoke models on a tiny folder of PNG files.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from primal_jax.cli.config_lookup import load_config
from primal_jax.errors import ConfigError, MissingFileError
from primal_jax.training.checkpointing.warm_start import InitFromError, check_init_from
from primal_jax.training.experiment import write_initial_run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  """train/ and test/ with two classes of two 16 x 16 RGB PNG files each."""
  from PIL import Image

  root, rng = tmp_path_factory.mktemp("images"), np.random.default_rng(0)
  for split in ("train", "test"):
    for name in ("a", "b"):
      (root / split / name).mkdir(parents=True)
      for i in range(2):
        Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(root / split / name / f"{i}.png")
  return root


def vit_config(folder, model: str, **overrides):
  config = load_config(f"vit:model={model},smoke", lock=False)
  config.data.update(dataset="image_folder", source=str(folder), image_size=16, crop_pct=1.0, val_fraction=0.0)
  config.model.patch_size = 8
  config.update(overrides)
  return config


@pytest.mark.slow  # ~40 s on 2 shared cores (the vision model's init and checkpoint)
def test_a_matching_start_from_another_model_is_refused_naming_both(folder, tmp_path):
  """A language model's checkpoint into the vision model loaded nothing ("43 new, 41 unused") and the run
  trained from scratch as if fine-tuned; it is an InitFromError (one line for the CLI) naming both models, and
  no step is saved."""
  import jax
  import jax.numpy as jnp
  from flax import linen as nn

  from primal_jax.convert.timm import write_params_checkpoint
  from primal_jax.models.config import TransformerConfig
  from primal_jax.models.lm import CausalLM

  lm = TransformerConfig(
    layers=("softmax", "primal"), attention={"primal": {"low_rank": 3, "data_dependent": False}}, vocab_size=16,
    max_len=24, dim=16, hidden_dim=32, num_heads=2, num_classes=16,
  )  # fmt: skip
  params = nn.unbox(CausalLM(lm).init(jax.random.key(0), jnp.zeros((1, 24), jnp.int32))["params"])
  saved = write_params_checkpoint(params, tmp_path / "lm")
  config = vit_config(folder, "primal_plus", init_from=str(saved), init_from_mode="matching")
  with pytest.raises(InitFromError) as info:
    write_initial_run(config, tmp_path / "vit")
  message = str(info.value)
  assert "\n" not in message and isinstance(info.value, ConfigError)
  assert re.search(r"loaded 0 of the model's \d+ leaves \(0% of its parameters", message), message
  assert (
    "another model (a model without a config.json beside it; 41 of its leaves match nothing here, under " in message
  )
  assert "decoder/, embed/, lm_head/" in message
  assert f"than this run's ({config.model.name} primal_plus, dim {config.model.dim})" in message
  assert not (tmp_path / "vit" / "checkpoints" / "0").exists()


@pytest.mark.slow  # ~50 s on 2 shared cores
def test_the_least_share_loaded_is_a_setting(folder, tmp_path):
  """DeiT's params (a run's, config.json beside them) into Primal.+DeiT: the Primal block's own projections are
  new, the rest loads. That passes the default init_from_min_loaded (0.5) and is refused at 0.99, naming the
  saved run's model."""
  deit = vit_config(folder, "deit")
  write_initial_run(deit, tmp_path / "deit")
  config = vit_config(
    folder, "primal_plus", init_from=str(tmp_path / "deit" / "checkpoints"), init_from_mode="matching"
  )
  origin = write_initial_run(config, tmp_path / "fine_tune")
  assert "where they match" in origin and " loaded" in origin
  config.init_from_min_loaded = 0.99
  with pytest.raises(InitFromError, match=r"loaded \d+ of the model's \d+ leaves \(\d\d% .*min_loaded=0.99") as info:
    write_initial_run(config, tmp_path / "strict")
  assert f"another model ({deit.model.name} softmax, dim {deit.model.dim} ({tmp_path / 'deit' / 'config.json'})" in str(
    info.value
  )


def test_init_from_settings_are_checked_first():
  config = load_config("vit:smoke", lock=False)
  check_init_from(config)  # the defaults: no init_from
  for key, value, match in [
    ("init_from", "/nonexistent/run", r"^init_from: /nonexistent/run does not exist; name a run's workdir"),
    ("init_from_mode", "nope", r"^init_from_mode must be one of exact, matching, got 'nope'$"),
    ("init_from_min_loaded", 1.5, r"^init_from_min_loaded must be a fraction in \[0, 1\], got 1.5$"),
  ]:
    bad = load_config("vit:smoke", lock=False)
    bad[key] = value
    with pytest.raises(MissingFileError if key == "init_from" else ConfigError, match=match):
      check_init_from(bad)


def test_the_binary_refuses_bad_init_from_settings_in_one_line(tmp_path):
  """Issue 26, item 10: a missing init_from and a bad init_from_mode used to end in a traceback (the mode only
  once a checkpoint was read); each is one line, exit status 2, before any data is read."""
  env = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
  tries = {
    "init_from": ("--config.init_from=/nonexistent/run", "init_from: /nonexistent/run does not exist"),
    "mode": ("--config.init_from_mode=nope", "init_from_mode must be one of exact, matching, got 'nope'"),
  }
  procs = {
    name: subprocess.Popen(
      [sys.executable, "-m", "experiments.main", "--config=vit:smoke", f"--workdir={tmp_path / name}", flag],
      cwd=tmp_path,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )  # fmt: skip
    for name, (flag, _) in tries.items()
  }
  for name, proc in procs.items():
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 2 and "Traceback" not in stderr, stderr[-2000:]
    (line,) = stderr.strip().splitlines()
    assert line.startswith("python -m experiments.main: error: ") and tries[name][1] in line, line


@pytest.mark.slow  # two short UEA smoke trainings (~30 s on 2 shared cores)
def test_a_resumed_run_needs_its_init_from_no_more(jv_tfds_dir, tmp_path):
  """The existence check is for a run's start: a run that has its own checkpoints resumes from them even once
  the checkpoint it started from is gone."""
  import shutil

  from primal_jax.training.loop import train_and_evaluate

  base = load_config("uea:smoke", lock=False)
  base.data.data_dir = jv_tfds_dir
  write_initial_run(base, tmp_path / "pretrained")
  config = load_config("uea:smoke", lock=False)
  config.data.data_dir, config.init_from, config.total_steps = jv_tfds_dir, str(tmp_path / "pretrained"), 1
  lines = []
  train_and_evaluate(config, tmp_path / "run", print_fn=lines.append)
  assert any(f"params initialised from {tmp_path / 'pretrained'}" in line for line in lines)
  shutil.rmtree(tmp_path / "pretrained")
  config.total_steps, config.accept_config_changes = 2, "total_steps"
  lines = []
  assert train_and_evaluate(config, tmp_path / "run", print_fn=lines.append)["steps"] == 2
  assert any("resumed from step 1" in line for line in lines)
  config.resume_step, config.accept_config_changes = -1, ""
  with pytest.raises(MissingFileError, match="init_from: .*pretrained does not exist"):
    train_and_evaluate(config, tmp_path / "new", print_fn=lambda _: None)  # a new run still needs it
