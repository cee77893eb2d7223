"""ViT state_dicts (timm `VisionTransformer`, the release's `ComboVisionTransformer`) -> `VisionTransformer` params.

One layout covers both: timm's keys (`cls_token`, `pos_embed`, `patch_embed.proj`, `blocks.<i>.{norm1,
attn, norm2, mlp.fc1, mlp.fc2}`, `norm`, `head`; torch Linear weights [out, in]) with, per block,

  * softmax: a fused `attn.qkv` [3D, D] (rows q | k | v, heads contiguous inside each) and `attn.proj`;
  * Primal (the release's `models_primal.PrimalAttention`): a fused `attn.qk` [2D, D] (q | k; no value
    projection), `attn.we`, `attn.wr` [H, n, s], `attn.Lambda` [H, s], `attn.concate_weight` (2s -> p)
    and `attn.proj`.

Checkpoints with parts this model does not have (a distillation token, layer scale, register tokens, a
pre-logits layer, global average pooling's fc_norm) are refused by name rather than silently dropped.
"""

from __future__ import annotations

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np

from primal_jax.convert.torch_layout import _get, dense, layer_norm, merge_projection
from primal_jax.ksvd import RELEASE_LRA, ksvd_loss
from primal_jax.models.config import TransformerConfig
from primal_jax.models.vit import DEIT_BODY, VisionTransformer
from primal_jax.sampling import release_sample_indices

# timm names of parts our ViT lacks -> what they are (a state_dict holding one is refused).
UNSUPPORTED = {
  "dist_token": "DeiT's distillation token (deit_*_distilled_*)",
  "head_dist": "DeiT's distillation head",
  "reg_token": "register tokens",
  "fc_norm": "global-average-pooling norm (global_pool='avg')",
  "norm_pre": "a pre-blocks norm (CLIP-style ViTs)",
  "pre_logits": "a representation (pre-logits) layer",
  ".ls1.": "layer scale",
  ".ls2.": "layer scale",
  "attn_pool": "attention pooling",
}
_KNOWN = re.compile(
  r"(cls_token|pos_embed|patch_embed\.proj\.(weight|bias)|norm\.(weight|bias)|head\.(weight|bias)"
  r"|blocks\.\d+\.(norm1|norm2|mlp\.fc1|mlp\.fc2|attn\.qkv|attn\.qk|attn\.proj|attn\.concate_weight)\.(weight|bias)"
  r"|blocks\.\d+\.attn\.(we|wr|Lambda))"
)


def check_keys(state_dict) -> None:
  """ValueError naming keys this ViT cannot represent (module doc) or does not know."""
  for key in state_dict:
    for part, what in UNSUPPORTED.items():
      if part in key:
        raise ValueError(f"state_dict key {key!r}: {what} is not supported by primal_jax's VisionTransformer")
  unknown = sorted(k for k in state_dict if not _KNOWN.fullmatch(k))
  if unknown:
    raise ValueError(f"state_dict has keys this ViT does not know: {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")


_LEAF_KEY = {"kernel": "weight", "scale": "weight", "bias": "bias"}
_BLOCK_PART = {
  "norm1": "norm1", "norm2": "norm2", "mlp/fc_in": "mlp.fc1", "mlp/fc_out": "mlp.fc2", "attention/out": "attn.proj",
  "attention/combine": "attn.concate_weight", "attention/We": "attn.we", "attention/Wr": "attn.wr",
  "attention/Lambda": "attn.Lambda",
}  # fmt: skip


def state_dict_key(path: str, primal: bool = False) -> str:
  """The timm state_dict key a `VisionTransformer` parameter (`encoder/block_0/mlp/fc_in/kernel`) is read from
  (`primal`: the block is a release Primal block, whose query and key come from the fused `attn.qk`)."""
  parts = path.split("/")
  if parts[0] in ("cls_token", "pos_embed"):
    return parts[0]
  if parts[0] in ("patch_embed", "head"):
    return f"{'patch_embed.proj' if parts[0] == 'patch_embed' else 'head'}.{_LEAF_KEY[parts[-1]]}"
  if parts[:2] == ["encoder", "final_norm"]:
    return f"norm.{_LEAF_KEY[parts[-1]]}"
  block = parts[1].removeprefix("block_")
  part = "/".join(parts[2:])
  if part in _BLOCK_PART:  # We, Wr, Lambda: the leaf is the parameter
    return f"blocks.{block}.{_BLOCK_PART[part]}"
  module, role = "/".join(parts[2:-1]), parts[-2]
  if role in ("query", "key", "value"):
    return f"blocks.{block}.attn.{'qk' if primal else 'qkv'}.{_LEAF_KEY[parts[-1]]} ({role} rows)"
  return f"blocks.{block}.{_BLOCK_PART[module]}.{_LEAF_KEY[parts[-1]]}"


