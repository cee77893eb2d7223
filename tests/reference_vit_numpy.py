"""Independent float64 NumPy `ComboVisionTransformer` of the Primal-Attention CV release (case `cv_primal_deit`).

Written from shared/reference/README.md (Addendum, case 8) without `primal_jax`: timm 0.4.12's
`VisionTransformer` (patch Conv2d with stride P, class token first, pos_embed added to both, pre-norm
blocks with a fused `qkv`, softmax(q k^T p^-0.5) v, exact-GELU MLPs, LayerNorm eps 1e-6, head on the
class token) whose last `num_ksvd_layer` blocks are the release's `models_primal.Block`: fused `qk`
(q = first D outputs), W_e|X from the norm1 output with rows = all N tokens when N <= s * rank_multi,
else torch.linspace(0, N-1, s * rank_multi) (int64). Losses as `engine_primal.train_one_epoch`:
scalar LRA-style J per layer, trace on the raw we, wr. Registered in `reference_torch_numpy.RUNNERS`.
A timm model without Primal blocks is the same code (`forward`), used by the timm converter tests.
"""

from __future__ import annotations

import math

import numpy as np
import reference_torch_numpy as tref

F64 = np.float64
LN_EPS = 1e-6


def layer_norm(x, sd, name):
  x = np.asarray(x, F64)
  mu = x.mean(-1, keepdims=True)
  var = np.square(x - mu).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + LN_EPS) * np.asarray(sd[name + ".weight"], F64) + np.asarray(sd[name + ".bias"], F64)


