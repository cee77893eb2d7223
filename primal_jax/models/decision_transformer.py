"""Decision Transformer (Chen et al., 2021) with per-layer attention, as in the Primal-Attention release.

Tokens per step t: (R_t, s_t, a_t) -> a [B, 3K, D] sequence; the action a_t is read from the s_t token
(it has seen R_<=t, s_<=t, a_<t), the next state and return from the a_t token. The body is the
pre-norm GPT-2 stack (`TransformerStack` with ReLU MLPs, LayerNorm eps 1e-5); each layer's
attention comes from `config.layers`, so DT (softmax everywhere: "gpt2" or "softmax") and
Primal.+DT (causal Primal-Attention with data-independent weights in the last layer) are configs
(`dt_config`).

Padding (`masking`)::

  "release": the step mask only reaches the softmax layers; the Primal layer averages every
    position, padded ones included, into its running means and KSVD means, as the release does
    (left padding then leaks into real outputs; kept for parity with its checkpoints and numbers).
  "padding_aware": the Primal layer gets the token mask with `sampling="padding_aware"` (padded
    positions stay out of the running means, counts and KSVD means) and `mask_outputs=True` (its
    outputs at padded positions are the output bias alone, so nothing real can reach a padded
    row through it either). Real outputs then do not depend on what padded steps hold.

Differences from the release that do not change eval outputs: the MLP has `MlpBlock`'s dropout
after the activation as well (GPT-2 drops only after `c_proj`), and dropout on attention weights
is broadcast over heads (`broadcast_dropout`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from primal_jax.attention import PrimalAttention, get_attention
from primal_jax.attention.registry import LayerSpec
from primal_jax.dropout import Dropout
from primal_jax.initializers import linear_inits
from primal_jax.models.blocks import TransformerStack, layer_norm
from primal_jax.models.config import TransformerConfig
from primal_jax.models.registry import BuiltModel, body_config, data_independent_primal, model_sections
from primal_jax.validation import check_choice, check_positive

MASKING_MODES = ("release", "padding_aware")
TOKENS_PER_STEP = 3  # (R_t, s_t, a_t)
# The causal attentions of the paper's Table 4 besides DT's softmax and Primal.+DT; each can be every layer of a
# DT by name (`dt_config(primal=False, softmax=name)`): any registered attention with a causal form can.
TABLE4_BASELINES = ("linear", "reformer", "performer", "cosformer", "flowformer")
# The release's GPT-2 body (GPT2Config in experiment.py): ReLU MLPs, LayerNorm eps 1e-5, N(0, 0.02) Linears;
# the stack's last LayerNorm output is never masked (the heads read real steps only).
GPT2_BODY = {"activation": "relu", "layer_norm_eps": 1e-5, "init_style": "gpt2", "mask_final": False}


def dt_config(
  primal: bool = True,
  *,
  num_layers: int = 3,
  dim: int = 256,
  num_heads: int = 4,
  hidden_dim: int | None = None,
  low_rank: int = 32,
  softmax: str | tuple = "gpt2",
  dropout_rate: float = 0.1,
  **overrides,
) -> TransformerConfig:
  """The paper's D4RL models (Table 4: 3 layers, dim 256, 4 heads, s in {32, 64, 96}).

  primal=True is Primal.+DT (last layer causal Primal-Attention, data-independent weights, the rest
  `softmax`); False is DT (`softmax` everywhere). `softmax` names the other layers' attention: "gpt2"
  (default), or any registered attention with a causal form, as a name or (name, options) (Table 4's
  baselines, `TABLE4_BASELINES`); one without a causal form is refused here. GPT-2's n_inner defaults
  to 4 * dim; ReLU MLPs, LayerNorm eps 1e-5 and N(0, 0.02) Linears as the release (experiment.py, GPT2Config).
  """
  check_positive(num_layers, "num_layers")
  name = softmax if isinstance(softmax, str) else softmax[0]
  if not get_attention(name, "softmax").supports_causal:
    raise ValueError(f"softmax: attention {name!r} has no causal form; a Decision Transformer needs a causal one")
  layers = [softmax] * num_layers
  if primal:
    layers[-1] = ("primal", {"low_rank": low_rank, "data_dependent": False})
  fields = dict(
    layers=tuple(layers),
    dim=dim,
    num_heads=num_heads,
    hidden_dim=4 * dim if hidden_dim is None else hidden_dim,
    dropout_rate=dropout_rate,
    attention_dropout_rate=dropout_rate,
  )
  return TransformerConfig(**{**GPT2_BODY, **fields, **overrides})


def with_masking(config: TransformerConfig, masking: str) -> TransformerConfig:
  """`config` with every Primal layer set to `masking` ("release" or "padding_aware", see the module doc)."""
  check_choice(masking, MASKING_MODES, "masking")
  aware = masking == "padding_aware"
  layers = []
  for spec in config.layers:
    if issubclass(get_attention(spec.attention), PrimalAttention):
      options = {**spec.kwargs, "sampling": "padding_aware" if aware else "release", "mask_outputs": aware}
      spec = LayerSpec.of((spec.attention, options))
    layers.append(spec)
  # A copy, not `dataclasses.replace`: re-running `__post_init__` builds (and so, inside a module's
  # method, attaches) attention modules to validate them; the specs above are checked by `LayerSpec.of`.
  masked = copy.copy(config)
  object.__setattr__(masked, "layers", tuple(layers))
  # The stack's final LayerNorm output is never masked: the heads read real steps only.
  object.__setattr__(masked, "mask_final", False)
  return masked


def _torch_dense(features: int, fan_in: int, config: TransformerConfig, name: str) -> nn.Dense:
  """The DT's own Linears (embeddings and heads): PyTorch's default init, as the release leaves them."""
  kernel_init, bias_init = linear_inits("torch", fan_in)
  return nn.Dense(
    features,
    dtype=config.dtype,
    param_dtype=config.param_dtype,
    kernel_init=kernel_init,
    bias_init=bias_init,
    name=name,
  )


class DecisionTransformer(nn.Module):
  """(states, actions, returns-to-go, timesteps, step mask) -> (state, action, return predictions).

  Attributes:
    config: the transformer body (`dt_config`); `config.dim` is the token width D.
    state_dim, act_dim: environment dimensions.
    max_ep_len: rows of the timestep embedding table (timesteps must be < max_ep_len).
    masking: "release" or "padding_aware" (module doc).
    action_tanh: squash predicted actions with tanh (the release: True).
    embed_dropout_rate: GPT-2's embd_pdrop on the embedded tokens; None: `config.dropout_rate`.
    action_only: return action_preds alone (the training loop's regression output and the rollouts'
      policy); every head's parameters exist either way, so checkpoints convert both ways.
  """

  config: TransformerConfig
  state_dim: int
  act_dim: int
  max_ep_len: int = 1000
  masking: str = "release"
  action_tanh: bool = True
  embed_dropout_rate: float | None = None
  action_only: bool = False

  @nn.compact
  def __call__(
    self,
    states: jax.Array,
    actions: jax.Array,
    returns_to_go: jax.Array,
    timesteps: jax.Array,
    attention_mask: jax.Array | None = None,
    deterministic: bool = True,
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Args:
      states: [B, K, state_dim]; actions: [B, K, act_dim]; returns_to_go: [B, K, 1];
      timesteps: [B, K] integer; attention_mask: [B, K] 1 at real steps, 0 at padding (None: all real).
    Returns:
      state_preds [B, K, state_dim] and return_preds [B, K, 1] (from the action tokens),
      action_preds [B, K, act_dim] (from the state tokens), as (state, action, return).
    """
    cfg = with_masking(self.config, self.masking)
    batch, steps = self._check_inputs(states, actions, returns_to_go, timesteps, attention_mask)
    dim = cfg.dim
    time = nn.Embed(
      self.max_ep_len,
      dim,
      dtype=cfg.dtype,
      param_dtype=cfg.param_dtype,
      embedding_init=nn.initializers.normal(1.0),  # nn.Embedding's N(0, 1), as the release leaves it
      name="embed_timestep",
    )(timesteps)  # [B, K, D]
    r = _torch_dense(dim, 1, cfg, "embed_return")(returns_to_go) + time
    s = _torch_dense(dim, self.state_dim, cfg, "embed_state")(states) + time
    a = _torch_dense(dim, self.act_dim, cfg, "embed_action")(actions) + time
    x = jnp.stack([r, s, a], axis=2).reshape(batch, TOKENS_PER_STEP * steps, dim)  # R_1, s_1, a_1, R_2, ...
    x = layer_norm(cfg, "embed_ln")(x)
    rate = cfg.dropout_rate if self.embed_dropout_rate is None else self.embed_dropout_rate
    x = Dropout(rate, impl=cfg.dropout_impl)(x, deterministic=deterministic)
    token_mask = None if attention_mask is None else jnp.repeat(attention_mask, TOKENS_PER_STEP, axis=1)  # [B, 3K]
    h = TransformerStack(cfg, causal=True, name="transformer")(x, token_mask, deterministic)
    h = h.reshape(batch, steps, TOKENS_PER_STEP, dim)  # [B, K, (R, s, a), D]
    action_preds = _torch_dense(self.act_dim, dim, cfg, "predict_action")(h[:, :, 1])
    if self.action_tanh:
      action_preds = jnp.tanh(action_preds)
    state_preds = _torch_dense(self.state_dim, dim, cfg, "predict_state")(h[:, :, 2])
    return_preds = _torch_dense(1, dim, cfg, "predict_return")(h[:, :, 2])
    if self.action_only:
      return action_preds
    return state_preds, action_preds, return_preds

  def _check_inputs(self, states, actions, returns_to_go, timesteps, attention_mask) -> tuple[int, int]:
    check_choice(self.masking, MASKING_MODES, "masking")
    if states.ndim != 3 or states.shape[-1] != self.state_dim:
      raise ValueError(f"states must have shape [batch, steps, {self.state_dim}], got {tuple(states.shape)}")
    batch, steps = states.shape[:2]
    expected = {
      "actions": (actions, (batch, steps, self.act_dim)),
      "returns_to_go": (returns_to_go, (batch, steps, 1)),
      "timesteps": (timesteps, (batch, steps)),
    }
    if attention_mask is not None:
      expected["attention_mask"] = (attention_mask, (batch, steps))
    for name, (value, shape) in expected.items():
      if tuple(value.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)} (from states), got {tuple(value.shape)}")
    if not jnp.issubdtype(timesteps.dtype, jnp.integer):
      raise ValueError(f"timesteps must be integers (rows of the {self.max_ep_len}-row table), got {timesteps.dtype}")
    return batch, steps