def _split_fused(state_dict, prefix: str, roles: tuple[str, ...], num_heads: int) -> dict:
  """A fused Linear [len(roles) * D, D] (roles stacked along the outputs) -> one DenseGeneral per role."""
  w, b = _get(state_dict, prefix + ".weight"), _get(state_dict, prefix + ".bias")
  out_dim, width = w.shape
  if out_dim != len(roles) * width:
    raise ValueError(f"{prefix}.weight must be [{len(roles)}D, D], got {w.shape}")
  if b.shape != (out_dim,):
    raise ValueError(f"{prefix}.bias must be [{len(roles)}D] = [{out_dim}] as its weight, got {list(b.shape)}")
  if width % num_heads:
    raise ValueError(f"{prefix}: width {width} is not divisible by num_heads={num_heads}")
  p = width // num_heads
  params = {}
  for i, role in enumerate(roles):
    rows = slice(i * width, (i + 1) * width)
    params[role] = {"kernel": w[rows].T.reshape(width, num_heads, p), "bias": b[rows].reshape(num_heads, p)}
  return params


def _attention(state_dict, prefix: str, num_heads: int) -> tuple[dict, str | tuple]:
  """One block's attention params and its layer entry for `TransformerConfig.layers`."""
  if prefix + "we" not in state_dict:
    params = _split_fused(state_dict, prefix + "qkv", ("query", "key", "value"), num_heads)
    params["out"] = merge_projection(state_dict, prefix + "proj", num_heads)
    return params, "softmax"
  we = _get(state_dict, prefix + "we")
  heads, rows, low_rank = we.shape
  if heads != num_heads:
    raise ValueError(f"{prefix}we has {heads} heads but num_heads={num_heads}")
  params = _split_fused(state_dict, prefix + "qk", ("query", "key"), num_heads)
  params.update(
    We=we,
    Wr=_get(state_dict, prefix + "wr"),
    Lambda=_get(state_dict, prefix + "Lambda"),
    combine=dense(state_dict, prefix + "concate_weight"),
    out=merge_projection(state_dict, prefix + "proj", num_heads),
  )
  return params, ("primal", {"low_rank": low_rank, "num_samples": rows, "data_dependent": True})


def vit_params(state_dict, num_heads: int) -> tuple[dict, tuple, dict]:
  """A timm / release ViT state_dict -> (`VisionTransformer` params, per-layer attention entries, sizes).

  Args:
    num_heads: H (the fused projections do not carry it; Primal blocks' `we` must agree).
  Returns:
    params; layers ("softmax" or the Primal entry with its s and n); sizes {"dim", "hidden_dim",
    "patch_size", "channels", "num_tokens", "num_classes" (0 without a head: its params then have no "head",
    which fine-tuning initialises), "image_size" (None unless the grid is square)}.
  """
  check_keys(state_dict)
  blocks, layers = {}, []
  while f"blocks.{len(layers)}.norm1.weight" in state_dict:
    i = len(layers)
    prefix = f"blocks.{i}."
    attention, entry = _attention(state_dict, prefix + "attn.", num_heads)
    layers.append(entry)
    blocks[f"block_{i}"] = {
      "norm1": layer_norm(state_dict, prefix + "norm1"),
      "attention": attention,
      "norm2": layer_norm(state_dict, prefix + "norm2"),
      "mlp": {"fc_in": dense(state_dict, prefix + "mlp.fc1"), "fc_out": dense(state_dict, prefix + "mlp.fc2")},
    }
  if not layers:
    raise ValueError("state_dict has no 'blocks.0.*' keys: not a timm VisionTransformer")
  blocks["final_norm"] = layer_norm(state_dict, "norm")
  conv = _get(state_dict, "patch_embed.proj.weight")  # [D, C, P, P]
  if conv.ndim != 4 or conv.shape[2] != conv.shape[3]:
    raise ValueError(f"patch_embed.proj.weight must be [D, C, P, P], got {conv.shape}")
  pos = _get(state_dict, "pos_embed")  # [1, N, D]
  params = {
    "patch_embed": {"kernel": conv.transpose(2, 3, 1, 0), "bias": _get(state_dict, "patch_embed.proj.bias")},
    "cls_token": _get(state_dict, "cls_token"),
    "pos_embed": pos,
    "encoder": blocks,
  }
  if "head.weight" in state_dict:  # a headless checkpoint (num_classes=0, e.g. self-supervised) has none
    params["head"] = dense(state_dict, "head")
  grid = math.isqrt(pos.shape[1] - 1)
  sizes = {
    "dim": conv.shape[0],
    "hidden_dim": blocks["block_0"]["mlp"]["fc_in"]["kernel"].shape[1],
    "patch_size": conv.shape[2],
    "channels": conv.shape[1],
    "num_tokens": pos.shape[1],
    "num_classes": params["head"]["kernel"].shape[1] if "head" in params else 0,
    "image_size": grid * conv.shape[2] if grid * grid == pos.shape[1] - 1 else None,
  }
  return params, tuple(layers), sizes


