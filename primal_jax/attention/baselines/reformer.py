"""Reformer attention (Kitaev et al., 2020): LSH attention with shared query/key vectors.

Per hash round r, a position's bucket is argmax([x R_r, -x R_r]) for a random rotation R_r [p, nb/2] of its
shared query/key vector x (angular LSH: near vectors share buckets). Positions are sorted by (round,
bucket, position); the sorted sequence of all rounds is cut into chunks of `chunk_length`, and each chunk
attends to itself and `num_chunks_before` / `num_chunks_after` neighbouring chunks (cyclically). Keys are
the length-normalised query vectors divided by sqrt(p); a position may attend to itself only when nothing
else is left (-1e5 against -1e9 for masked keys). The rounds are combined with weights
softmax_r(logsumexp of round r's scores). This is Hugging Face's `LSHSelfAttention`, the layer the
Primal-Attention release's LRA "reformer" wraps; with a key padding mask, padded positions get a bucket
of their own (`nb`) whenever any position of the batch is padded.

The causal form attends, in every round, to the keys j <= i of the query's own bucket exactly (no chunks):
chunk windows depend on where later positions sort, so the chunked form with a causal mask (Hugging
Face's `is_decoder`) lets later tokens change earlier outputs. It costs O(num_hashes N^2).
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp

from primal_jax.attention.baselines.common import REDRAW_RNG, BaselineAttention, compute_dtype, random_state
from primal_jax.validation import check_choice, check_positive

MASK_VALUE, SELF_MASK_VALUE = -1e9, -1e5  # Hugging Face's float32 mask values
ROTATIONS = ("seeded", "per_call")
LEN_NORM_EPS = 1e-6


def default_num_buckets(length: int, chunk_length: int) -> int:
  """Hugging Face's choice at the first call: 2 ** (bit_length(2 N / chunk_length) - 1), at least 2."""
  return max(2, 2 ** ((2 * (length // chunk_length)).bit_length() - 1))


def lsh_buckets(qk: jax.Array, rotations: jax.Array, valid: jax.Array | None) -> tuple[jax.Array, jax.Array]:
  """Bucket ids [B, H, R, N] in [0, nb] (nb: padded positions) and nb + 1 if any position is padded, else nb.

  Args:
    qk: [B, H, N, p] shared query/key vectors.
    rotations: [H, p, R, nb / 2] random rotations.
    valid: [B, N] bool or None.
  """
  num_buckets = 2 * rotations.shape[-1]
  rotated = jnp.einsum("bhnd,hdrk->bhrnk", jax.lax.stop_gradient(qk), rotations.astype(qk.dtype))
  buckets = jnp.argmax(jnp.concatenate([rotated, -rotated], axis=-1), axis=-1).astype(jnp.int32)
  if valid is None:
    return buckets, jnp.asarray(num_buckets, jnp.int32)
  buckets = jnp.where(valid[:, None, None, :], buckets, num_buckets)
  return buckets, num_buckets + jnp.any(~valid).astype(jnp.int32)  # one bucket more only if any is padded


def _look_adjacent(x: jax.Array, before: int, after: int) -> jax.Array:
  """[B, H, C, c, ...] -> [B, H, C, c (before + 1 + after), ...]: each chunk with its neighbours (cyclic)."""
  return jnp.concatenate([jnp.roll(x, -i, axis=2) for i in range(-before, after + 1)], axis=3)


def _scores(q, k, key_ok, same_position, causal_ok=None):
  """Masked scores: -1e9 where the key is not allowed, then -1e5 at the query's own position."""
  dots = jnp.einsum("...qp,...kp->...qk", q, k)
  allowed = key_ok if causal_ok is None else key_ok & causal_ok
  dots = jnp.where(allowed, dots, MASK_VALUE)
  return jnp.where(same_position, SELF_MASK_VALUE, dots)


def _key_vectors(qk: jax.Array) -> jax.Array:
  """Keys: the query vectors length-normalised (RMS over p) and divided by sqrt(p)."""
  scale = jax.lax.rsqrt(jnp.mean(qk * qk, axis=-1, keepdims=True) + LEN_NORM_EPS)
  return qk * scale / jnp.sqrt(jnp.asarray(qk.shape[-1], qk.dtype))


def _combine_rounds(out: jax.Array, logits: jax.Array) -> jax.Array:
  """sum_r out_r softmax_r(logits_r): out [B, H, R, N, p], logits [B, H, R, N]."""
  return jnp.sum(out * jax.nn.softmax(logits, axis=2)[..., None], axis=2)


def lsh_attention(
  qk: jax.Array,
  v: jax.Array,
  rotations: jax.Array,
  key_valid: jax.Array | None = None,
  *,
  chunk_length: int = 64,
  num_chunks_before: int = 1,
  num_chunks_after: int = 0,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Chunked LSH self-attention (non-causal); N must be a multiple of chunk_length.

  Args:
    qk, v: [B, H, N, p]; rotations [H, p, R, nb / 2]; key_valid [B, N] bool or None.
  Returns:
    (out [B, H, N, p], buckets [B, H, R, N], sorted index [B, H, R N] with entries r N + position).
  """
  dt = compute_dtype(qk.dtype)
  qk, v = qk.astype(dt), v.astype(dt)
  b, h, n, p = qk.shape
  rounds = rotations.shape[2]
  buckets, total = lsh_buckets(qk, rotations, key_valid)
  keys = (buckets + jnp.arange(rounds, dtype=jnp.int32)[:, None] * total).reshape(b, h, rounds * n)
  order = jnp.argsort(keys, axis=-1, stable=True)  # ties by index, as Hugging Face's _stable_argsort
  position = order % n  # [B, H, R N]
  chunks = rounds * n // chunk_length

  def chunked(x):  # sorted [B, H, R N, ...] -> [B, H, C, c, ...]
    return x.reshape(b, h, chunks, chunk_length, *x.shape[3:])

  sorted_qk = jnp.take_along_axis(qk, position[..., None], axis=2)
  sorted_v = jnp.take_along_axis(v, position[..., None], axis=2)
  q_pos = chunked(position)
  k_pos = _look_adjacent(q_pos, num_chunks_before, num_chunks_after)  # [B, H, C, K]
  k_vec = _look_adjacent(chunked(_key_vectors(sorted_qk)), num_chunks_before, num_chunks_after)
  v_vec = _look_adjacent(chunked(sorted_v), num_chunks_before, num_chunks_after)
  if key_valid is None:
    key_ok = jnp.ones(k_pos.shape, bool)[..., None, :]
  else:
    key_ok = jnp.take_along_axis(key_valid[:, None, :], k_pos.reshape(b, h, -1), axis=2).reshape(k_pos.shape)
    key_ok = key_ok[..., None, :]  # [B, H, C, 1, K]
  dots = _scores(chunked(sorted_qk), k_vec, key_ok, q_pos[..., :, None] == k_pos[..., None, :])
  logits = jax.nn.logsumexp(dots, axis=-1)  # [B, H, C, c]
  out = jnp.einsum("bhcqk,bhckp->bhcqp", jnp.exp(dots - logits[..., None]), v_vec).reshape(b, h, rounds * n, p)
  undo = jnp.argsort(order, axis=-1)  # the inverse permutation
  out = jnp.take_along_axis(out, undo[..., None], axis=2).reshape(b, h, rounds, n, p)
  logits = jnp.take_along_axis(logits.reshape(b, h, rounds * n), undo, axis=2).reshape(b, h, rounds, n)
  return _combine_rounds(out, logits), buckets, order


def bucket_attention(
  qk: jax.Array,
  v: jax.Array,
  buckets: jax.Array | None,
  key_valid: jax.Array | None = None,
  *,
  causal: bool = False,
) -> jax.Array:
  """LSH attention without chunks: round r's query i attends to the keys of its own bucket (all keys when
  `buckets` is None, Hugging Face's path for N <= chunk_length), j <= i if causal; rounds combined as above.

  Args:
    qk, v: [B, H, N, p]; buckets [B, H, R, N] or None; key_valid [B, N] or None.
  Returns:
    [B, H, N, p].
  """
  dt = compute_dtype(qk.dtype)
  qk, v = qk.astype(dt), v.astype(dt)
  n = qk.shape[2]
  buckets = jnp.zeros(qk.shape[:2] + (1, n), jnp.int32) if buckets is None else buckets
  key_ok = buckets[..., :, None] == buckets[..., None, :]  # [B, H, R, N, N]
  if key_valid is not None:
    key_ok = key_ok & key_valid[:, None, None, None, :]
  causal_ok = jnp.tril(jnp.ones((n, n), bool)) if causal else None
  dots = _scores(qk[:, :, None], _key_vectors(qk)[:, :, None], key_ok, jnp.eye(n, dtype=bool), causal_ok)
  logits = jax.nn.logsumexp(dots, axis=-1)  # [B, H, R, N]
  out = jnp.einsum("bhrqk,bhkp->bhrqp", jnp.exp(dots - logits[..., None]), v)
  return _combine_rounds(out, logits)


class ReformerAttention(BaselineAttention):
  """ "reformer": LSH attention (Kitaev et al., 2020) as Hugging Face's `LSHSelfAttention` computes it.

  Queries and keys share one projection: the layer uses the "query" projection for both; its "key"
  projection exists (the parameter tree is every mechanism's: query, key, value, out) and is unused.

  Attributes:
    num_hashes: hash rounds R (the release's "reformer-2": 2).
    chunk_length: length of the chunks of the sorted sequence (HF's lsh_attn_chunk_length, 64); N must
      be a multiple of it. N <= chunk_length runs full attention with the self-mask, as HF does.
    num_chunks_before, num_chunks_after: neighbouring chunks each chunk attends to (1, 0).
    num_buckets: nb, even; None chooses HF's rule from N (`default_num_buckets`).
    rotations: where the rotations [H, p, R, nb / 2] (N(0, 1)) come from. "seeded" (default): drawn from
      `hash_seed`, the same at every call. "per_call": new ones at every call, as the release draws them
      (`hash_seed=None` in Hugging Face's layer), from the "redraw" RNG stream (`common.REDRAW_RNG`:
      `apply(..., rngs={"redraw": key})`; the NNX layer keeps the stream), so a run is deterministic given
      its key. In both modes a `random_state` entry "rotations" of that shape is used instead (given
      rotations: the golden cases replay the release's).
    hash_seed: the seed of rotations="seeded".
    The rest: see `BaselineAttention`; causal=True attends within buckets exactly (module doc). The
    bucket ids and the sort order are sown in `intermediates` ("buckets", "sorted_bucket_idx").
  """

  num_hashes: int = 2
  chunk_length: int = 64
  num_chunks_before: int = 1
  num_chunks_after: int = 0
  num_buckets: int | None = None
  rotations: str = "seeded"
  hash_seed: int = 0

  supports_causal: ClassVar[bool] = True
  self_attention_only: ClassVar[bool] = True
  supports_kv_groups: ClassVar[bool] = False
  kv_groups_refusal: ClassVar[str] = (
    "its keys are its queries (one shared projection), so it has one key head per query head"
  )

  def rng_streams(self) -> tuple[str, ...]:
    return (REDRAW_RNG,) if self.rotations == "per_call" else ()

  def validate(self):
    check_choice(self.rotations, ROTATIONS, "rotations")
    check_positive(self.num_hashes, "num_hashes")
    check_positive(self.chunk_length, "chunk_length")
    for name in ("num_chunks_before", "num_chunks_after"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if self.num_buckets is not None and (self.num_buckets < 2 or self.num_buckets % 2):
      raise ValueError(f"num_buckets must be None or an even integer >= 2, got {self.num_buckets!r}")

  def attend_heads(self, q, k, v, query_valid, key_valid):
    del k, query_valid  # shared QK: the query projection is also the key's
    _, h, n, p = q.shape
    full = not self.causal and n <= self.chunk_length
    if not self.causal and not full and n % self.chunk_length:
      raise ValueError(
        f"ReformerAttention: the sequence length ({n}) must be a multiple of chunk_length ({self.chunk_length}); "
        "pad the inputs (as Hugging Face's ReformerModel does)"
      )
    if full:
      return bucket_attention(q, v, None, key_valid)
    nb = self.num_buckets or default_num_buckets(n, self.chunk_length)
    shape = (h, p, self.num_hashes, nb // 2)
    rotations = random_state(self, "rotations", shape, lambda: self._draw_rotations(shape))
    if self.causal:
      buckets, _ = lsh_buckets(q.astype(compute_dtype(q.dtype)), rotations, key_valid)
      self._sow_hashing(buckets, None)
      return bucket_attention(q, v, buckets, key_valid, causal=True)
    out, buckets, order = lsh_attention(
      q,
      v,
      rotations,
      key_valid,
      chunk_length=self.chunk_length,
      num_chunks_before=self.num_chunks_before,
      num_chunks_after=self.num_chunks_after,
    )
    self._sow_hashing(buckets, order)
    return out

  def _draw_rotations(self, shape: tuple[int, ...]) -> jax.Array:
    if self.rotations == "seeded":
      return jax.random.normal(jax.random.key(self.hash_seed), shape, jnp.float32)
    if not (self.is_initializing() or self.has_rng(REDRAW_RNG)):  # init may fall back to the "params" key
      raise ValueError(
        f"ReformerAttention(rotations='per_call') draws its rotations at every call from the {REDRAW_RNG!r} RNG "
        f"stream: pass rngs={{{REDRAW_RNG!r}: key}} to apply (or give them in the random_state collection)"
      )
    return jax.random.normal(self.make_rng(REDRAW_RNG), shape, jnp.float32)

  def _sow_hashing(self, buckets, order):
    if self.is_initializing():
      return
    self.sow("intermediates", "buckets", buckets)
    if order is not None:
      self.sow("intermediates", "sorted_bucket_idx", order)
