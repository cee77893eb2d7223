"""Flowformer attention (Wu et al., 2022): linear attention with flow conservation.

With non-negative q = sigmoid(Q), k = sigmoid(K), attention is a flow network from the values (sources,
the keys) to the results (sinks, the queries). Per head, with eps = 1e-6 added to every feature and sum:

  incoming flow of sink i     I_i = 1 / (q_i . sum_j k_j),      outgoing flow of source j  O_j = 1 / (k_j . sum_i q_i)
  conserved incoming          Ih_i = q_i . sum_j k_j O_j,       conserved outgoing         Oh_j = k_j . sum_i q_i I_i
  allocation  a_i = sigmoid(Ih_i (N / M)),  competition  c_j = softmax_j(clamp(Oh_j)) M
  out_i = a_i (q_i I_i) . sum_j k_j (c_j v_j)^T

The causal form (the authors' `Flow_Attention_Causal`) takes every sum over j <= i and rescales by the
count n_i = i + 1: I_i, O_i times n_i, Ih_i, Oh_i divided by n_i, c_i = exp(Oh_i) / sum_{j<=i} exp(Oh_j) n_i
and the query factor q_i I_i / n_i. All of it is running sums, so decoding keeps a constant-size state.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp

from primal_jax.attention.baselines.common import (
  BaselineAttention,
  causal_numerator,
  check_form,
  compute_dtype,
  decode_carry,
)

FLOW_EPS = 1e-6
# Clamp of the conserved outgoing flow before the competition's exp: the authors' code uses 1, the
# Primal-Attention release's RL `Flowformer_attention` 10.
PAPER_CLAMP, RELEASE_CLAMP = 1.0, 10.0


def _weights(valid: jax.Array | None, batch: int, length: int, dt) -> jax.Array:
  return jnp.ones((batch, 1, length), dt) if valid is None else valid[:, None, :].astype(dt)  # [B, 1, L]


def flow_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  query_valid: jax.Array | None = None,
  key_valid: jax.Array | None = None,
  *,
  eps: float = FLOW_EPS,
  clamp: float = PAPER_CLAMP,
) -> jax.Array:
  """Non-causal flow attention on [B, H, N|M, p] (q, k before the sigmoid); padded positions take no part.

  Padded queries and keys get zero features and values, the competition's softmax runs over the real keys
  only and N, M count real positions, so real outputs equal those of the unpadded sequence. A sequence with no
  real key (fully padded) gives zeros, with finite gradients.
  """
  dt = compute_dtype(q.dtype)
  b, _, n, _ = q.shape
  wq, wk = _weights(query_valid, b, n, dt), _weights(key_valid, b, k.shape[2], dt)
  q = jax.nn.sigmoid(q.astype(dt)) * wq[..., None]
  k = jax.nn.sigmoid(k.astype(dt)) * wk[..., None]
  v = v.astype(dt) * wk[..., None]
  n_q, n_k = jnp.sum(wq, -1), jnp.sum(wk, -1)  # [B, 1]
  incoming = 1.0 / jnp.einsum("bhnp,bhp->bhn", q + eps, jnp.sum(k, 2) + eps)
  outgoing = 1.0 / jnp.einsum("bhmp,bhp->bhm", k + eps, jnp.sum(q, 2) + eps)
  conserved_sink = jnp.einsum("bhnp,bhp->bhn", q + eps, jnp.sum(k * outgoing[..., None], 2) + eps)
  conserved_source = jnp.einsum("bhmp,bhp->bhm", k + eps, jnp.sum(q * incoming[..., None], 2) + eps)
  conserved_source = jnp.clip(conserved_source, -clamp, clamp)
  allocation = jax.nn.sigmoid(conserved_sink * (n_q / jnp.maximum(n_k, 1.0))[..., None])
  # A sequence with no real key (fully padded) would take a softmax over only -inf (NaN, and NaN gradients
  # even where the loss masks the row out): its logits are 0 instead, and n_k = 0 zeroes its competition.
  padded_out = jnp.where(n_k[..., None] > 0, -jnp.inf, 0.0)  # [B, 1, 1]
  competition = jax.nn.softmax(jnp.where(wk > 0, conserved_source, padded_out), axis=-1) * n_k[..., None]
  kv = jnp.einsum("bhmp,bhmd->bhpd", k, v * competition[..., None])
  return jnp.einsum("bhnp,bhpd->bhnd", q * incoming[..., None], kv) * allocation[..., None]


def flow_carry_zeros(batch: int, heads: int, p: int, dt) -> dict[str, jax.Array]:
  """The causal form's running sums before the first position (its whole decoding state)."""
  vec, scalar = jnp.zeros((batch, heads, p), dt), jnp.zeros((batch, heads), dt)
  return dict(k=vec, q=vec, k_out=vec, q_in=vec, exp=scalar, count=scalar, kv=jnp.zeros((batch, heads, p, p), dt))


