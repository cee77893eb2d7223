"""Tiny models, configs and batches shared by the training tests."""

from __future__ import annotations

import types

import ml_collections
import numpy as np

from primal_jax.models.config import model_layers

TINY_INFO = types.SimpleNamespace(seq_len=10, num_classes=3, num_features=4)


def tiny_model_config(model_name: str = "primalformer", **overrides) -> ml_collections.ConfigDict:
  model = dict(
    name="timeseries",
    layers=model_layers(model_name, 2),
    attention={"primal": dict(low_rank=3, rank_multi=2)},
    dim=16,
    hidden_dim=32,
    num_heads=4,
    dropout_rate=0.1,
    attention_dropout_rate=0.1,
  )
  model.update(overrides)
  return ml_collections.ConfigDict(model)


def tiny_optimizer_config(name: str = "radam", **overrides) -> ml_collections.ConfigDict:
  opt = dict(
    name=name,
    learning_rate=1e-3,
    warmup_steps=0,
    schedule="constant",
    end_lr_factor=0.0,
    b1=0.9,
    b2=0.999,
    eps=1e-8,
    weight_decay=0.0,
    grad_clip_norm=0.0,
  )
  opt.update(overrides)
  return ml_collections.ConfigDict(opt)


def random_batch(seed: int, batch: int = 8, info=TINY_INFO) -> dict[str, np.ndarray]:
  """A padded batch: lengths 3..seq_len, weights 1 except the last row (a padding example)."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, info.seq_len + 1, batch)
  mask = np.arange(info.seq_len)[None, :] < lengths[:, None]
  inputs = rng.normal(size=(batch, info.seq_len, info.num_features)).astype(np.float32) * mask[..., None]
  weight = np.ones(batch, np.float32)
  weight[-1] = 0.0
  return {
    "inputs": inputs,
    "mask": mask,
    "label": rng.integers(0, info.num_classes, batch).astype(np.int32),
    "weight": weight,
    "index": np.arange(batch, dtype=np.int64),
  }
