"""Sampling from a `CausalLM`: temperature, top-k, top-p, prompts of different lengths, one compiled step.

Primal layers decode from their running sums of q and k (a state whose size does not grow with the
context); softmax layers from their key/value cache (`init_cache`, `decode_step`). Prompts of different
lengths share one position counter without padding: the part every prompt has (the shortest prompt's
length) is prefilled in chunks of `prefill_chunk` tokens, then each step feeds, per sequence, its next prompt
token while it has one and its last sampled token afterwards. So no sequence ever attends to a pad token, and
a sequence's output is exactly what it would be alone. Each step is one call of a function jitted once per
(model, batch size): no recompilation per token or per position.

Sampling is per sequence too: the token a sequence samples at position t uses the key
`fold_in(fold_in(key(seed), crc32(prompt)), t)` (`row_keys`), which depends on nothing else in the batch. So a
sampled continuation is exactly what the same prompt gives alone with the same seed, whatever its neighbours or
its place in the batch; identical prompts with one seed get identical continuations (pass one seed per prompt
for several samples of one prompt).
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from primal_jax.models.lm import INVALID_TOKEN, CausalLM, decode_limit, decode_step, init_cache

# The smallest temperature sampled: the smallest normal float32. Below it the temperature is a subnormal (flushed to
# zero by XLA:CPU, so logits / T would be 0 / 0) or zero in float32; such temperatures are refused, not rounded.
MIN_TEMPERATURE = float(np.finfo(np.float32).tiny)


@dataclasses.dataclass(frozen=True)
class SamplingOptions:
  """temperature 0 is greedy (argmax); top_k 0 keeps every token; top_p 1.0 keeps the whole distribution.

  A temperature is 0 or at least `MIN_TEMPERATURE` (1.18e-38, the smallest normal float32); any such temperature
  samples softmax(logits / T) exactly (`sample_token` divides logits minus their maximum, which cannot overflow
  to +inf: a tiny T samples the argmax, not an arbitrary token).
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self) -> None:
    if not (np.isfinite(self.temperature) and self.temperature >= 0):
      raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {self.temperature}")
    if 0 < self.temperature < MIN_TEMPERATURE:
      raise ValueError(
        f"temperature must be 0 (greedy) or >= {MIN_TEMPERATURE:.8g} (the smallest normal float32), "
        f"got {self.temperature}"
      )
    if isinstance(self.top_k, bool) or not isinstance(self.top_k, int | np.integer) or self.top_k < 0:
      raise ValueError(f"top_k must be an integer >= 0 (0: no top-k cut), got {self.top_k!r}")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p must lie in (0, 1] (1: no nucleus cut), got {self.top_p}")


