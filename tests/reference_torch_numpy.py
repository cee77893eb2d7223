"""Independent float64 NumPy re-implementation of the authors' PyTorch release modules.

Written from shared/reference/README.md ("The primal attention layer", "KSVD
regulariser" and the per-case key tables) without calling `primal_jax`, so the
converter tests can build golden outputs for cases of any shape. Every function
takes the torch `state_dict` (torch key names, torch layouts) and the case's
JSON `config`, and returns the outputs under the golden key names of the
reference folder. Everything is computed in float64.

Conventions (README "Conventions you must match"): torch Linear y = x W^T + b,
LayerNorm eps 1e-5 with biased variance, exact erf GELU, F.normalize with eps
1e-12, torch.linspace(..., dtype=int64) sampling, cross entropy
logsumexp - logit[label].
"""

from __future__ import annotations

import math

import numpy as np

F64 = np.float64
LN_EPS = 1e-5
NORMALIZE_EPS = 1e-12
MASK_PENALTY = 1e6
FAIRSEQ_CRITERION_ETA = 0.1  # the release's fairseq CrossEntropyCriterion constant

# Torch sub-keys of one attention layer per release code base (README key tables).
LAYOUTS = {
  "lra": dict(
    q="W_q", k="W_k", v="W_v", out="ff", We="We", Wr="Wr", Lambda="attn.Lambda", combine="attn.concate_weight"
  ),
  "timeseries": dict(
    q="query_projection",
    k="key_projection",
    out="out_projection",
    We="We",
    Wr="Wr",
    Lambda="inner_attention.Lambda",
    combine="inner_attention.concate_weight",
  ),
  "rl": dict(
    q="query_projection",
    k="key_projection",
    out="out_projection",
    We="We",
    Wr="Wr",
    Lambda="Lambda",
    combine="concate_weight",
  ),
  "fairseq": dict(q="q_proj", k="k_proj", out="out_proj", We="We", Wr="Wr", Lambda="Lambda", combine="concate_weight"),
}


# ----------------------------------------------------------------------------- torch primitives


def linear(x, sd, name):
  """torch nn.Linear `name`: x @ W.T + b with W [out, in]."""
  w = np.asarray(sd[name + ".weight"], F64)
  b = np.asarray(sd[name + ".bias"], F64)
  return np.asarray(x, F64) @ w.T + b


def layer_norm(x, sd, name):
  """torch nn.LayerNorm: biased variance, eps 1e-5, `weight` scale and `bias`."""
  x = np.asarray(x, F64)
  mu = x.mean(-1, keepdims=True)
  var = np.square(x - mu).mean(-1, keepdims=True)
  w = np.asarray(sd[name + ".weight"], F64)
  b = np.asarray(sd[name + ".bias"], F64)
  return (x - mu) / np.sqrt(var + LN_EPS) * w + b


_ERF = np.frompyfunc(math.erf, 1, 1)


def gelu(x):
  """torch nn.GELU() (exact erf form, math.erf elementwise)."""
  x = np.asarray(x, F64)
  return 0.5 * x * (1.0 + _ERF(x / math.sqrt(2.0)).astype(F64))


def normalize(v):
  """torch F.normalize(v, p=2, dim=-1)."""
  norm = np.sqrt(np.sum(np.square(v), axis=-1, keepdims=True))
  return v / np.maximum(norm, NORMALIZE_EPS)


def torch_linspace_int(end: int, steps: int) -> np.ndarray:
  """torch.linspace(0, end, steps, dtype=torch.int64) on CPU.

  The kernel computes in double: position i < steps // 2 is `start + i * step`,
  the rest `end - (steps - 1 - i) * step` with step = (end - start) / (steps - 1);
  the cast to int64 truncates toward zero.
  """
  if steps == 1:
    return np.zeros(1, np.int64)
  step = (end - 0.0) / (steps - 1)
  values = []
  for i in range(steps):
    v = 0.0 + i * step if i < steps // 2 else end - (steps - 1 - i) * step
    values.append(int(v))  # int() truncates toward zero like the C++ cast
  return np.asarray(values, np.int64)


def cross_entropy(logits, labels):
  """CrossEntropyLoss(reduction='none'): logsumexp(logits) - logits[label]."""
  logits = np.asarray(logits, F64)
  top = logits.max(-1, keepdims=True)
  lse = np.log(np.sum(np.exp(logits - top), -1)) + top[:, 0]
  return lse - logits[np.arange(len(labels)), np.asarray(labels)]


