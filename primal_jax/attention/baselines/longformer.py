"""Longformer attention (Beltagy et al., 2020): a sliding window plus a few global tokens.

The LRA setting of the Nystromformer LRA code (`LRA/code/attention_longformer.py` of mlpen/Nystromformer,
Hugging Face transformers 3.3.1's `LongformerSelfAttention` with `attention_window = [w]` and the first
token global): with c = w / 2 and scores s_ij = q_i . k_j / sqrt(p),

  local query i:   softmax over {global keys g} u {j : abs(i - j) <= c, j neither padded nor global}
  global query i:  softmax over every real key (full attention)
  padded query i:  output 0 (transformers zeroes its weights)

The causal form keeps the same pattern restricted to j <= i (a window looking back c positions; a global
query sees its own prefix). Computed blockwise: the sequence is cut into blocks of c positions and each
block of queries scores the keys of its own and its neighbouring blocks, so the scores take O(N (3c + g))
memory, never N x N.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp

from primal_jax.attention.baselines.common import BaselineAttention, compute_dtype
from primal_jax.validation import check_positive


def _blocks(x: jax.Array, size: int, length: int) -> jax.Array:
  """[B, H, L, f] -> [B, H, nb, size, f], zero-padded at the end to nb * size >= L positions."""
  nb = -(-length // size)
  x = jnp.pad(x, ((0, 0), (0, 0), (0, nb * size - length), (0, 0)))
  return x.reshape(x.shape[:2] + (nb, size) + x.shape[3:])


def _neighbours(blocks: jax.Array, causal: bool) -> jax.Array:
  """[B, H, nb, c, f] -> [B, H, nb, 3c | 2c, f]: blocks (b - 1, b, b + 1), or (b - 1, b) when causal."""
  zero = jnp.zeros_like(blocks[:, :, :1])
  prev = jnp.concatenate([zero, blocks[:, :, :-1]], axis=2)
  parts = [prev, blocks] if causal else [prev, blocks, jnp.concatenate([blocks[:, :, 1:], zero], axis=2)]
  return jnp.concatenate(parts, axis=3)


def _masked_softmax_parts(scores: list[jax.Array], allowed: list[jax.Array]) -> list[jax.Array]:
  """One softmax over the concatenated last axes of `scores` (each entry where `allowed`), returned in parts.

  A row with no allowed entry gets weights 0 (never NaN).
  """
  neg = jnp.asarray(-jnp.inf, scores[0].dtype)
  masked = [jnp.where(a, s, neg) for s, a in zip(scores, allowed, strict=True)]
  top = jnp.max(jnp.stack([jnp.max(s, axis=-1) for s in masked]), axis=0)
  top = jnp.where(jnp.isfinite(top), top, 0.0)[..., None]
  exps = [jnp.where(a, jnp.exp(s - top), 0.0) for s, a in zip(masked, allowed, strict=True)]
  total = sum(jnp.sum(e, axis=-1, keepdims=True) for e in exps)
  total = jnp.where(total > 0, total, 1.0)
  return [e / total for e in exps]


def longformer_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  key_valid: jax.Array | None = None,
  *,
  window: int,
  num_global: int = 1,
  causal: bool = False,
) -> jax.Array:
  """Sliding-window attention of one-sided width window / 2 with the first `num_global` positions global.

  Args:
    q, k, v: [B, H, N, p] (self-attention: one sequence).
    key_valid: [B, N] bool or None; padded positions are no key of any query and their own outputs are 0
      (a padded global position is treated as padded).
    window: w, the total window width (even; transformers' `attention_window`).
    num_global: g, the first g positions attend to and are attended by every position.
    causal: only keys j <= i.
  Returns:
    [B, H, N, p] in the compute dtype.
  """
  dt = compute_dtype(q.dtype)
  batch, _, length, p = q.shape
  c, g = window // 2, min(num_global, length)
  q = q.astype(dt) / jnp.sqrt(jnp.asarray(p, dt))
  k, v = k.astype(dt), v.astype(dt)
  valid = jnp.ones((batch, length), bool) if key_valid is None else key_valid.astype(bool)
  pos = jnp.arange(length)
  is_global = pos < g

  # Local queries: the window (blocks b - 1, b, b + 1) plus the global keys.
  qb = _blocks(q, c, length)  # [B, H, nb, c, p]
  kb, vb = (_neighbours(_blocks(x, c, length), causal) for x in (k, v))  # [B, H, nb, 3c|2c, p]
  nb = qb.shape[2]
  q_pos = jnp.arange(nb * c).reshape(nb, c)  # [nb, c]
  k_pos = (jnp.arange(nb)[:, None] - 1) * c + jnp.arange(kb.shape[3])[None, :]  # [nb, 3c|2c]
  offset = k_pos[:, None, :] - q_pos[:, :, None]  # [nb, c, 3c|2c] = j - i
  in_range = (k_pos >= 0) & (k_pos < length)
  key_ok = valid & ~is_global[None]  # [B, N]: keys the window may hold
  key_ok_b = jnp.take(key_ok, jnp.clip(k_pos, 0, length - 1), axis=1) & in_range[None]  # [B, nb, 3c|2c]
  near = (offset <= 0) if causal else (offset <= c)
  allowed_win = (near & (offset >= -c))[None, None] & key_ok_b[:, None, :, None, :]  # [B, 1, nb, c, 3c|2c]
  win_scores = jnp.einsum("bhncp,bhnkp->bhnck", qb, kb)
  glob_scores = jnp.einsum("bhncp,bhgp->bhncg", qb, k[:, :, :g])  # [B, H, nb, c, g]
  allowed_glob = valid[:, None, None, None, :g] & jnp.ones((1, 1, nb, c, g), bool)
  if causal:
    allowed_glob = allowed_glob & (jnp.arange(g)[None, None, :] <= q_pos[:, :, None])[None, None]
  if g:
    w_glob, w_win = _masked_softmax_parts([glob_scores, win_scores], [allowed_glob, allowed_win])
    out = jnp.einsum("bhncg,bhgp->bhncp", w_glob, v[:, :, :g]) + jnp.einsum("bhnck,bhnkp->bhncp", w_win, vb)
  else:
    (w_win,) = _masked_softmax_parts([win_scores], [allowed_win])
    out = jnp.einsum("bhnck,bhnkp->bhncp", w_win, vb)
  out = out.reshape(out.shape[:2] + (nb * c, p))[:, :, :length]

  if g:  # global queries: full (or causal-prefix) attention over every real key, O(g N)
    scores = jnp.einsum("bhgp,bhnp->bhgn", q[:, :, :g], k)
    allowed = valid[:, None, None, :] & jnp.ones((1, 1, g, length), bool)
    if causal:
      allowed = allowed & (pos[None, :] <= jnp.arange(g)[:, None])[None, None]
    (weights,) = _masked_softmax_parts([scores], [allowed])
    out = out.at[:, :, :g].set(jnp.einsum("bhgn,bhnp->bhgp", weights, v))
  return jnp.where(valid[:, None, :, None], out, 0.0)


class LongformerAttention(BaselineAttention):
  """ "longformer": sliding-window attention with global tokens (the Nystromformer LRA code's Longformer).

  Attributes:
    window: w, the total window width, even (a query sees w / 2 keys on each side and itself);
      transformers' `attention_window`.
    num_global: the first `num_global` positions are global (the LRA code makes the first token global:
      `first_token_view`); 0 = a plain sliding window.
    The rest: see `BaselineAttention`; causal=True is supported (the window looks back only).

  Masks: a padding mask is honoured (padded keys are skipped, padded queries output 0, as transformers
  does); other masks are refused. Self-attention only.
  """

  window: int = 256
  num_global: int = 1

  supports_causal: ClassVar[bool] = True
  self_attention_only: ClassVar[bool] = True

  def validate(self) -> None:
    check_positive(self.window, "window")
    if self.window % 2:
      raise ValueError(f"window must be even (w / 2 keys on each side), got {self.window}")
    if not isinstance(self.num_global, int) or isinstance(self.num_global, bool) or self.num_global < 0:
      raise ValueError(f"num_global must be an integer >= 0, got {self.num_global!r}")

  def attend_heads(self, q, k, v, query_valid, key_valid):
    del query_valid  # self-attention: the key padding is the query padding
    return longformer_attention(q, k, v, key_valid, window=self.window, num_global=self.num_global, causal=self.causal)
