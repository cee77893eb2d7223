"""Golden cases of the release's baseline attentions (shared/reference/baselines): its LRA `ModelForSC` with
each baseline `attn_type`, and its RL `Flowformer_attention` layer.

Every size and option is read from the case: the release's attn_type picks the registered mechanism in its
`form="release"`, its config the options (linformer_k, num_landmarks, conv_kernel_size, rp_dim, num_hash),
the state_dict the shapes. Random state the release draws (Performer's feature matrices, Reformer's
rotations) is fed through the `random_state` collection.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from primal_jax.attention.baselines.common import RANDOM_STATE_COLLECTION
from primal_jax.attention.baselines.flowformer import FlowformerAttention
from primal_jax.convert import torch_layout
from primal_jax.errors import ConfigError
from primal_jax.models import SequenceClassifier, TransformerConfig


def release_attention(cfg: dict, lsh: dict | None = None) -> tuple[str, dict] | None:
  """(registered name, options) of the release's LRA `attn_type` (attentions/attention.py's dispatch), or None
  for softmax and Primal (handled by `cases.run_lra_classifier`). `lsh`: the case's Reformer settings (its
  JSON's "random_state": chunk_length, lsh_num_chunks_before/after, num_buckets); HF's defaults otherwise."""
  kind = cfg.get("attn_type", "softmax")
  release = {"form": "release"}
  if kind == "cos":
    return "cosformer", release
  if kind.startswith("linear"):
    return "linear", release
  if kind.startswith("linformer"):
    return "linformer", {**release, "linformer_k": int(cfg["linformer_k"])}
  if kind.startswith("nystrom"):
    options = {"num_landmarks": int(cfg["num_landmarks"]), "conv_kernel_size": int(cfg.get("conv_kernel_size", 0))}
    return "nystromformer", {**release, **options}
  if kind.startswith("performer"):
    return "performer", {**release, "num_features": int(cfg["rp_dim"])}
  if kind.startswith("reformer"):
    lsh = lsh or {}
    options = {
      "num_hashes": int(cfg["num_hash"]),
      "chunk_length": int(lsh.get("chunk_length", 64)),
      "num_chunks_before": int(lsh.get("lsh_num_chunks_before", 1)),
      "num_chunks_after": int(lsh.get("lsh_num_chunks_after", 0)),
    }
    if lsh.get("num_buckets"):
      options["num_buckets"] = int(lsh["num_buckets"])
    return "reformer", options
  return None


def _get(state_dict, key: str) -> np.ndarray:
  try:
    return np.asarray(state_dict[key], np.float32)
  except KeyError:
    raise KeyError(f"state_dict has no key {key!r}") from None


def _attention_extras(name: str, state_dict, inputs, layer: int, attention: dict) -> dict:
  """Adds the mechanism's own parameters to `attention` (in place); returns its random_state entries."""
  prefix = f"model.transformer_{layer}.mha."
  if name == "linformer":
    attention["E"] = _get(state_dict, prefix + "attn.E")  # [H, k, N]; one class-level E shared by the layers
  elif name == "nystromformer" and prefix + "attn.conv.weight" in state_dict:
    weight = _get(state_dict, prefix + "attn.conv.weight")  # Conv2d(H, H, (K, 1), groups=H): [H, 1, K, 1]
    attention["conv"] = weight[:, 0, :, 0].T  # [K, H]
  elif name == "performer":
    return {"projection": _get(state_dict, prefix + "attn.attn_fn.projection_matrix")}  # [m, p]
  elif name == "reformer":
    # LSH projections have no bias (W_q.bias, W_v.bias are unused by the release): zero ours.
    attention["query"]["bias"] = np.zeros_like(attention["query"]["bias"])
    attention["value"]["bias"] = np.zeros_like(attention["value"]["bias"])
    key = f"layer{layer}/random_rotations"
    if key not in inputs:
      raise KeyError(f"the case has no input {key!r} (the rotations the release drew)")
    return {"rotations": np.asarray(inputs[key], np.float32)}
  return {}


def run_lra_baseline(case, name: str, options: dict) -> dict[str, np.ndarray]:
  """The release's LRA `ModelForSC` with a baseline attention in every layer, in its release form."""
  cfg = case.meta["config"]
  heads = cfg["num_head"]
  params, layers = torch_layout.lra_classifier_params(case.params, heads)
  random_state = {}
  for i in range(len(layers)):
    attention = params["body"]["encoder"][f"block_{i}"]["attention"]
    extra = _attention_extras(name, case.params, case.inputs, i, attention)
    if extra:
      random_state.setdefault("body", {}).setdefault("encoder", {})[f"block_{i}"] = {"attention": extra}
  config = TransformerConfig(
    layers=(name,) * len(layers),
    vocab_size=cfg["vocab_size"],
    max_len=params["body"]["embed"]["positions"]["embedding"].shape[0],
    dim=cfg["transformer_dim"],
    hidden_dim=cfg["transformer_hidden_dim"],
    num_heads=heads,
    attention={name: options},
    pooling={"MEAN": "mean", "CLS": "cls"}[cfg["pooling_mode"]],
    num_classes=cfg["num_classes"],
  )
  if cfg["pooling_mode"] == "CLS":
    raise ConfigError(f"case {case.name!r}: CLS pooling is not supported for the baseline cases")
  tokens = jnp.asarray(case.inputs["input_ids"], jnp.int32)
  mask = jnp.asarray(case.inputs["mask"], jnp.float32)
  variables = {"params": params}
  if random_state:
    variables[RANDOM_STATE_COLLECTION] = random_state

  def is_attention(module, method_name):
    return method_name == "__call__" and module.name == "attention"

  logits, state = SequenceClassifier(config).apply(
    variables, tokens, mask, mutable=["intermediates"], capture_intermediates=is_attention
  )
  labels = jnp.asarray(case.inputs["label"], jnp.int32)
  loss = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, labels[:, None], -1)[:, 0]
  out = {"logits": logits, "loss": loss, "encoder_out": state["intermediates"]["encoder_out"][0]}
  blocks = state["intermediates"]["body"]["encoder"]
  for i in range(len(layers)):
    attn = blocks[f"block_{i}"]["attention"]
    out[f"layer{i}/attn_out"] = attn["__call__"][0]
    for key in ("buckets", "sorted_bucket_idx"):
      if key in attn:
        out[f"layer{i}/{key}"] = attn[key][0]
  return out


def run_flowformer_layer(case) -> dict[str, np.ndarray]:
  """The release's RL `Flowformer_attention` (causal, mask ignored) on the case's input."""
  cfg = case.meta["config"]
  params = torch_layout.attention_params(case.params, "", "timeseries", cfg["n_heads"])
  module = FlowformerAttention(num_heads=cfg["n_heads"], causal=True, form="release", eps=cfg.get("eps", 1e-6))
  return {"out": module.apply({"params": params}, jnp.asarray(case.inputs["x"]))}
