"""Tasks other than classification through the one train loop: a causal byte LM through the training
binary, and a synthetic regression task and model registered from this file."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import ml_collections
import numpy as np
import pytest
from flax import linen as nn

from experiments.generate import generate_from_run
from experiments.generate import main as generate_main
from primal_jax.data.core import DatasetInfo, InputPipeline
from primal_jax.data.registry import registered_task
from primal_jax.models.blocks import TransformerStack
from primal_jax.models.config import TransformerConfig
from primal_jax.models.registry import BuiltModel, registered_model
from primal_jax.training.checkpointing.checkpointer import Checkpointer
from primal_jax.training.loop import train_and_evaluate
from primal_jax.training.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
TEXT = (
  "Primal-Attention writes self-attention as the dual of a kernel SVD with asymmetric kernels. "
  "The primal form never builds the N x N attention matrix, so its cost grows linearly with length. "
  "A regulariser, the KSVD objective, asks the projection scores to be the extremal singular pairs. "
)


def train_losses(workdir: Path, key: str = "task_loss") -> list[float]:
  return [m["scalars"][key] for m in read_metrics(workdir, dedupe=True, prefix="train")]


def summary_ratio_steps(workdir: Path) -> tuple[int, int]:
  ratio = json.loads((workdir / "summary.json").read_text())["ksvd_ratio"]
  return ratio["start"]["step"], ratio["end"]["step"]


def test_causal_lm_trains_through_the_binary(tmp_path, capsys):
  text = tmp_path / "corpus.txt"
  text.write_text(TEXT * 30)  # ~8 KB: 7 KB of training bytes
  workdir = tmp_path / "run"
  result = subprocess.run(
    [
      sys.executable, "-m", "experiments.main", "--config=lm:smoke",
      "--config.data.source=file", f"--config.data.path={text}", f"--workdir={workdir}",
    ],
    cwd=ROOT, capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert result.returncode == 0, result.stderr[-3000:]
  losses = train_losses(workdir)
  assert len(losses) == 9  # steps 1 (always logged: the KSVD ratio's start), 5, 10, ..., 40
  assert summary_ratio_steps(workdir) == (1, 40)
  assert losses[-1] < 0.7 * losses[0], losses  # from about ln(256) = 5.5 nats
  assert all(k > 0 for k in train_losses(workdir, "ksvd_loss"))  # Primal layers sow, eta * KSVD is applied
  summary = json.loads((workdir / "summary.json").read_text())
  final = summary["final"]
  assert final["test/bits_per_byte"] == pytest.approx(final["test/loss"] / np.log(2.0))
  assert final["test/perplexity"] == pytest.approx(np.exp(final["test/loss"]))
  history = json.loads((workdir / "eval_history.json").read_text())
  best = min(history[::-1], key=lambda h: h["validation/bits_per_byte"])  # lower is better, latest on ties
  assert summary["best_validation"] == {"step": best["step"], "bits_per_byte": best["validation/bits_per_byte"]}
  ckpt = Checkpointer(workdir / "checkpoints", best_metric="validation/bits_per_byte", best_mode="min")
  assert ckpt.best_step() == best["step"]
  # Generation from the run's checkpoint (experiments/generate.py), and its one-line user errors.
  texts = generate_from_run(
    str(workdir), ["Anar", "A"], max_new_tokens=5, temperature=0.0, top_k=0, top_p=1.0, seed=0
  )  # fmt: skip
  assert len(texts) == 2 and all(isinstance(t, str) and t for t in texts)
  for flags, message in (
    (["--prompt="], "--prompt must not be empty"),
    (["--prompt=x", "--top_p=1.5"], "top_p must lie in"),
    (["--prompt=x", "--max_new_tokens=100"], "exceeds the model's max_len"),
  ):
    with pytest.raises(SystemExit) as exit_info:
      generate_main(["generate", f"--workdir={workdir}", *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_generate_refuses_a_run_that_is_not_a_causal_lm(tmp_path, capsys):
  from primal_jax.cli.config_lookup import load_config

  (tmp_path / "config.json").write_text(load_config("lra:smoke").to_json())  # a classifier's run record
  with pytest.raises(SystemExit) as exit_info:
    generate_main(["generate", f"--workdir={tmp_path}", "--prompt=x"])
  assert exit_info.value.code == 2
  assert "holds a 'lra' model; generation needs a causal language model" in capsys.readouterr().err


# --- a regression task and model of this file's own


SEQ_LEN, FEATURES, OUT = 8, 3, 2


def toy_split(seed: int, n: int) -> list[dict]:
  """Series of 3..8 steps whose targets are a fixed linear map of the inputs (shared across splits)."""
  rng = np.random.default_rng(seed)
  w = np.random.default_rng(99).normal(size=(FEATURES, OUT))
  out = []
  for _ in range(n):
    x = rng.normal(size=(rng.integers(3, SEQ_LEN + 1), FEATURES)).astype(np.float32)
    out.append({"values": x, "targets": (x @ w).astype(np.float32)})
  return out


def collate(items):
  """inputs [b, T, F], mask [b, T], targets [b, T, d], weight [b, T] (0 at padded steps and rows)."""
  b = len(items)
  batch = {
    "inputs": np.zeros((b, SEQ_LEN, FEATURES), np.float32),
    "mask": np.zeros((b, SEQ_LEN), bool),
    "targets": np.zeros((b, SEQ_LEN, OUT), np.float32),
    "weight": np.zeros((b, SEQ_LEN), np.float32),
  }
  for row, (_, example) in enumerate(items):
    if example is None:
      batch["mask"][row, 0] = True  # a padding row keeps one unmasked step, as the library's collators
      continue
    n = len(example["values"])
    batch["inputs"][row, :n], batch["targets"][row, :n] = example["values"], example["targets"]
    batch["mask"][row, :n] = True
    batch["weight"][row, :n] = 1.0
  return batch


def make_toy_pipeline(data_config, *, process_index=0, process_count=1) -> InputPipeline:
  splits = {"train": toy_split(0, 96), "validation": toy_split(1, 24), "test": toy_split(2, 24)}
  sizes = types.MappingProxyType({k: len(v) for k, v in splits.items()})
  info = DatasetInfo("toy_regression", 0, FEATURES, SEQ_LEN, SEQ_LEN, sizes, ())
  return InputPipeline(
    info, types.MappingProxyType(splits), None, data_config.batch_size, data_config.eval_batch_size,
    data_config.seed, process_index, process_count, collate,
  )  # fmt: skip


class ToyRegressor(nn.Module):
  """inputs [B, T, F] -> one Primal layer -> predictions [B, T, d]."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, inputs, mask, deterministic: bool = True):
    x = nn.Dense(self.config.dim)(inputs)
    x = TransformerStack(self.config)(x, mask, deterministic)
    return nn.Dense(OUT)(x)


