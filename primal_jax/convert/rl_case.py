"""Decision Transformer state_dicts -> `DecisionTransformer` params, and the golden case runner.

Two sources, one model:
  * the Primal-Attention release (`PrimalAttention_RL/decision_transformer`, shared/reference case
    `rl_primal_dt`): GPT-2 blocks under `transformer.h.<i>.` with transformers `Conv1D` weights
    stored [in, out] (= Flax kernels), a fused `c_attn` [D, 3D] (q | k | v columns) in the softmax
    blocks and `attn.att.*` (`Primal_attention`, torch Linear layout) in the Primal block; no
    position table;
  * Hugging Face `transformers.DecisionTransformerModel`: the same blocks under `encoder.h.<i>.`,
    softmax everywhere, and a GPT-2 position table `encoder.wpe` of which it only ever uses row 0
    (it passes position_ids = 0): that row is added to every token after `embed_ln`, so it is
    folded into `embed_ln`'s bias.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from primal_jax.convert import torch_layout
from primal_jax.convert.torch_layout import _get, dense, embedding, layer_norm
from primal_jax.ksvd import RELEASE_SEQUENCE, ksvd_loss_per_sample
from primal_jax.models.decision_transformer import DecisionTransformer, action_mse, dt_config, get_action

RELEASE_PREFIX = "transformer."
HF_PREFIX = "encoder."
# transformers' ACT2FN names -> TransformerConfig.activation ("gelu" is torch's exact erf form there too).
HF_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh"}


def conv1d(state_dict, prefix: str) -> dict:
  """transformers `Conv1D` `prefix.{weight [in, out], bias}`: y = x W + b, so the kernel is W as stored."""
  return {"kernel": _get(state_dict, prefix + ".weight"), "bias": _get(state_dict, prefix + ".bias")}


def gpt2_attention(state_dict, prefix: str, num_heads: int) -> dict:
  """GPT-2 `Attention` (`c_attn` [D, 3D] = [q | k | v], `c_proj` [D, D]) -> query/key/value/out DenseGeneral."""
  fused = conv1d(state_dict, prefix + "c_attn")
  width, three_d = fused["kernel"].shape
  if three_d != 3 * width:
    raise ValueError(f"{prefix}c_attn.weight must be [D, 3D], got {fused['kernel'].shape}")
  if width % num_heads:
    raise ValueError(f"{prefix}c_attn: width {width} is not divisible by num_heads={num_heads}")
  p = width // num_heads
  params = {}
  for i, role in enumerate(("query", "key", "value")):
    cols = slice(i * width, (i + 1) * width)
    params[role] = {
      "kernel": fused["kernel"][:, cols].reshape(width, num_heads, p),
      "bias": fused["bias"][cols].reshape(num_heads, p),
    }
  proj = conv1d(state_dict, prefix + "c_proj")
  params["out"] = {"kernel": proj["kernel"].reshape(num_heads, p, width), "bias": proj["bias"]}
  return params


def decision_transformer_params(state_dict, num_heads: int, prefix: str = RELEASE_PREFIX) -> tuple[dict, list]:
  """A DT state_dict -> (`DecisionTransformer` params, per-layer attention entries for `dt_config`).

  A block with `attn.att.We` is Primal (its `We` [H, p, s] gives H and s), any other is GPT-2 softmax.

  Args:
    num_heads: H of the softmax blocks (the fused `c_attn` does not carry it).
    prefix: `RELEASE_PREFIX` (the release) or `HF_PREFIX` (transformers).
  """
  blocks, layers = {}, []
  while f"{prefix}h.{len(layers)}.ln_1.weight" in state_dict:
    i = len(layers)
    block = f"{prefix}h.{i}."
    if torch_layout.is_primal_layer(state_dict, block + "attn.att.", "rl"):
      attention = torch_layout.attention_params(state_dict, block + "attn.att.", "rl")
      heads, rows, low_rank = attention["We"].shape
      if heads != num_heads:
        raise ValueError(f"{block}attn.att.We has {heads} heads but num_heads={num_heads}")
      layers.append(("primal", {"low_rank": low_rank, "data_dependent": False}))
    else:
      attention = gpt2_attention(state_dict, block + "attn.", num_heads)
      layers.append("gpt2")
    blocks[f"block_{i}"] = {
      "norm1": layer_norm(state_dict, block + "ln_1"),
      "attention": attention,
      "norm2": layer_norm(state_dict, block + "ln_2"),
      "mlp": {"fc_in": conv1d(state_dict, block + "mlp.c_fc"), "fc_out": conv1d(state_dict, block + "mlp.c_proj")},
    }
  if not layers:
    raise ValueError(f"state_dict has no '{prefix}h.0.*' keys: not a Decision Transformer")
  blocks["final_norm"] = layer_norm(state_dict, prefix + "ln_f")
  params = {
    "embed_timestep": embedding(state_dict, "embed_timestep.weight"),
    "embed_return": dense(state_dict, "embed_return"),
    "embed_state": dense(state_dict, "embed_state"),
    "embed_action": dense(state_dict, "embed_action"),
    "embed_ln": layer_norm(state_dict, "embed_ln"),
    "transformer": blocks,
    "predict_action": dense(state_dict, "predict_action.0"),
    "predict_state": dense(state_dict, "predict_state"),
    "predict_return": dense(state_dict, "predict_return"),
  }
  return params, layers


def hf_decision_transformer_params(state_dict, num_heads: int) -> tuple[dict, list]:
  """transformers `DecisionTransformerModel` state_dict -> params; `encoder.wpe[0]` folded into `embed_ln.bias`."""
  params, layers = decision_transformer_params(state_dict, num_heads, HF_PREFIX)
  wpe = _get(state_dict, HF_PREFIX + "wpe.weight")  # [n_positions, D]; only row 0 is ever used
  params["embed_ln"]["bias"] = params["embed_ln"]["bias"] + wpe[0]
  return params, layers


def model_from_state_dict(state_dict, meta_config: dict, prefix: str = RELEASE_PREFIX):
  """(DecisionTransformer, params) with every size read from the state_dict and the case config.

  `meta_config` gives n_head, and optionally activation_function, action_tanh and (transformers) the
  GPT-2 attention options; options this model does not implement are a ValueError.
  """
  heads = meta_config["n_head"]
  for option, supported in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False)):
    if meta_config.get(option, supported) != supported:
      raise ValueError(f"meta_config: {option}={meta_config[option]!r} is not supported (only {supported})")
  if meta_config.get("activation_function", "relu") not in HF_ACTIVATIONS:
    got = meta_config["activation_function"]
    raise ValueError(f"meta_config: activation_function must be one of {tuple(HF_ACTIVATIONS)}, got {got!r}")
  convert = hf_decision_transformer_params if prefix == HF_PREFIX else decision_transformer_params
  params, layers = convert(state_dict, heads)
  table = params["embed_timestep"]["embedding"]  # [max_ep_len, D]
  config = dt_config(
    primal=False,
    num_layers=len(layers),
    dim=table.shape[1],
    num_heads=heads,
    hidden_dim=params["transformer"]["block_0"]["mlp"]["fc_in"]["kernel"].shape[1],
    layers=tuple(layers),
    activation=HF_ACTIVATIONS[meta_config.get("activation_function", "relu")],
  )
  model = DecisionTransformer(
    config,
    state_dim=params["embed_state"]["kernel"].shape[0],
    act_dim=params["embed_action"]["kernel"].shape[0],
    max_ep_len=table.shape[0],
    action_tanh=meta_config.get("action_tanh", True),
  )
  return model, params


def _captured(tree, *path) -> jnp.ndarray:
  for key in path:
    tree = tree[key]
  return tree[0]


def run_decision_transformer(case) -> dict:
  """The release's `DecisionTransformer` forward, its trainer's losses and `get_action` (case `rl_primal_dt`)."""
  cfg = case.meta["config"]
  model, params = model_from_state_dict(case.params, cfg)
  inputs = {k: jnp.asarray(v) for k, v in case.inputs.items()}
  mask = inputs["attention_mask"].astype(jnp.int32)
  primal_blocks = [i for i, entry in enumerate(model.config.layers) if entry.attention == "primal"]
  wanted = {("transformer",)} | {
    ("transformer", f"block_{i}", m) for i in primal_blocks for m in ("norm1", "attention")
  }

  def capture(module, method_name):
    return method_name == "__call__" and tuple(module.path) in wanted

  forward = jax.jit(functools.partial(model.apply, mutable=["ksvd", "intermediates"], capture_intermediates=capture))
  (state_preds, action_preds, return_preds), state = forward(
    {"params": params},
    inputs["states"],
    inputs["actions"],
    inputs["returns_to_go"],
    inputs["timesteps"].astype(jnp.int32),
    mask,
  )
  inter = state["intermediates"]["transformer"]
  out = dict(state_preds=state_preds, action_preds=action_preds, return_preds=return_preds)
  out["last_hidden_state"] = _captured(inter, "__call__")
  for i in primal_blocks:
    block, attention = inter[f"block_{i}"], params["transformer"][f"block_{i}"]["attention"]
    out[f"layer{i}/escore"] = _captured(block, "attention", "escore")
    out[f"layer{i}/rscore"] = _captured(block, "attention", "rscore")
    out[f"layer{i}/attn_in"] = _captured(block, "norm1", "__call__")
    out[f"layer{i}/attn_out"] = _captured(block, "attention", "__call__")
    out[f"layer{i}/We"], out[f"layer{i}/Wr"], out[f"layer{i}/Lambda"] = (
      attention["We"],
      attention["Wr"],
      attention["Lambda"],
    )
  mse = action_mse(action_preds, inputs["actions"], mask)
  out.update(action_mse=mse, loss_total=mse)
  if primal_blocks:  # the trainer's regulariser: per-sample J^2, mean over Primal layers, then over the batch
    per_sample = ksvd_loss_per_sample(state["ksvd"], RELEASE_SEQUENCE)
    loss_ksvd = jnp.mean(per_sample)
    out.update(ksvd_per_sample=per_sample, loss_ksvd=loss_ksvd, loss_total=mse + cfg["eta"] * loss_ksvd)
  context = cfg["max_length_K"]
  for name in ("get_action_long", "get_action_short"):
    if f"{name}/states" in inputs:
      history = [inputs[f"{name}/{k}"] for k in ("states", "actions", "returns_to_go", "timesteps")]
      out[name] = get_action(model, params, *history, context=context, pad=False)
  return {k: np.asarray(v) for k, v in out.items()}