def filter_logits(logits: jax.Array, top_k: int, top_p: float) -> jax.Array:
  """logits [B, V] with the tokens outside the top-k and outside the top-p nucleus set to -inf.

  The nucleus is the smallest set of most probable tokens whose probability reaches `top_p` (the token
  that crosses it is kept), as in Holtzman et al. (2020); ties at the k-th value are all kept.
  """
  neg = jnp.finfo(logits.dtype).min
  if top_k:
    kth = jax.lax.top_k(logits, min(top_k, logits.shape[-1]))[0][..., -1:]  # [B, 1]
    logits = jnp.where(logits < kth, neg, logits)
  if top_p < 1.0:
    order = jnp.argsort(-logits, axis=-1)  # [B, V] most probable first
    probs = jax.nn.softmax(jnp.take_along_axis(logits, order, axis=-1), axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # probability mass strictly before each token
    keep_sorted = before < top_p
    keep = jnp.zeros_like(keep_sorted).at[jnp.arange(logits.shape[0])[:, None], order].set(keep_sorted)
    logits = jnp.where(keep, logits, neg)
  return logits


def sample_token(logits: jax.Array, keys: jax.Array, options: SamplingOptions) -> jax.Array:
  """[B] int32 next tokens from logits [B, V] under `options`, row b drawn with its own key `keys[b]`.

  softmax((l - max l) / T) = softmax(l / T), and (l - max l) / T is 0 at the argmax and <= 0 elsewhere (-inf
  where it underflows): finite probabilities for every T >= MIN_TEMPERATURE, where l / T overflowed to +inf.
  """
  logits = logits.astype(jnp.float32)
  if options.temperature == 0.0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  shifted = logits - jnp.max(logits, axis=-1, keepdims=True)
  logits = filter_logits(shifted / jnp.float32(options.temperature), options.top_k, options.top_p)
  return jax.vmap(jax.random.categorical)(keys, logits).astype(jnp.int32)


def row_keys(seed: int | Sequence[int], prompts: list[list[int]]) -> jax.Array:
  """[B] keys, one per prompt: key(seed) folded with the CRC-32 of the prompt's tokens (module doc).

  `seed` is one integer for every prompt or one per prompt, each in [-2**63, 2**63) (a 64-bit seed).
  """
  seeds = [seed] * len(prompts) if not isinstance(seed, Sequence) else list(seed)
  if len(seeds) != len(prompts) or any(
    isinstance(s, bool) or not isinstance(s, int | np.integer) or not -(2**63) <= s < 2**63 for s in seeds
  ):
    raise ValueError(
      f"seed must be an integer in [-2**63, 2**63) or one such integer per prompt ({len(prompts)}), got {seed!r}"
    )
  crcs = [zlib.crc32(np.asarray(p, np.int32).tobytes()) for p in prompts]
  return jnp.stack([jax.random.fold_in(jax.random.key(int(s)), c) for s, c in zip(seeds, crcs, strict=True)])


@functools.lru_cache(maxsize=8)
def _compiled(model: CausalLM, options: SamplingOptions):
  """(prefill, step) jitted for `model` and `options`: compiled once per input shape."""

  def prefill(params, cache, tokens):
    _, cache = decode_step(model, params, cache, tokens)
    return cache

  def step(params, cache, fed, keys):
    # The sampled token's position (one counter for the batch) makes each row's key fresh at every token.
    keys = jax.vmap(jax.random.fold_in, (0, None))(keys, cache["position"] + 1)
    logits, cache = decode_step(model, params, cache, fed[:, None])  # [B, 1, V]
    finite = jnp.all(jnp.isfinite(logits[:, -1]), axis=-1)  # [B]: False where a layer refused (NaN logits)
    return jnp.where(finite, sample_token(logits[:, -1], keys, options), INVALID_TOKEN), cache

  # The cache is donated: XLA updates a softmax layer's [B, max_len, H, p] key/value buffers in place instead of
  # copying them at every token (O(max_len) memory traffic per token for nothing, and twice the memory).
  return jax.jit(prefill, donate_argnums=1), jax.jit(step, donate_argnums=1)


def check_prompts(prompts: list[list[int]], max_new_tokens: int, model: CausalLM) -> None:
  """ValueError naming the argument unless every prompt fits the model with its new tokens."""
  if not prompts:
    raise ValueError("prompts must hold at least one prompt")
  if any(len(p) == 0 for p in prompts):
    raise ValueError("prompts must not be empty: a causal LM needs at least one token to condition on")
  if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
  vocab = model.config.vocab_size
  if any(not 0 <= t < vocab for p in prompts for t in p):
    raise ValueError(f"prompt token ids must lie in [0, {vocab})")
  longest = max(len(p) for p in prompts)
  # The last new token is sampled, never fed back: positions 0 .. longest + max_new_tokens - 2 are fed.
  if longest + max_new_tokens - 1 > model.config.max_len:
    raise ValueError(
      f"prompt length {longest} + max_new_tokens {max_new_tokens} - 1 (the last new token is not fed back) "
      f"exceeds the model's max_len {model.config.max_len} (its position table and softmax key/value caches); "
      "shorten the prompt or ask for fewer tokens"
    )
  limit, reason = decode_limit(model)
  if longest + max_new_tokens - 1 > limit:
    raise ValueError(
      f"prompt length {longest} + max_new_tokens {max_new_tokens} - 1 (the last new token is not fed back) "
      f"exceeds the model's {reason} (it decodes {limit} positions); shorten the prompt or ask for fewer tokens"
    )


def check_finite_logits(sampled: np.ndarray, position: int) -> None:
  """ValueError unless every sequence's logits after feeding `position` were finite, i.e. no token of `sampled`
  is `INVALID_TOKEN` (the step's flag: a token sampled from NaN logits would be an arbitrary id; a layer that
  cannot decode there, e.g. cosFormer past its horizon, gives NaN)."""
  bad = np.flatnonzero(sampled == INVALID_TOKEN)
  if bad.size:
    raise ValueError(
      f"the model's logits after position {position} are not finite for prompts {bad.tolist()} (a layer refused "
      "to decode there, e.g. cosFormer past its horizon, or the parameters hold NaN); nothing is returned"
    )


def generate(
  model: CausalLM, params, prompts: list[list[int]], *, max_new_tokens: int, options: SamplingOptions,
  seed: int | Sequence[int] = 0, prefill_chunk: int = 64,
) -> list[list[int]]:  # fmt: skip
  """The `max_new_tokens` tokens sampled after each prompt (module doc), one list per prompt.

  `seed`: one integer for every prompt, or one per prompt (`row_keys`). Every bound (prompt lengths and
  `max_new_tokens` against `max_len`) is checked before anything runs; a step whose logits are not finite is a
  ValueError (`check_finite_logits`), never a token sampled from NaN.
  """
  check_prompts(prompts, max_new_tokens, model)
  keys = row_keys(seed, prompts)
  if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1:
    raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
  prefill, step = _compiled(model, options)
  batch, shortest, longest = len(prompts), min(map(len, prompts)), max(map(len, prompts))
  total = longest + max_new_tokens
  forced = np.zeros((batch, total), np.int32)  # prompt tokens where a sequence still has them
  has_prompt = np.zeros((batch, total), bool)
  for i, p in enumerate(prompts):
    forced[i, : len(p)], has_prompt[i, : len(p)] = p, True
  cache = init_cache(model, batch)
  common = shortest - 1  # the last shared prompt token is fed by the first step, which then samples
  for begin in range(0, common, prefill_chunk):
    cache = prefill(params, cache, jnp.asarray(forced[:, begin : min(begin + prefill_chunk, common)]))
  fed = forced[:, common]
  out = np.zeros((batch, total), np.int32)
  for position in range(common, total - 1):  # feed token `position`, sample token `position + 1`
    sampled, cache = step(params, cache, jnp.asarray(fed), keys)
    check_finite_logits(np.asarray(sampled), position)
    nxt = position + 1
    out[:, nxt] = np.asarray(sampled)
    fed = np.where(has_prompt[:, nxt], forced[:, nxt], out[:, nxt])
  return [out[i, len(p) : len(p) + max_new_tokens].tolist() for i, p in enumerate(prompts)]
