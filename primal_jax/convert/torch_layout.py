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
  p = out_dim // num_heads
  return {"kernel": w.T.reshape(in_dim, num_heads, p), "bias": b.reshape(num_heads, p)}


def merge_projection(state_dict, prefix: str, num_heads: int) -> dict:
  """Linear H*p -> D as DenseGeneral over (heads, p): {kernel [H, p, D], bias [D]}."""
  w, b = _get(state_dict, prefix + ".weight"), _get(state_dict, prefix + ".bias")
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