def causal_flow_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  valid: jax.Array | None = None,
  carry: dict | None = None,
  *,
  eps: float = FLOW_EPS,
  clamp: float = PAPER_CLAMP,
) -> tuple[jax.Array, dict]:
  """Causal flow attention on [B, H, T, p], continuing from `carry` (decoding); returns (out, new carry).

  `valid` [B, T] (None: all real): padded positions get zero features and values, stay out of the counts
  n_i and of the competition's running sum, so real outputs ignore them. With no padding and clamp 10 this
  is the release's `Flowformer_attention`.
  """
  dt = compute_dtype(q.dtype)
  b, h, t, p = q.shape
  carry = flow_carry_zeros(b, h, p, dt) if carry is None else carry
  w = _weights(valid, b, t, dt)  # [B, 1, T]
  q = jax.nn.sigmoid(q.astype(dt)) * w[..., None]
  k = jax.nn.sigmoid(k.astype(dt)) * w[..., None]
  v = v.astype(dt) * w[..., None]

  def run(x, key):  # prefix sums over the chunk continuing the carry's
    return carry[key][:, :, None] + jnp.cumsum(x, axis=2)

  count = run(jnp.broadcast_to(w, (b, h, t)), "count")  # n_i
  normal = jnp.maximum(count, 1.0)
  cum_k, cum_q = run(k, "k"), run(q, "q")
  incoming = normal / jnp.einsum("bhlp,bhlp->bhl", q + eps, cum_k + eps)
  outgoing = normal / jnp.einsum("bhlp,bhlp->bhl", k + eps, cum_q + eps)
  cum_k_out, cum_q_in = run(k * outgoing[..., None], "k_out"), run(q * incoming[..., None], "q_in")
  conserved_sink = jnp.einsum("bhlp,bhlp->bhl", q + eps, cum_k_out + eps) / normal
  conserved_source = jnp.clip(jnp.einsum("bhlp,bhlp->bhl", k + eps, cum_q_in + eps) / normal, -clamp, clamp)
  allocation = jax.nn.sigmoid(conserved_sink)
  source = jnp.exp(conserved_source)
  cum_exp = run(source * w[:, 0][:, None], "exp")
  real = w[:, 0][:, None] > 0  # [B, 1, T]; at a real position cum_exp >= its own exp(-clamp) > 0
  competition = jnp.where(real, source / jnp.where(real, cum_exp, 1.0), 0.0) * normal
  # sum_{j <= i} <q_i', k_j> v_j c_j, chunked (not a [B, H, T, p, p] prefix sum per position)
  num, kv = causal_numerator(q * (incoming / normal)[..., None], k, v * competition[..., None], carry["kv"])
  out = num * allocation[..., None]
  last = dict(k=cum_k, q=cum_q, k_out=cum_k_out, q_in=cum_q_in, exp=cum_exp, count=count)
  return out, {**{key: value[:, :, -1] for key, value in last.items()}, "kv": kv}


class FlowformerAttention(BaselineAttention):
  """ "flowformer": flow-conservation attention (Wu et al., 2022), non-causal or causal.

  Attributes:
    form: "paper" (default; the authors' code: outgoing flow clamped to [-1, 1]; padding honoured, see
      `flow_attention`) or "release": the Primal-Attention release's RL `Flowformer_attention`, causal
      only, clamp [-10, 10], and it IGNORES the mask (the release's reasoning: right padding plus
      causality make it unnecessary; left padding then reaches real outputs).
    eps: added to every feature and sum (1e-6).
    The rest: see `BaselineAttention`; causal=True and decode=True (running sums: constant-size state).
  """

  form: str = "paper"
  eps: float = FLOW_EPS

  supports_causal: ClassVar[bool] = True
  supports_decode: ClassVar[bool] = True

  def validate(self):
    check_form(self.form, self.causal, "FlowformerAttention", release_causal=True)

  def attend_heads(self, q, k, v, query_valid, key_valid):
    release = self.form == "release"
    if release and not self.causal:  # at the call: model configs validate their layers with causal=False
      raise ValueError("FlowformerAttention(form='release') is causal only (the release's RL layer); set causal=True")
    clamp = RELEASE_CLAMP if release else PAPER_CLAMP
    if release:
      query_valid = key_valid = None  # the release ignores the mask
    if not self.causal:
      return flow_attention(q, k, v, query_valid, key_valid, eps=self.eps, clamp=clamp)
    if not self.decode:
      return causal_flow_attention(q, k, v, key_valid, eps=self.eps, clamp=clamp)[0]
    b, h, _, p = q.shape
    state, store = decode_carry(self, flow_carry_zeros(b, h, p, compute_dtype(q.dtype)))
    out, last = causal_flow_attention(q, k, v, key_valid, state, eps=self.eps, clamp=clamp)
    store(last)
    return out
