"""Causal decoder language model with incremental decoding.

Primal layers decode from the running sums of q and k (O(1) state per head);
softmax layers from a key/value cache of `max_len` positions.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import linen as nn

from primal_jax.models.blocks import TokenEmbedding, TransformerStack, check_tokens, dense
from primal_jax.models.config import TransformerConfig
from primal_jax.models.registry import BuiltModel, data_independent_primal, plain, token_config

# The token `greedy_decode` returns where it could not decode (non-finite logits): never a valid id.
INVALID_TOKEN = -1


class CausalLM(nn.Module):
  """Decoder-only LM: ids [B, T] -> next-token logits [B, T, vocab].

  Attributes:
    config: hyper-parameters; Primal layers are causal, so their options need
      `data_dependent=False` (sampled rows would leak future tokens; the layer refuses it).
    decode: incremental decoding; the `cache` collection keeps the position
      and each layer's state. Use `init_cache` and `decode_step`.
  """

  config: TransformerConfig
  decode: bool = False

  @nn.compact
  def __call__(self, tokens: jax.Array, mask: jax.Array | None = None, deterministic: bool = True):
    check_tokens(tokens, self.config)
    length = tokens.shape[1]
    if self.decode:
      initialized = self.has_variable("cache", "position")
      position = self.variable("cache", "position", lambda: jnp.array(0, jnp.int32))
      start = position.value
      if initialized:
        position.value = start + length
    else:
      start = 0
    positions = (start + jnp.arange(length))[None, :]
    x = TokenEmbedding(self.config, name="embed")(tokens, positions, deterministic)
    x = TransformerStack(self.config, causal=True, decode=self.decode, name="decoder")(x, mask, deterministic)
    logits = dense(self.config, self.config.vocab_size, self.config.dim, ("embed", "vocab"), "lm_head")(x)
    if self.decode:
      # A traced position cannot raise (decode_step raises when it is concrete): a chunk reaching past
      # max_len has no position embedding and would have shifted the softmax caches, so all of it is NaN.
      logits = jnp.where(start + length <= self.config.max_len, logits, jnp.nan)
    return logits


def init_cache(model: CausalLM, batch_size: int) -> dict:
  """Zero decoding state for `batch_size` sequences (softmax caches hold `max_len` positions)."""
  decoder = model.clone(decode=True)
  tokens = jnp.zeros((batch_size, model.config.max_len), jnp.int32)
  shapes = jax.eval_shape(lambda: decoder.init(jax.random.key(0), tokens)["cache"])
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def decode_step(model: CausalLM, params, cache, tokens: jax.Array):
  """Feeds T >= 1 new tokens [B, T]; returns (logits [B, T, vocab], new cache).

  Raises ValueError when the tokens reach past `max_len` and the cache's position is concrete (an
  eager call; it costs a device-to-host read of the position). Under `jit` such a chunk's logits are NaN.
  """
  position = cache.get("position") if isinstance(cache, Mapping) else None
  if position is not None and not isinstance(position, jax.core.Tracer):
    start, end = int(position), int(position) + tokens.shape[1]
    if end > model.config.max_len:
      raise ValueError(
        f"tokens at positions {start}..{end - 1} exceed max_len={model.config.max_len} (the position table "
        f"and the softmax key/value caches); start a new cache with init_cache"
      )
  logits, updated = model.clone(decode=True).apply({"params": params, "cache": cache}, tokens, mutable=["cache"])
  return logits, updated["cache"]


def decode_limit(model: CausalLM) -> tuple[int, str]:
  """(the number of positions `model` can decode, what sets it): `max_len`, or a layer's smaller `horizon`
  (cosFormer's re-weighting is defined for positions < horizon; the layer refuses or NaNs past it)."""
  limit, reason = model.config.max_len, f"max_len={model.config.max_len}"
  for i in range(model.config.num_layers):
    horizon = getattr(model.config.layer_attention(i), "horizon", None)
    if horizon is not None and horizon < limit:
      limit, reason = horizon, f"layer {i} ({model.config.layers[i].attention}) horizon={horizon}"
  return limit, reason


def greedy_decode(model: CausalLM, params, cache, tokens: jax.Array, steps: int):
  """Feeds `tokens` [B, 1], then each greedy next token, `steps` times in one `lax.scan`.

  Returns (the `steps` greedy tokens [B, steps], the new cache): token t is the argmax of the logits after
  feeding token t - 1. One compiled loop, so no per-token dispatch or host round trip; jit it with the cache
  donated (`donate_argnums`) and a softmax layer's cache is updated in place.

  Bounds: with a concrete cache position (an eager call) `steps` reaching past `decode_limit` (`max_len`, or a
  layer's smaller cosFormer horizon) is a ValueError before
  anything runs. Under `jit` the position is traced: a step whose logits are not finite (past `max_len`, or a
  layer that refused to decode, e.g. cosFormer past its horizon) gives the token `INVALID_TOKEN` (-1, never a valid
  id) there and at every later step of that sequence, never the argmax of NaN; check `(tokens < 0).any()`.
  """
  if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
    raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
  if tokens.ndim != 2 or tokens.shape[1] != 1:
    raise ValueError(f"tokens must have shape [batch, 1] (the last token fed), got {tuple(tokens.shape)}")
  position = cache.get("position") if isinstance(cache, Mapping) else None
  if position is not None and not isinstance(position, jax.core.Tracer):
    start, (limit, reason) = int(position), decode_limit(model)
    if start + steps > limit:
      raise ValueError(
        f"steps {steps} from cache position {start} feed positions {start}..{start + steps - 1}, past "
        f"{reason}; ask for at most {max(limit - start, 0)} steps"
      )

  def body(carry, _):
    token, cache, failed = carry
    logits, cache = decode_step(model, params, cache, token)
    last = logits[:, -1]
    failed = failed | ~jnp.all(jnp.isfinite(last), axis=-1)  # [B], sticky
    best = jnp.argmax(last, axis=-1).astype(jnp.int32)
    fed = jnp.where(failed, 0, best)[:, None]  # a valid id keeps the loop well defined; the output says -1
    return (fed, cache, failed), jnp.where(failed, INVALID_TOKEN, best)

  failed = jnp.zeros((tokens.shape[0],), bool)
  (_, cache, _), out = jax.lax.scan(body, (tokens.astype(jnp.int32), cache, failed), length=steps)
  return out.T, cache


def build(model_config, info) -> BuiltModel:
  """`model.name="lm"`: the causal decoder LM for next-token tasks: ids [B, T] -> logits [B, T, vocab].

  Primal layers get data-independent W_e, W_r unless `attention.primal.data_dependent` says otherwise
  (the causal layer then refuses True: rows sampled over the whole sequence would leak future tokens).
  """
  attention = data_independent_primal(plain(model_config.get("attention", {})))
  return BuiltModel(CausalLM(token_config(model_config, info, attention=attention)), ("inputs",), task="next_token")
