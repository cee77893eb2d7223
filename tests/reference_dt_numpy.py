"""Independent float64 NumPy Decision Transformer of the Primal-Attention RL release (case `rl_primal_dt`).

Written from shared/reference/README.md (Addendum, case 7) without `primal_jax`: GPT-2 blocks with
transformers `Conv1D` ([in, out] weights, y = x W + b), the fused `c_attn`, GPT-2's masking (future
scores REPLACED by -1e4, then (1 - m_j) * -1e4 ADDED at padded keys), ReLU MLPs, LayerNorm eps 1e-5;
the last block's attention is the release's causal `Primal_attention` (`reference_torch_numpy.primal_layer`),
which ignores the mask. Also the trainer's losses and the release's `get_action` (last K steps, no padding).
Registered in `reference_torch_numpy.RUNNERS` as "DecisionTransformer".
"""

from __future__ import annotations

import math

import numpy as np
import reference_torch_numpy as tref

F64 = np.float64
GPT2_MASK = -1e4


def conv1d(x, sd, name):
  """transformers Conv1D: x @ W + b with W [in, out]."""
  return np.asarray(x, F64) @ np.asarray(sd[name + ".weight"], F64) + np.asarray(sd[name + ".bias"], F64)


def gpt2_attention(h, sd, prefix, heads, token_mask):
  """GPT-2 `Attention` of the release (transformers 4.5.1 `_attn`), h [B, L, D], token_mask [B, L] -> [B, L, D]."""
  qkv = conv1d(h, sd, prefix + "c_attn")
  width = h.shape[-1]
  q, k, v = (tref.split_heads(qkv[..., i * width : (i + 1) * width], heads) for i in range(3))
  length = h.shape[1]
  w = np.einsum("band,bamd->banm", q, k) / math.sqrt(q.shape[-1])
  w = np.where(np.tril(np.ones((length, length), bool)), w, GPT2_MASK)
  # The one float32 rounding kept: score + (-1e4) rounds the score to float32's ulp at 1e4 (~1e-3). Only rows
  # of a padded query with no real key before it depend on it, and the release's mask-blind Primal block
  # carries those rows into real outputs, so the float64 sum would differ from the release by far more
  # than float32 round-off.
  w = w.astype(np.float32) + ((1.0 - np.asarray(token_mask, F64)) * GPT2_MASK).astype(np.float32)[:, None, None, :]
  w = w.astype(F64)
  return conv1d(tref.merge_heads(np.einsum("banm,bamd->band", tref.softmax(w), v)), sd, prefix + "c_proj")


def forward(sd, cfg, states, actions, returns_to_go, timesteps, attention_mask):
  """The release's `DecisionTransformer.forward` (eval) plus what the golden case records per primal block."""
  heads = cfg["n_head"]
  table = np.asarray(sd["embed_timestep.weight"], F64)
  time = table[np.asarray(timesteps)]  # [B, K, D]
  r = tref.linear(returns_to_go, sd, "embed_return") + time
  s = tref.linear(states, sd, "embed_state") + time
  a = tref.linear(actions, sd, "embed_action") + time
  batch, steps, dim = s.shape
  x = np.stack([r, s, a], axis=2).reshape(batch, 3 * steps, dim)
  x = tref.layer_norm(x, sd, "embed_ln")
  token_mask = np.repeat(np.asarray(attention_mask, F64), 3, axis=1)
  layers = {}
  i = 0
  while f"transformer.h.{i}.ln_1.weight" in sd:
    block = f"transformer.h.{i}."
    h = tref.layer_norm(x, sd, block + "ln_1")
    if block + "attn.att.We" in sd:  # the release's Primal block: the mask never reaches it
      layer = tref.primal_layer(h, sd, block + "attn.att.", "rl", causal=True)
      layers[i] = dict(layer, attn_in=h)
      x = x + layer["out"]
    else:
      x = x + gpt2_attention(h, sd, block + "attn.", heads, token_mask)
    hidden = np.maximum(conv1d(tref.layer_norm(x, sd, block + "ln_2"), sd, block + "mlp.c_fc"), 0.0)
    x = x + conv1d(hidden, sd, block + "mlp.c_proj")
    i += 1
  x = tref.layer_norm(x, sd, "transformer.ln_f")
  tokens = x.reshape(batch, steps, 3, dim)
  action_preds = tref.linear(tokens[:, :, 1], sd, "predict_action.0")
  if cfg.get("action_tanh", True):
    action_preds = np.tanh(action_preds)
  state_preds = tref.linear(tokens[:, :, 2], sd, "predict_state")
  return_preds = tref.linear(tokens[:, :, 2], sd, "predict_return")
  return state_preds, action_preds, return_preds, x, layers


def get_action(sd, cfg, states, actions, returns_to_go, timesteps):
  """The release's `get_action`: the last K steps, mask all ones, NO left padding; action_preds[0, -1]."""
  k = cfg["max_length_K"]
  states = np.asarray(states, F64).reshape(1, -1, cfg["state_dim"])[:, -k:]
  actions = np.asarray(actions, F64).reshape(1, -1, cfg["act_dim"])[:, -k:]
  returns_to_go = np.asarray(returns_to_go, F64).reshape(1, -1, 1)[:, -k:]
  timesteps = np.asarray(timesteps).reshape(1, -1)[:, -k:]
  mask = np.ones(timesteps.shape)
  return forward(sd, cfg, states, actions, returns_to_go, timesteps, mask)[1][0, -1]


def decision_transformer(sd, cfg, inputs):
  """Golden outputs of case `rl_primal_dt` (README Addendum, case 7), float64."""
  mask = np.asarray(inputs["attention_mask"], F64)
  actions = np.asarray(inputs["actions"], F64)
  state_preds, action_preds, return_preds, hidden, layers = forward(
    sd, cfg, inputs["states"], actions, inputs["returns_to_go"], inputs["timesteps"], mask
  )
  out = dict(state_preds=state_preds, action_preds=action_preds, return_preds=return_preds, last_hidden_state=hidden)
  squares = []
  for i, layer in layers.items():
    out.update({f"layer{i}/{k}": layer[k] for k in ("escore", "rscore", "We", "Wr", "Lambda", "attn_in")})
    out[f"layer{i}/attn_out"] = layer["out"]
    squares.append(np.square(tref.ksvd_j_per_sample(layer)))
  valid = mask > 0
  mse = np.mean(np.square(action_preds - actions)[valid])  # every entry of the real steps
  out["action_mse"] = np.asarray(mse)
  if squares:
    per_sample = np.mean(squares, axis=0)  # mean over primal layers
    out.update(ksvd_per_sample=per_sample, loss_ksvd=np.asarray(per_sample.mean()))
    out["loss_total"] = np.asarray(mse + cfg["eta"] * per_sample.mean())
  else:
    out["loss_total"] = np.asarray(mse)
  for name in ("get_action_long", "get_action_short"):
    if f"{name}/states" in inputs:
      history = [inputs[f"{name}/{k}"] for k in ("states", "actions", "returns_to_go", "timesteps")]
      out[name] = get_action(sd, cfg, *history)
  return out