def patch_embed(images, sd):
  """Conv2d(C, D, kernel=stride=P) on [B, C, H, W], flattened row-major over the patch grid -> [B, G, D]."""
  w = np.asarray(sd["patch_embed.proj.weight"], F64)  # [D, C, P, P]
  dim, _, p, _ = w.shape
  x = np.asarray(images, F64)
  b, c, h, wd = x.shape
  patches = x.reshape(b, c, h // p, p, wd // p, p).transpose(0, 2, 4, 1, 3, 5).reshape(b, (h // p) * (wd // p), -1)
  return patches @ w.reshape(dim, -1).T + np.asarray(sd["patch_embed.proj.bias"], F64)


def softmax_attention(h, sd, prefix, heads):
  qkv = tref.linear(h, sd, prefix + "qkv")
  width = h.shape[-1]
  q, k, v = (tref.split_heads(qkv[..., i * width : (i + 1) * width], heads) for i in range(3))
  w = np.einsum("band,bamd->banm", q, k) / math.sqrt(q.shape[-1])
  return tref.linear(tref.merge_heads(np.einsum("banm,bamd->band", tref.softmax(w), v)), sd, prefix + "proj")


def primal_attention(h, sd, prefix, heads, low_rank, rank_multi):
  """`models_primal.PrimalAttention.forward` (eval): dict(out, escore, rscore, we, wr, Lambda, indices)."""
  batch, length, width = h.shape
  p = width // heads
  qk = tref.linear(h, sd, prefix + "qk")
  q, k = tref.split_heads(qk[..., :width], heads), tref.split_heads(qk[..., width:], heads)  # [B, H, N, p]
  we, wr = np.asarray(sd[prefix + "we"], F64), np.asarray(sd[prefix + "wr"], F64)  # [H, n, s]
  if length > low_rank * rank_multi:
    indices = tref.torch_linspace_int(length - 1, low_rank * rank_multi)
  else:
    indices = np.arange(length)
  assert we.shape[1] == len(indices), (we.shape, len(indices))
  xs = h[:, indices].reshape(batch, len(indices), heads, p).transpose(0, 2, 3, 1)  # [B, H, p, n]
  we_x, wr_x = np.einsum("bapn,ans->baps", xs, we), np.einsum("bapn,ans->baps", xs, wr)
  escore = np.einsum("banp,baps->bans", tref.normalize(q), we_x)
  rscore = np.einsum("banp,baps->bans", tref.normalize(k), wr_x)
  o = tref.linear(np.concatenate([escore, rscore], -1), sd, prefix + "concate_weight")  # [B, H, N, p]
  out = tref.linear(tref.merge_heads(o), sd, prefix + "proj")
  lam = np.asarray(sd[prefix + "Lambda"], F64)
  return dict(out=out, escore=escore, rscore=rscore, We=we, Wr=wr, Lambda=lam, indices=indices)


def forward(sd, cfg, images):
  """Logits, features and per-Primal-block records of a timm / release ViT state_dict."""
  heads = cfg["num_heads"]
  x = patch_embed(images, sd)
  pos = np.asarray(sd["pos_embed"], F64)
  cls = np.asarray(sd["cls_token"], F64) + pos[:, :1]
  x = np.concatenate([np.broadcast_to(cls, (x.shape[0], 1, x.shape[2])), x + pos[:, 1:]], axis=1)
  layers = {}
  i = 0
  while f"blocks.{i}.norm1.weight" in sd:
    prefix = f"blocks.{i}."
    h = layer_norm(x, sd, prefix + "norm1")
    if prefix + "attn.we" in sd:
      layer = primal_attention(h, sd, prefix + "attn.", heads, cfg["low_rank"], cfg["rank_multi"])
      layer["attn_in"] = h
      layers[i] = layer
      attn = layer["out"]
    else:
      attn = softmax_attention(h, sd, prefix + "attn.", heads)
    x = x + attn
    m = tref.gelu(tref.linear(layer_norm(x, sd, prefix + "norm2"), sd, prefix + "mlp.fc1"))
    x = x + tref.linear(m, sd, prefix + "mlp.fc2")
    i += 1
  features = layer_norm(x, sd, "norm")
  return tref.linear(features[:, 0], sd, "head"), features, layers


def combo_vision_transformer(sd, cfg, inputs):
  """Golden outputs of case `cv_primal_deit` (any shape)."""
  logits, features, layers = forward(sd, cfg, inputs["images"])
  labels = np.asarray(inputs["labels"])
  ce = tref.cross_entropy(logits, labels)
  logp = logits - logits.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  smooth = np.mean(0.9 * ce - 0.1 * logp.mean(-1))
  out = dict(logits=logits, features=features, loss_ce=np.asarray(ce.mean()), loss_ce_per_sample=ce)
  out["loss_label_smoothing"] = np.asarray(smooth)
  js = []
  for i, layer in layers.items():
    for key in ("escore", "rscore", "attn_in", "Lambda"):
      out[f"layer{i}/{key}"] = layer[key]
    out[f"layer{i}/attn_out"] = layer["out"]
    out[f"layer{i}/we"], out[f"layer{i}/wr"] = layer["We"], layer["Wr"]
    out["sampled_indices"] = layer["indices"]
    js.append(tref.ksvd_j_lra({**layer, "Lambda": layer["Lambda"]}, trace_no_x=True))
  loss_ksvd = float(np.mean(np.square(js))) if js else 0.0
  out.update(loss_ksvd=np.asarray(loss_ksvd), loss_total=np.asarray(ce.mean() + cfg.get("eta", 0.05) * loss_ksvd))
  return out


def random_state_dict(rng, *, dim, depth, heads, patch, channels, tokens, classes, s, rank_multi, num_primal):
  """A release `ComboVisionTransformer` state_dict: timm blocks, the last `num_primal` release Primal blocks.

  Every entry random (LayerNorms and biases around, not at, their constant init) so a swapped or
  forgotten parameter shows.
  """
  sd = {}
  p = dim // heads
  n = min(tokens, s * rank_multi)

  def linear(name, fan_in, fan_out):
    sd[name + ".weight"] = (rng.standard_normal((fan_out, fan_in)) / np.sqrt(fan_in)).astype(np.float32)
    sd[name + ".bias"] = (0.1 * rng.standard_normal(fan_out)).astype(np.float32)

  def norm(name):
    sd[name + ".weight"] = (1.0 + 0.1 * rng.standard_normal(dim)).astype(np.float32)
    sd[name + ".bias"] = (0.1 * rng.standard_normal(dim)).astype(np.float32)

  sd["cls_token"] = (0.5 * rng.standard_normal((1, 1, dim))).astype(np.float32)
  sd["pos_embed"] = (0.5 * rng.standard_normal((1, tokens, dim))).astype(np.float32)
  fan = channels * patch * patch
  sd["patch_embed.proj.weight"] = (rng.standard_normal((dim, channels, patch, patch)) / np.sqrt(fan)).astype(np.float32)
  sd["patch_embed.proj.bias"] = (0.1 * rng.standard_normal(dim)).astype(np.float32)
  for i in range(depth):
    block = f"blocks.{i}."
    norm(block + "norm1")
    if i >= depth - num_primal:
      for name in ("we", "wr"):
        sd[block + "attn." + name] = (rng.standard_normal((heads, n, s)) / np.sqrt(n)).astype(np.float32)
      sd[block + "attn.Lambda"] = rng.uniform(0.0, 1.0, (heads, s)).astype(np.float32)
      linear(block + "attn.qk", dim, 2 * dim)
      linear(block + "attn.concate_weight", 2 * s, p)
    else:
      linear(block + "attn.qkv", dim, 3 * dim)
    linear(block + "attn.proj", dim, dim)
    norm(block + "norm2")
    linear(block + "mlp.fc1", dim, 4 * dim)
    linear(block + "mlp.fc2", 4 * dim, dim)
  norm("norm")
  linear("head", dim, classes)
  return sd