def model_from_state_dict(state_dict, num_heads: int, *, drop_path_rate: float = 0.0, **overrides):
  """(VisionTransformer, params) with every size read from the state_dict (a square patch grid)."""
  params, layers, sizes = vit_params(state_dict, num_heads)
  if sizes["image_size"] is None:
    raise ValueError(f"pos_embed has {sizes['num_tokens'] - 1} patch rows: not a square grid")
  if not sizes["num_classes"]:
    raise ValueError("the state_dict has no head (num_classes=0): it can be fine-tuned from, not run as is")
  fields = dict(
    layers=layers,
    dim=sizes["dim"],
    hidden_dim=sizes["hidden_dim"],
    num_heads=num_heads,
    num_classes=sizes["num_classes"],
    drop_path_rate=drop_path_rate,
  )
  config = TransformerConfig(**{**DEIT_BODY, **fields, **overrides})
  return VisionTransformer(config, image_size=sizes["image_size"], patch_size=sizes["patch_size"]), params


def nchw_to_nhwc(images) -> np.ndarray:
  """torch images [B, C, H, W] -> ours [B, H, W, C]."""
  return np.transpose(np.asarray(images), (0, 2, 3, 1))


def label_smoothing_cross_entropy(logits, labels, smoothing: float = 0.1) -> jax.Array:
  """timm's `LabelSmoothingCrossEntropy`: (1 - eps) * NLL + eps * mean_c(-log p_c), batch mean ([])."""
  logp = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]
  return jnp.mean((1.0 - smoothing) * nll - smoothing * jnp.mean(logp, axis=-1))


def _captured(tree, *path):
  for key in path:
    tree = tree[key]
  return tree[0]


def run_combo_vision_transformer(case) -> dict:
  """The release's `ComboVisionTransformer` forward and `engine_primal.train_one_epoch`'s losses (`cv_primal_deit`).

  Sizes come from the state_dict (heads and eta from the case config), so any image size, patch, width,
  depth, s, rank_multi and number of Primal blocks works, the sampling branch (N > s * rank_multi) included.
  """
  cfg = case.meta["config"]
  model, params = model_from_state_dict(case.params, cfg["num_heads"])
  images = jnp.asarray(nchw_to_nhwc(case.inputs["images"]))
  labels = jnp.asarray(case.inputs["labels"], jnp.int32)
  primal = [i for i, spec in enumerate(model.config.layers) if spec.attention == "primal"]
  wanted = {("encoder", "final_norm")} | {("encoder", f"block_{i}", m) for i in primal for m in ("norm1", "attention")}

  def capture(module, method_name):
    return method_name == "__call__" and tuple(module.path) in wanted

  forward = jax.jit(functools.partial(model.apply, mutable=["ksvd", "intermediates"], capture_intermediates=capture))
  logits, state = forward({"params": params}, images)
  inter = state["intermediates"]["encoder"]
  ce = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, labels[:, None], -1)[:, 0]
  out = dict(
    logits=logits,
    features=_captured(inter, "final_norm", "__call__"),
    loss_ce_per_sample=ce,
    loss_ce=jnp.mean(ce),
    loss_label_smoothing=label_smoothing_cross_entropy(logits, labels, 0.1),
  )
  out["loss_total"] = out["loss_ce"]
  for i in primal:
    block, attention = inter[f"block_{i}"], params["encoder"][f"block_{i}"]["attention"]
    out[f"layer{i}/escore"] = _captured(block, "attention", "escore")
    out[f"layer{i}/rscore"] = _captured(block, "attention", "rscore")
    out[f"layer{i}/attn_in"] = _captured(block, "norm1", "__call__")
    out[f"layer{i}/attn_out"] = _captured(block, "attention", "__call__")
    out[f"layer{i}/we"], out[f"layer{i}/wr"] = attention["We"], attention["Wr"]
    out[f"layer{i}/Lambda"] = attention["Lambda"]
    out["sampled_indices"] = release_sample_indices(model.num_tokens, attention["We"].shape[1])
  if primal:  # one scalar J per layer from batch means, trace on the raw we, wr; mean of J^2 over layers
    out["loss_ksvd"] = ksvd_loss(state["ksvd"], RELEASE_LRA)
    out["loss_total"] = out["loss_ce"] + cfg.get("eta", 0.05) * out["loss_ksvd"]
  return {k: np.asarray(v) for k, v in out.items()}