def softmax(z, axis=-1):
  z = z - z.max(axis, keepdims=True)
  e = np.exp(z)
  return e / e.sum(axis, keepdims=True)


def split_heads(y, heads):
  """[B, N, H*p] -> [B, H, N, p]: head a owns channels a*p ... (a+1)*p - 1."""
  b, n, width = y.shape
  return y.reshape(b, n, heads, width // heads).transpose(0, 2, 1, 3)


def merge_heads(o):
  """[B, H, N, p] -> [B, N, H*p] head-major."""
  b, h, n, p = o.shape
  return o.transpose(0, 2, 1, 3).reshape(b, n, h * p)


# ----------------------------------------------------------------------------- primal attention layer


def primal_layer(h, sd, prefix, layout, *, causal=False, mask=None):
  """README "The primal attention layer", steps 1-7.

  Args:
    h: [B, N, D] layer input (the LayerNorm output in the LRA models).
    sd: torch state_dict; prefix: key prefix of the layer ("" at top level).
    layout: key of LAYOUTS.
    causal: running means of q and k before the feature map (RL, NLP); the
      projection weights are then data-independent.
    mask: [B, N] (LRA only) multiplies the per-head outputs.
  Returns:
    dict(out [B, N, D], escore, rscore [B, H, N, s], we_x, wr_x [B, H, p, s],
    We, Wr, Lambda), all float64.
  """
  keys = LAYOUTS[layout]
  h = np.asarray(h, F64)
  we = np.asarray(sd[prefix + keys["We"]], F64)
  wr = np.asarray(sd[prefix + keys["Wr"]], F64)
  lam = np.asarray(sd[prefix + keys["Lambda"]], F64)
  heads = we.shape[0]
  batch, length, width = h.shape
  q = split_heads(linear(h, sd, prefix + keys["q"]), heads)  # [B, H, N, p]
  k = split_heads(linear(h, sd, prefix + keys["k"]), heads)
  p = q.shape[-1]
  if causal:
    counts = np.arange(1, length + 1, dtype=F64)[None, None, :, None]
    q = np.cumsum(q, axis=2) / counts
    k = np.cumsum(k, axis=2) / counts
  phi_q, phi_k = normalize(q), normalize(k)
  if causal:  # data-independent: W_e|X = We [H, p, s]
    assert we.shape[1] == p, (we.shape, p)
    we_x = np.broadcast_to(we[None], (batch,) + we.shape)
    wr_x = np.broadcast_to(wr[None], (batch,) + wr.shape)
    sampled = None
  else:  # data-dependent: Xs[b, a] = h[b, idx, a*p:(a+1)*p]^T  [p, n]
    n = we.shape[1]
    sampled = torch_linspace_int(length - 1, n)
    xs = np.stack([h[:, sampled, a * p : (a + 1) * p].transpose(0, 2, 1) for a in range(heads)], axis=1)  # [B,H,p,n]
    we_x = np.einsum("bapn,ans->baps", xs, we)
    wr_x = np.einsum("bapn,ans->baps", xs, wr)
  escore = np.einsum("banp,baps->bans", phi_q, we_x)
  rscore = np.einsum("banp,baps->bans", phi_k, wr_x)
  o = linear(np.concatenate([escore, rscore], -1), sd, prefix + keys["combine"])  # [B, H, N, p]
  if mask is not None:
    o = o * np.asarray(mask, F64)[:, None, :, None]
  out = linear(merge_heads(o), sd, prefix + keys["out"])
  return dict(
    out=out, escore=escore, rscore=rscore, we_x=we_x, wr_x=wr_x, We=we, Wr=wr, Lambda=lam, sampled_indices=sampled
  )


# ----------------------------------------------------------------------------- KSVD regulariser


def _quadratic(score, lam):
  """||score[b, a, i] * Lambda[a]||^2 (Lambda enters squared): [B, H, N]."""
  return np.sum(np.square(score * lam[None, :, None, :]), -1)


def trace_params(layer):
  """T = (1/H) sum_a trace(We[a]^T Wr[a]) on the raw parameters."""
  we, wr = layer["We"], layer["Wr"]
  return float(np.mean([np.trace(we[a].T @ wr[a]) for a in range(we.shape[0])]))


def trace_data(layer):
  """(1/(B H)) sum_{b,a} trace(W_e|X[b,a]^T W_r|X[b,a]) (LRA trace_no_x=False)."""
  we_x, wr_x = layer["we_x"], layer["wr_x"]
  b, h = we_x.shape[:2]
  return float(np.mean([[np.trace(we_x[i, a].T @ wr_x[i, a]) for a in range(h)] for i in range(b)]))


def ksvd_j_lra(layer, trace_no_x=True):
  """LRA scalar J = mean_{b,a,i}(qe)/2 + mean_{b,a,i}(qr)/2 - T."""
  qe, qr = _quadratic(layer["escore"], layer["Lambda"]), _quadratic(layer["rscore"], layer["Lambda"])
  trace = trace_params(layer) if trace_no_x else trace_data(layer)
  return qe.mean() / 2 + qr.mean() / 2 - trace


def ksvd_j_per_sample(layer):
  """TimeSeries / RL / NLP: J[b] = mean_{a,i}(qe[b])/2 + mean_{a,i}(qr[b])/2 - T  [B]."""
  qe, qr = _quadratic(layer["escore"], layer["Lambda"]), _quadratic(layer["rscore"], layer["Lambda"])
  return qe.mean(axis=(1, 2)) / 2 + qr.mean(axis=(1, 2)) / 2 - trace_params(layer)


# ----------------------------------------------------------------------------- LRA ModelForSC


def lra_softmax_attention(h, sd, prefix, mask, num_heads, head_dim):
  """The release's LRA SoftmaxAttention inside `Attention` (keys W_q, W_k, W_v, ff)."""
  q = split_heads(linear(h, sd, prefix + "W_q"), num_heads)
  k = split_heads(linear(h, sd, prefix + "W_k"), num_heads)
  v = split_heads(linear(h, sd, prefix + "W_v"), num_heads)
  dot = np.einsum("band,bamd->banm", q, k) / math.sqrt(head_dim)
  dot = dot - MASK_PENALTY * (1.0 - np.asarray(mask, F64)[:, None, None, :])
  return linear(merge_heads(np.einsum("banm,bamd->band", softmax(dot), v)), sd, prefix + "ff")


def append_cls(input_ids, mask, vocab_size):
  """The release's `append_cls` (pooling_mode CLS): id vocab_size-1 first, last token dropped."""
  b = input_ids.shape[0]
  ids = np.concatenate([np.full((b, 1), vocab_size - 1, input_ids.dtype), input_ids[:, :-1]], 1)
  mask = np.concatenate([np.ones((b, 1), mask.dtype), mask[:, :-1]], 1)
  return ids, mask


def lra_classifier(sd, cfg, inputs):
  """`ModelForSC(config)(input_ids, mask, label)` of either LRA tree; golden output dict."""
  ids = np.asarray(inputs["input_ids"])
  mask = np.asarray(inputs["mask"], F64)
  label = np.asarray(inputs["label"])
  if cfg["pooling_mode"] == "CLS":
    ids, mask = append_cls(ids, mask, cfg["vocab_size"])
  batch, length = ids.shape
  heads, head_dim = cfg["num_head"], cfg["head_dim"]
  x = np.asarray(sd["model.embeddings.word_embeddings.weight"], F64)[ids]
  x = x + np.asarray(sd["model.embeddings.position_embeddings.weight"], F64)[np.arange(length)][None]
  out, primal_layers = {}, []
  i = 0
  while f"model.transformer_{i}.norm1.weight" in sd:
    prefix = f"model.transformer_{i}."
    h = layer_norm(x, sd, prefix + "norm1")
    if prefix + "mha.We" in sd:
      layer = primal_layer(h, sd, prefix + "mha.", "lra", mask=mask)
      assert layer["We"].shape[1] == cfg["low_rank"] * cfg["rank_multi"]
      primal_layers.append(layer)
      out[f"layer{i}/escore"], out[f"layer{i}/rscore"] = layer["escore"], layer["rscore"]
      out["sampled_indices"] = layer["sampled_indices"]
      attn = layer["out"]
    else:
      attn = lra_softmax_attention(h, sd, prefix + "mha.", mask, heads, head_dim)
    x = x + attn
    m = gelu(linear(layer_norm(x, sd, prefix + "norm2"), sd, prefix + "mlpblock.0"))
    x = x + linear(m, sd, prefix + "mlpblock.3")
    i += 1
  assert i == cfg["num_layers"], (i, cfg["num_layers"])
  enc = layer_norm(x, sd, "model.norm") * mask[:, :, None]
  pooled = enc[:, 0] if cfg["pooling_mode"] == "CLS" else enc.mean(axis=1)
  logits = linear(np.maximum(linear(pooled, sd, "seq_classifer.mlpblock.0"), 0.0), sd, "seq_classifer.mlpblock.2")
  ce = cross_entropy(logits, label)
  out.update(logits=logits, encoder_out=enc)
  if not primal_layers:
    out["loss"] = ce
    return out
  trace_no_x = cfg.get("trace_no_x", True)
  loss_ksvd = float(np.mean([ksvd_j_lra(layer, trace_no_x) ** 2 for layer in primal_layers]))
  out.update(loss_ce=ce, loss_ksvd=np.asarray(loss_ksvd), loss=ce + cfg["eta"] * loss_ksvd)
  return out


# ----------------------------------------------------------------------------- TimeSeries PrimalformerClassiregressor


def conv1x1(x, sd, name):
  """torch Conv1d(kernel_size=1) on [B, L, C] (applied over the transposed [B, C, L]): weight [out, in, 1]."""
  w = np.asarray(sd[name + ".weight"], F64)
  assert w.shape[2] == 1, w.shape
  return np.asarray(x, F64) @ w[:, :, 0].T + np.asarray(sd[name + ".bias"], F64)


def timeseries_softmax_attention(x, sd, prefix, num_heads):
  """The release's time-series `AttentionLayer` with attn_type "softmax": no padding mask reaches it."""
  q = split_heads(linear(x, sd, prefix + "query_projection"), num_heads)  # [B, H, L, p]
  k = split_heads(linear(x, sd, prefix + "key_projection"), num_heads)
  v = split_heads(linear(x, sd, prefix + "value_projection"), num_heads)
  dot = np.einsum("band,bamd->banm", q, k) / math.sqrt(q.shape[-1])  # d_keys = D / H
  return linear(merge_heads(np.einsum("banm,bamd->band", softmax(dot), v)), sd, prefix + "out_projection")


def timeseries_classifier(sd, cfg, inputs):
  """`PrimalformerClassiregressor(x_enc, padding_masks)` in eval mode (no dropout) + `NoFussCE_KSVD`.

  Any mix of softmax and Primal layers (a layer is Primal iff its `We`
  exists): Trans., PrimalFormer and Primal.+Trans.

  Args:
    cfg: num_heads, low_rank, rank_multi, max_seq_len (the release's names);
      eta when inputs has targets.
    inputs: x_enc [B, L, C], padding_masks [B, L] (1 = real step); optional
      targets [B] for the losses.
  Returns:
    logits [B, classes], encoder_out [B, L, D] (after the final LayerNorm);
    per Primal layer i: layer{i}/J [B]; with Primal layers: loss_ksvd [B], the
    mean over Primal layers of J^2 (reduction none); with targets: loss_ce
    [B] and loss_total = loss_ce + eta * loss_ksvd.
  """
  x = np.asarray(inputs["x_enc"], F64)
  mask = np.asarray(inputs["padding_masks"], F64)
  batch, length, _ = x.shape
  dim = np.asarray(sd["project_inp.weight"]).shape[0]
  n = min(cfg["max_seq_len"], cfg["low_rank"] * cfg["rank_multi"])
  h = linear(x, sd, "project_inp") * math.sqrt(dim)
  h = h + np.asarray(sd["pos_enc.pe"], F64)[:length, 0][None]  # pe [max_len, 1, D]
  out, js = {}, []
  i = 0
  while f"encoder.attn_layers.{i}.norm1.weight" in sd:
    prefix = f"encoder.attn_layers.{i}."
    if prefix + "attention.We" in sd:
      layer = primal_layer(h, sd, prefix + "attention.", "timeseries")
      assert layer["We"].shape[1] == n, (layer["We"].shape, n)
      js.append(ksvd_j_per_sample(layer))
      out[f"layer{i}/J"] = js[-1]
      attn = layer["out"]
    else:
      attn = timeseries_softmax_attention(h, sd, prefix + "attention.", cfg["num_heads"])
    h = layer_norm(h + attn, sd, prefix + "norm1")  # post-norm EncoderLayer
    y = conv1x1(gelu(conv1x1(h, sd, prefix + "conv1")), sd, prefix + "conv2")
    h = layer_norm(h + y, sd, prefix + "norm2")
    i += 1
  enc = layer_norm(h, sd, "encoder.norm")
  features = gelu(enc) * mask[:, :, None]  # padded steps zeroed only here
  logits = linear(features.reshape(batch, -1), sd, "output_layer")
  out.update(logits=logits, encoder_out=enc)
  if js:
    out["loss_ksvd"] = np.mean(np.square(np.stack(js)), axis=0)  # [B]
  if "targets" in inputs:
    out["loss_ce"] = cross_entropy(logits, np.asarray(inputs["targets"]).reshape(-1))
    out["loss_total"] = out["loss_ce"] + cfg["eta"] * out.get("loss_ksvd", 0.0)
  return out


# ----------------------------------------------------------------------------- single-layer cases


def timeseries_layers(sd, cfg, inputs):
  """TimeSeries `AttentionLayer`s stacked directly (prefixes "", "layer1.", ...) + NoFussCE_KSVD."""
  x = np.asarray(inputs["x"], F64)
  n = min(cfg["max_seq_len"], cfg["low_rank"] * cfg["rank_multi"])
  out, js = {}, []
  i = 0
  while (f"layer{i}." if i else "") + "We" in sd:
    prefix = f"layer{i}." if i else ""
    layer = primal_layer(x, sd, prefix, "timeseries")
    assert layer["We"].shape[1] == n, (layer["We"].shape, n)
    x = layer["out"]
    out["out" if i == 0 else f"layer{i}_out"] = x
    out[f"layer{i}/escore"], out[f"layer{i}/rscore"] = layer["escore"], layer["rscore"]
    out["sampled_indices"] = layer["sampled_indices"]
    js.append(ksvd_j_per_sample(layer))
    i += 1
  if "logits" in inputs:
    ce = cross_entropy(inputs["logits"], np.asarray(inputs["targets"]).reshape(-1))
    ksvd = np.mean(np.square(np.stack(js)), axis=0)
    out.update(loss_ce=ce, loss_ksvd=ksvd, loss_total=ce + cfg["eta"] * ksvd)
  return out


def rl_layer(sd, cfg, inputs):
  """RL `Primal_attention` (causal, data-independent) + SequenceTrainer's KSVD term."""
  layer = primal_layer(inputs["x"], sd, "", "rl", causal=True)
  per_sample = np.square(ksvd_j_per_sample(layer)) / 1  # one primal layer
  loss = per_sample.mean()
  return dict(
    out=layer["out"],
    escore=layer["escore"],
    rscore=layer["rscore"],
    ksvd_per_sample=per_sample,
    loss_ksvd=np.asarray(loss),
    trainer_eta_loss_ksvd=np.asarray(cfg["eta"] * loss),
  )


def fairseq_layer(sd, cfg, inputs):
  """fairseq `PrimalMultiheadAttention` (time-major [T, B, C]) + CrossEntropyCriterion's KSVD term."""
  x = np.asarray(inputs["x"], F64).transpose(1, 0, 2)
  layer = primal_layer(x, sd, "", "fairseq", causal=True)
  term = FAIRSEQ_CRITERION_ETA * np.mean(np.square(ksvd_j_per_sample(layer)))
  return dict(
    out=layer["out"].transpose(1, 0, 2),
    escore=layer["escore"],
    rscore=layer["rscore"],
    criterion_ksvd_term=np.asarray(term),
  )


RUNNERS = {
  "ModelForSC": lra_classifier,
  "AttentionLayer": timeseries_layers,
  "Primal_attention": rl_layer,
  "PrimalMultiheadAttention": fairseq_layer,
}


def run(module_class: str, sd, cfg, inputs) -> dict:
  """Golden outputs (float64) of a release module class; the class string may carry a suffix."""
  return RUNNERS[module_class.split(" ")[0]](sd, cfg, inputs)


def _decision_transformer(sd, cfg, inputs):
  """The release's RL Decision Transformer (case `rl_primal_dt`): its own module, built on the primitives above."""
  from reference_dt_numpy import decision_transformer

  return decision_transformer(sd, cfg, inputs)


RUNNERS["DecisionTransformer"] = _decision_transformer


def _combo_vision_transformer(sd, cfg, inputs):
  """The release's CV `ComboVisionTransformer` (case `cv_primal_deit`), in reference_vit_numpy."""
  from reference_vit_numpy import combo_vision_transformer

  return combo_vision_transformer(sd, cfg, inputs)


RUNNERS["ComboVisionTransformer"] = _combo_vision_transformer