def build_toy_regressor(model_config, info) -> BuiltModel:
  config = TransformerConfig(
    layers=tuple(model_config.layers), attention={"primal": {"low_rank": 4, "data_dependent": False}},
    max_len=info.seq_len, dim=16, hidden_dim=32, num_heads=2, dropout_rate=0.0, attention_dropout_rate=0.0,
  )  # fmt: skip
  return BuiltModel(ToyRegressor(config), ("inputs", "mask"), task="regression")


def regression_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed, config.distributed, config.mesh_shape, config.init_from = 0, "off", (-1, 1), ""
  config.data = dict(task="toy_regression", batch_size=16, eval_batch_size=24, seed=0)
  config.model = dict(name="toy_regressor", layers=("primal",))
  config.ksvd = dict(eta=0.1, spec="release_sequence")
  config.optimizer = dict(
    name="adam", learning_rate=1e-2, warmup_steps=0, schedule="constant", end_lr_factor=0.0, b1=0.9, b2=0.999,
    eps=1e-8, weight_decay=0.0, grad_clip_norm=0.0,
  )  # fmt: skip
  config.num_epochs, config.total_steps = 0, 36
  config.log_every_steps, config.eval_every_steps, config.eval_every_epochs = 6, 12, 1
  config.checkpoint_every_steps, config.max_to_keep = 100, 2
  config.best_metric, config.test_eval, config.checkpoint_on_eval = "validation/mse", "best_validation", True
  return config


@pytest.fixture
def toy_registered():
  with registered_model("toy_regressor", build_toy_regressor), registered_task("toy_regression", make_toy_pipeline):
    yield


def test_regression_trains_through_the_same_step(toy_registered, tmp_path):
  summary = train_and_evaluate(regression_config(), tmp_path, print_fn=lambda _: None)
  assert summary["steps"] == 36 and summary["test_eval"] == "best_validation"
  losses = train_losses(tmp_path)
  assert losses[-1] < 0.3 * losses[0], losses
  train = read_metrics(tmp_path, dedupe=True, prefix="train")
  assert all(m["scalars"]["ksvd_loss"] > 0 for m in train)  # the regulariser of whichever model sows it
  assert all(m["scalars"]["mse"] == m["scalars"]["task_loss"] for m in train)
  history = json.loads((tmp_path / "eval_history.json").read_text())
  best = min(history[::-1], key=lambda h: h["validation/mse"])  # smaller is better, the latest on ties
  assert summary["best_validation"] == {"step": best["step"], "mse": best["validation/mse"]}
  assert summary["test_at_best_validation"]["step"] == best["step"]
  assert (
    Checkpointer(tmp_path / "checkpoints", best_metric="validation/mse", best_mode="min").best_step() == best["step"]
  )
  test = read_metrics(tmp_path, prefix="test")
  assert len(test) == 1 and test[0]["scalars"]["count"] == sum(len(e["values"]) for e in toy_split(2, 24))
