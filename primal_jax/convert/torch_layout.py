"""PyTorch state_dict (numpy arrays, torch key names) -> primal_jax parameters.

Conventions (see shared/reference/README.md): a torch Linear stores W [out, in]
and computes x @ W.T + b; our DenseGeneral kernels are W.T reshaped so heads
are an explicit axis (head h owns channels h*p:(h+1)*p, head-major).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

# Role -> torch sub-key of an attention layer, per release code base.
ATTENTION_KEYS = {
  "lra": dict(
    query="W_q", key="W_k", value="W_v", out="ff", combine="attn.concate_weight", We="We", Wr="Wr", Lambda="attn.Lambda"
  ),
  "timeseries": dict(
    query="query_projection",
    key="key_projection",
    value="value_projection",  # softmax layers only
    out="out_projection",
    combine="inner_attention.concate_weight",
    We="We",
    Wr="Wr",
    Lambda="inner_attention.Lambda",
  ),
  "rl": dict(
    query="query_projection",
    key="key_projection",
    out="out_projection",
    combine="concate_weight",
    We="We",
    Wr="Wr",
    Lambda="Lambda",
  ),
  "fairseq": dict(
    query="q_proj", key="k_proj", out="out_proj", combine="concate_weight", We="We", Wr="Wr", Lambda="Lambda"
  ),
}


def _get(state_dict: Mapping[str, np.ndarray], key: str) -> np.ndarray:
  try:
    return np.asarray(state_dict[key], np.float32)
  except KeyError:
    raise KeyError(f"state_dict has no key {key!r}") from None


def dense(state_dict, prefix: str) -> dict:
  """torch Linear `prefix.{weight,bias}` -> Flax Dense {kernel [in, out], bias [out]}."""
  return {"kernel": _get(state_dict, prefix + ".weight").T, "bias": _get(state_dict, prefix + ".bias")}


def layer_norm(state_dict, prefix: str) -> dict:
  return {"scale": _get(state_dict, prefix + ".weight"), "bias": _get(state_dict, prefix + ".bias")}


def embedding(state_dict, key: str) -> dict:
  return {"embedding": _get(state_dict, key)}


def head_projection(state_dict, prefix: str, num_heads: int) -> dict:
  """Linear D -> H*p as DenseGeneral {kernel [D, H, p], bias [H, p]}."""
  w, b = _get(state_dict, prefix + ".weight"), _get(state_dict, prefix + ".bias")
  out_dim, in_dim = w.shape
  if out_dim % num_heads:
    raise ValueError(f"{prefix}.weight has {out_dim} outputs, not divisible by num_heads={num_heads}")
  if b.shape != (out_dim,):
    raise ValueError(f"{prefix}.bias must have its weight's {out_dim} outputs, got shape {list(b.shape)}")
  p = out_dim // num_heads
  return {"kernel": w.T.reshape(in_dim, num_heads, p), "bias": b.reshape(num_heads, p)}


def merge_projection(state_dict, prefix: str, num_heads: int) -> dict:
  """Linear H*p -> D as DenseGeneral over (heads, p): {kernel [H, p, D], bias [D]}."""
  w, b = _get(state_dict, prefix + ".weight"), _get(state_dict, prefix + ".bias")
  if w.ndim != 2 or w.shape[1] % num_heads:
    raise ValueError(f"{prefix}.weight must be [D, H*p] with H*p divisible by num_heads={num_heads}, got {w.shape}")
  out_dim, in_dim = w.shape
  return {"kernel": w.T.reshape(num_heads, in_dim // num_heads, out_dim), "bias": b}


def is_primal_layer(state_dict, prefix: str, layout: str) -> bool:
  return prefix + ATTENTION_KEYS[layout]["We"] in state_dict


def attention_params(state_dict, prefix: str, layout: str, num_heads: int | None = None) -> dict:
  """One attention layer's parameters; Primal if `prefix + We` exists, else softmax.

  Args:
    prefix: torch key prefix of the layer, with trailing dot ("" at top level).
    layout: a key of ATTENTION_KEYS naming the release code base.
    num_heads: required for softmax layers; Primal layers read it from We [H, a, s].
  """
  keys = ATTENTION_KEYS[layout]
  if is_primal_layer(state_dict, prefix, layout):
    we = _get(state_dict, prefix + keys["We"])
    num_heads = we.shape[0]
    params = {
      "We": we,
      "Wr": _get(state_dict, prefix + keys["Wr"]),
      "Lambda": _get(state_dict, prefix + keys["Lambda"]),
      "combine": dense(state_dict, prefix + keys["combine"]),
    }
    roles = ("query", "key")
  else:
    if num_heads is None:
      raise ValueError(f"num_heads is needed for the softmax layer at {prefix!r}")
    params, roles = {}, ("query", "key", "value")
  for role in roles:
    params[role] = head_projection(state_dict, prefix + keys[role], num_heads)
  params["out"] = merge_projection(state_dict, prefix + keys["out"], num_heads)
  return params


def lra_classifier_params(state_dict, num_heads: int) -> tuple[dict, tuple[str, ...]]:
  """The release's LRA `ModelForSC` -> (`SequenceClassifier` params, per-layer attention names)."""
  layers, blocks = [], {}
  while f"model.transformer_{len(layers)}.norm1.weight" in state_dict:
    i = len(layers)
    prefix = f"model.transformer_{i}."
    layers.append("primal" if is_primal_layer(state_dict, prefix + "mha.", "lra") else "softmax")
    blocks[f"block_{i}"] = {
      "norm1": layer_norm(state_dict, prefix + "norm1"),
      "attention": attention_params(state_dict, prefix + "mha.", "lra", num_heads),
      "norm2": layer_norm(state_dict, prefix + "norm2"),
      "mlp": {"fc_in": dense(state_dict, prefix + "mlpblock.0"), "fc_out": dense(state_dict, prefix + "mlpblock.3")},
    }
  if not layers:
    raise ValueError("state_dict has no 'model.transformer_0.*' keys: not an LRA ModelForSC")
  blocks["final_norm"] = layer_norm(state_dict, "model.norm")
  params = {
    "body": {
      "embed": {
        "tokens": embedding(state_dict, "model.embeddings.word_embeddings.weight"),
        "positions": embedding(state_dict, "model.embeddings.position_embeddings.weight"),
      },
      "encoder": blocks,
    },
    "head": {
      "hidden": dense(state_dict, "seq_classifer.mlpblock.0"),
      "logits": dense(state_dict, "seq_classifer.mlpblock.2"),
    },
  }
  return params, tuple(layers)