def action_mse(action_preds: jax.Array, actions: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
  """The release trainer's loss: mean squared error over every action entry of the real steps ([] scalar).

  action_preds, actions [B, K, act_dim]; attention_mask [B, K] (None: all real).
  """
  sq = jnp.square(action_preds - actions)  # [B, K, A]
  if attention_mask is None:
    return jnp.mean(sq)
  m = (attention_mask > 0).astype(sq.dtype)[..., None]
  return jnp.sum(sq * m) / jnp.maximum(jnp.sum(m) * sq.shape[-1], 1.0)


def _history(states, actions, returns_to_go, timesteps, model: DecisionTransformer):
  """One trajectory's history as host [T, ...] arrays: the release reshapes (1, -1, dim) whatever it gets."""
  states = np.asarray(states, np.float32).reshape(-1, model.state_dim)
  actions = np.asarray(actions, np.float32).reshape(-1, model.act_dim)
  returns_to_go = np.asarray(returns_to_go, np.float32).reshape(-1, 1)
  timesteps = np.asarray(timesteps).astype(np.int32).reshape(-1)
  length = states.shape[0]
  for name, value in (("actions", actions), ("returns_to_go", returns_to_go), ("timesteps", timesteps)):
    if value.shape[0] != length:
      raise ValueError(f"{name} must have {length} steps (as states), got {value.shape[0]}")
  return states, actions, returns_to_go, timesteps


@functools.lru_cache(maxsize=32)
def _jitted_forward(model: DecisionTransformer):
  """One compiled forward per model (and input shape), reused across rollout steps."""
  return jax.jit(model.apply)


def get_action(
  model: DecisionTransformer,
  params,
  states,
  actions,
  returns_to_go,
  timesteps,
  *,
  context: int,
  pad: bool = True,
) -> jax.Array:
  """The action for the last step of one trajectory history ([act_dim]), from a full forward pass.

  The history (states [T, state_dim], actions [T, act_dim] with a zero row for the current step,
  returns_to_go [T] and timesteps [T], any leading singleton axes) is cut to its last `context`
  (K) steps. Then, with

    pad=True (the original Decision Transformer): fewer than K steps are LEFT-padded to K with
      zeros and masked; the model always sees K steps, as in training with left-padded batches.
    pad=False (the Primal-Attention release's `get_action`): no padding; a history shorter than
      K runs as a shorter sequence with an all-ones mask. With `masking="release"` the two differ
      (the release's Primal layer does not honour the mask); with "padding_aware" they agree.

  The history is cut and padded on the host; the forward pass is compiled once per model and input
  length (K, or each length below K with pad=False), so a rollout does not recompile every step.
  """
  check_positive(context, "context")
  states, actions, returns_to_go, timesteps = _history(states, actions, returns_to_go, timesteps, model)
  states, actions = states[-context:], actions[-context:]
  returns_to_go, timesteps = returns_to_go[-context:], timesteps[-context:]
  length = states.shape[0]
  mask = np.ones((length,), np.int32)
  if pad and length < context:
    extra = context - length

    def left_pad(x):
      return np.concatenate([np.zeros((extra,) + x.shape[1:], x.dtype), x], axis=0)

    states, actions, returns_to_go, timesteps, mask = map(left_pad, (states, actions, returns_to_go, timesteps, mask))
  _, action_preds, _ = _jitted_forward(model)(
    {"params": params}, states[None], actions[None], returns_to_go[None], timesteps[None], mask[None]
  )
  return action_preds[0, -1]


@dataclasses.dataclass(frozen=True)
class DecisionTransformerOptions:
  """The Decision Transformer's own keys of a config's `model` section (the rest are its GPT-2 body's).

  See `DecisionTransformer`; `max_ep_len` None: the dataset's (`RLDatasetInfo.max_ep_len`).
  """

  masking: str = "padding_aware"
  action_tanh: bool = True
  embed_dropout_rate: float | None = None
  max_ep_len: int | None = None


def build(model_config, info) -> BuiltModel:
  """`model.name="decision_transformer"` (`offline_rl` task): segments of (R, s, a) -> actions [B, K, act_dim].

  The body is the release's GPT-2 (`GPT2_BODY`, hidden_dim 4 * dim unless given); `info` (an
  `RLDatasetInfo`) gives state_dim, act_dim and the episode length of the timestep table. Primal layers get
  data-independent W_e, W_r unless `attention.primal.data_dependent` says otherwise (the causal layer refuses).
  """
  options, kwargs = model_sections(model_config, DecisionTransformerOptions)
  attention = data_independent_primal(kwargs.pop("attention", None))
  if "dim" in kwargs:  # GPT-2's n_inner default
    kwargs.setdefault("hidden_dim", 4 * kwargs["dim"])
  config = body_config("decision_transformer", **{**GPT2_BODY, **kwargs, "attention": attention})
  module = DecisionTransformer(
    config,
    state_dim=info.state_dim,
    act_dim=info.act_dim,
    max_ep_len=info.max_ep_len if options.max_ep_len is None else options.max_ep_len,
    masking=options.masking,
    action_tanh=options.action_tanh,
    embed_dropout_rate=options.embed_dropout_rate,
    action_only=True,
  )
  return BuiltModel(module, ("states", "actions", "returns_to_go", "timesteps", "mask"), task="offline_rl")
