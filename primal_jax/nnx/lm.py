"""`CausalLM`: a small NNX decoder-only language model over any causal NNX attention, with decoding.

An example of the NNX layers in a model (pre-norm blocks, learned positions, tied nothing), small
enough to read: `CausalLM(..., attention=functools.partial(primal_jax.nnx.PrimalAttention, low_rank=8,
data_dependent=False))`. `init_cache(batch, max_len)` then `model(tokens, decode=True)` feeds tokens a
chunk at a time; a Primal model's decoding state is its layers' running sums (O(1) in the context),
a softmax model's a key/value cache. `generate` samples greedily or with a temperature.

Decoding past the `max_len` given to `init_cache` is refused: a ValueError when the cache's position is concrete
(an eager call), NaN logits under `nnx.jit` (the position is traced). `generate` checks its bounds before it runs
and refuses, after the loop, a continuation whose logits were not finite at some step (a layer that refused).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from primal_jax.models.generation import SamplingOptions
from primal_jax.nnx.registry import PrimalAttention
from primal_jax.nnx.shell import Attention

DEFAULT_ATTENTION = functools.partial(PrimalAttention, low_rank=8, data_dependent=False)


class Block(nnx.Module):
  """x + attention(norm(x)), then x + MLP(norm(x)); the attention is causal."""

  def __init__(self, dim: int, num_heads: int, hidden: int, attention: Callable[..., Attention], *, rngs: nnx.Rngs):
    self.norm1 = nnx.LayerNorm(dim, rngs=rngs)
    self.attention = attention(num_heads=num_heads, in_features=dim, causal=True, rngs=rngs)
    self.norm2 = nnx.LayerNorm(dim, rngs=rngs)
    self.up = nnx.Linear(dim, hidden, rngs=rngs)
    self.down = nnx.Linear(hidden, dim, rngs=rngs)

  def __call__(self, x: jax.Array, decode: bool = False) -> jax.Array:
    x = x + self.attention(self.norm1(x), decode=decode)
    return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))


class CausalLM(nnx.Module):
  """Token + position embeddings, `num_layers` causal blocks, a final norm and the output head.

  Args:
    vocab_size, max_len: tokens and positions.
    dim, num_heads, num_layers, hidden: sizes (hidden default 4 dim).
    attention: makes each block's attention from (num_heads, in_features, causal, rngs): any NNX
      attention class of `primal_jax.nnx` or a partial of one with its options.
  """

  def __init__(
    self,
    vocab_size: int,
    max_len: int,
    *,
    dim: int = 64,
    num_heads: int = 4,
    num_layers: int = 2,
    hidden: int | None = None,
    attention: Callable[..., Attention] = DEFAULT_ATTENTION,
    rngs: nnx.Rngs,
  ):
    self.max_len = max_len
    self.tokens = nnx.Embed(vocab_size, dim, rngs=rngs)
    self.positions = nnx.Embed(max_len, dim, rngs=rngs)
    self.blocks = nnx.List([Block(dim, num_heads, hidden or 4 * dim, attention, rngs=rngs) for _ in range(num_layers)])
    self.norm = nnx.LayerNorm(dim, rngs=rngs)
    self.head = nnx.Linear(dim, vocab_size, rngs=rngs)
    self.position: nnx.Cache | None = nnx.data(None)
    self.cache_len = self.cache_batch = 0  # the max_len and batch of the last `init_cache` (static)

  def __call__(self, tokens: jax.Array, decode: bool = False) -> jax.Array:
    """[B, T] int tokens -> [B, T, vocab] logits; with `decode`, the tokens continue the cached ones."""
    length = tokens.shape[1]
    start = 0
    if decode:
      if self.position is None:
        raise ValueError("decode=True needs a cache: call init_cache(batch, max_len) first")
      if tokens.shape[0] != self.cache_batch:
        raise ValueError(
          f"decode: tokens have batch {tokens.shape[0]}, the cache holds {self.cache_batch} sequences "
          "(init_cache); call init_cache with this batch"
        )
      start = self.position.get_value()
      if not isinstance(start, jax.core.Tracer) and int(start) + length > self.cache_len:
        raise ValueError(
          f"decode: tokens at positions {int(start)}..{int(start) + length - 1} exceed the cache's "
          f"max_len={self.cache_len} (init_cache); call init_cache again with a larger max_len"
        )
      self.position.set_value(start + length)
    positions = start + jnp.arange(length)
    x = self.tokens(tokens) + self.positions(positions)[None]
    for block in self.blocks:
      x = block(x, decode=decode)
    logits = self.head(self.norm(x))
    if decode:  # a traced position cannot raise: a chunk reaching past the cache is all NaN, never numbers
      logits = jnp.where(start + length <= self.cache_len, logits, jnp.asarray(jnp.nan, logits.dtype))
    return logits

  def init_cache(self, batch: int, max_len: int | None = None, dtype=jnp.float32) -> None:
    """Empty decoding state for `batch` sequences of up to `max_len` tokens (default the model's)."""
    max_len = self.max_len if max_len is None else max_len
    if not 0 < max_len <= self.max_len:
      raise ValueError(f"max_len must be in [1, {self.max_len}] (the position table), got {max_len}")
    for block in self.blocks:
      block.attention.init_cache((batch, max_len, self.positions.features), dtype)
    self.position = nnx.Cache(jnp.zeros((), jnp.int32))
    self.cache_len, self.cache_batch = max_len, batch

  def generate(self, prompt: jax.Array, num_tokens: int, *, temperature: float = 0.0, key=None) -> jax.Array:
    """[B, P] prompt -> [B, P + num_tokens]: the prompt fed in one chunk, then one token per step.

    temperature 0 is greedy; otherwise softmax sampling at that temperature with `key` (a temperature is 0 or
    finite and >= 1.18e-38, as `primal_jax.models.generation.SamplingOptions`). Every bound is checked before
    anything runs; a step whose logits are not finite (a layer that refused to decode) is a ValueError at the end.
    """
    if jnp.ndim(prompt) != 2 or prompt.shape[1] < 1 or not jnp.issubdtype(prompt.dtype, jnp.integer):
      raise ValueError(
        f"prompt must be integer token ids [batch, length] with length >= 1, got shape {jnp.shape(prompt)} "
        f"and dtype {jnp.asarray(prompt).dtype}"
      )
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int | np.integer) or num_tokens < 1:
      raise ValueError(f"num_tokens must be an integer >= 1, got {num_tokens!r}")
    SamplingOptions(temperature=temperature)  # the one check of a temperature
    batch, length = prompt.shape
    if length + num_tokens > self.max_len:
      raise ValueError(f"prompt ({length}) + num_tokens ({num_tokens}) exceeds max_len={self.max_len}")
    if temperature > 0 and key is None:
      raise ValueError("temperature > 0 needs a key")
    self.init_cache(batch, length + num_tokens)
    step = _last_logits
    logits, out = step(self, prompt), [prompt]
    finite = jnp.ones((batch,), bool)  # checked once at the end: no host round trip per token
    for i in range(num_tokens):
      finite = finite & jnp.all(jnp.isfinite(logits), axis=-1)
      if temperature > 0:  # logits minus their maximum: a tiny temperature cannot overflow them to +inf
        shifted = (logits - jnp.max(logits, axis=-1, keepdims=True)) / temperature
        token = jax.random.categorical(jax.random.fold_in(key, i), shifted)
      else:
        token = jnp.argmax(logits, axis=-1)
      out.append(token[:, None].astype(prompt.dtype))
      if i + 1 < num_tokens:
        logits = step(self, out[-1])
    bad = np.flatnonzero(~np.asarray(finite))
    if bad.size:
      raise ValueError(
        f"generate: the logits of sequences {bad.tolist()} were not finite (a layer refused to decode, e.g. "
        "cosFormer past its horizon, or the parameters hold NaN); no tokens are returned"
      )
    return jnp.concatenate(out, axis=1)


@nnx.jit
def _last_logits(model: CausalLM, tokens: jax.Array) -> jax.Array:
  """One decoding call of `generate` (module level: compiled once per model structure and shape, not per call)."""
  return model(tokens, decode=True)[:, -1]