def conv1x1(state_dict, prefix: str) -> dict:
  """torch Conv1d(kernel_size=1) `prefix.{weight [out, in, 1], bias}` -> Flax Dense: a 1x1 conv is a Linear."""
  w = _get(state_dict, prefix + ".weight")
  if w.ndim != 3 or w.shape[2] != 1:
    raise ValueError(f"{prefix}.weight must be a kernel-size-1 Conv1d weight [out, in, 1], got shape {w.shape}")
  return {"kernel": w[:, :, 0].T, "bias": _get(state_dict, prefix + ".bias")}


def timeseries_classifier_params(state_dict, num_heads: int) -> tuple[dict, tuple[str, ...]]:
  """The release's UEA `PrimalformerClassiregressor` -> (`TimeSeriesClassifier` params, per-layer attention names).

  Covers Trans. (every layer softmax), PrimalFormer (every layer Primal) and
  Primal.+Trans. (softmax then Primal): each layer is named by whether its
  `We` exists. `pos_enc.pe` [max_len, 1, D] is read the same way whether it is
  the learnable parameter or the fixed sinusoidal buffer (both are in the
  state_dict). The EncoderLayer's Conv1d(kernel 1) pair becomes the MLP.

  Args:
    num_heads: H, needed to split the softmax layers' projections (Primal
      layers carry it in We [H, n, s] and must agree).
  """
  layers, blocks = [], {}
  while f"encoder.attn_layers.{len(layers)}.norm1.weight" in state_dict:
    i = len(layers)
    prefix = f"encoder.attn_layers.{i}."
    primal = is_primal_layer(state_dict, prefix + "attention.", "timeseries")
    if primal and _get(state_dict, prefix + "attention.We").shape[0] != num_heads:
      heads = _get(state_dict, prefix + "attention.We").shape[0]
      raise ValueError(f"{prefix}attention.We has {heads} heads but num_heads={num_heads}")
    layers.append("primal" if primal else "softmax")
    blocks[f"block_{i}"] = {
      "attention": attention_params(state_dict, prefix + "attention.", "timeseries", num_heads),
      "norm1": layer_norm(state_dict, prefix + "norm1"),
      "mlp": {"fc_in": conv1x1(state_dict, prefix + "conv1"), "fc_out": conv1x1(state_dict, prefix + "conv2")},
      "norm2": layer_norm(state_dict, prefix + "norm2"),
    }
  if not layers:
    raise ValueError("state_dict has no 'encoder.attn_layers.0.*' keys: not a time-series PrimalformerClassiregressor")
  blocks["final_norm"] = layer_norm(state_dict, "encoder.norm")
  pe = _get(state_dict, "pos_enc.pe")
  if pe.ndim != 3 or pe.shape[1] != 1:
    raise ValueError(f"pos_enc.pe must have shape [max_len, 1, d_model], got {pe.shape}")
  max_len, dim = pe.shape[0], pe.shape[2]
  head = dense(state_dict, "output_layer")
  if head["kernel"].shape[0] != max_len * dim:
    # The head flattens [max_len, D]; a mismatch means pe and output_layer come from different models.
    raise ValueError(
      f"output_layer takes {head['kernel'].shape[0]} inputs, expected max_len * d_model = {max_len} * {dim}"
    )
  params = {
    "input_projection": dense(state_dict, "project_inp"),
    "positions": pe[:, 0, :],  # [max_len, D]
    "encoder": blocks,
    "logits": head,
  }
  return params, tuple(layers)
