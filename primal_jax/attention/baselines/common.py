"""What every baseline attention shares beyond the attention shell: padding masks and head layout.

`BaselineAttention` puts the heads first ([B, H, N, p]) and reduces the mask to
paddings; subclasses only implement `attend_heads`, which calls a pure function
on those arrays. None of these mechanisms has an N x M weight matrix that a
general attention mask could edit, so a mask is reduced to key (and query)
padding; causality comes from the `causal` attribute alone. A mask that says more
than padding (a causal mask given to a non-causal layer, a block or per-head mask)
or an additive float mask is therefore refused (`mask_checks`), never reduced silently.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from primal_jax.attention.shell import AttentionShell
from primal_jax.masks import mask_values_ok, refuse_unhonoured
from primal_jax.validation import check_choice

# "paper": the mechanism as its paper (and its authors' code) defines it; "release": the formulas of the
# Primal-Attention release's own baseline code, which the paper's LRA numbers came from (see docs/api.md).
FORMS = ("paper", "release")
# Optional variable collection holding random state a layer would otherwise draw from its seed (Performer's
# features, Reformer's rotations): `apply({"params": ..., RANDOM_STATE_COLLECTION: ...})` replays a recorded draw.
RANDOM_STATE_COLLECTION = "random_state"
# RNG stream a layer redraws its random state from at every call when asked to (Reformer's
# rotations="per_call", the release's behaviour): `apply(..., rngs={REDRAW_RNG: key})`.
REDRAW_RNG = "redraw"


def compute_dtype(dtype) -> Any:
  """Feature maps, sums and normalisers run in at least float32, also for bf16 inputs."""
  return jnp.promote_types(dtype, jnp.float32)


def check_form(form: str, causal: bool, name: str, release_causal: bool = False) -> None:
  """`form` is one of FORMS; the release form is refused with causal=True unless the release has a causal form."""
  check_choice(form, FORMS, "form")
  if form == "release" and causal and not release_causal:
    raise ValueError(f"{name}: form='release' has no causal form (the release's code is non-causal); use form='paper'")


def random_state(module, name: str, shape: tuple[int, ...], draw) -> jax.Array:
  """The layer's `name` from the RANDOM_STATE_COLLECTION when the caller passes one, else `draw()`.

  A passed array must have `shape` (ValueError naming the variable otherwise).
  """
  if module.has_variable(RANDOM_STATE_COLLECTION, name):
    value = module.get_variable(RANDOM_STATE_COLLECTION, name)
    if tuple(value.shape) != tuple(shape):
      raise ValueError(f"{RANDOM_STATE_COLLECTION}/{name} must have shape {tuple(shape)}, got {tuple(value.shape)}")
    return jnp.asarray(value)
  return draw()


def decode_carry(module, zeros: dict[str, jax.Array]) -> tuple[dict[str, jax.Array], Any]:
  """A decoding layer's running state in the `cache` collection: (current values, `store(new)`).

  `zeros` gives each variable's initial value. The initialising call creates the variables and `store`
  leaves them untouched (so `init` returns the zero state), as `PrimalAttention` does. A mechanism whose state
  is computed from keys and values alone (`kv_only_state`) keeps it per key/value head with grouped heads
  (`AttentionShell.kv_state`: [B, H_kv, ...] leaves, H / H_kv times smaller).
  """
  if getattr(module, "kv_only_state", False):
    pairs = {k: module.kv_state(k, z) for k, z in zeros.items()}
    return {k: value for k, (value, _) in pairs.items()}, lambda new: [pairs[k][1](new[k]) for k in pairs]
  initialized = module.has_variable("cache", next(iter(zeros)))
  variables = {k: module.variable("cache", k, lambda z=z: z) for k, z in zeros.items()}
  values = {k: var.value for k, var in variables.items()}

  def store(new: dict[str, jax.Array]) -> None:
    if initialized:
      for k, var in variables.items():
        var.value = new[k].astype(var.value.dtype)

  return values, store


def padding_masks(
  mask: jax.Array | None, batch: int, q_len: int, k_len: int
) -> tuple[jax.Array | None, jax.Array | None]:
  """(query_valid [B, N] | None, key_valid [B, M] | None), True = real position.

  Args:
    mask: None, a [B, M] key padding vector, or a Flax attention mask
      [B|1, 1|H, N, M] ("query i may attend key j").
    batch, q_len, k_len: B, N, M.
  Returns:
    From a [B, M] vector: the keys' padding, which is also the queries' when
    N == M (self-attention), else None. From a 4-D mask: a key is real iff
    some query may attend to it, a query is real iff it may attend to some key
    (for `nn.make_attention_mask(pad, pad)`, with or without a causal mask
    combined, both give `pad` back).
  """
  if mask is None:
    return None, None
  shape = tuple(mask.shape)
  if shape == (batch, k_len):
    key_valid = mask.astype(bool)
    return (key_valid if q_len == k_len else None), key_valid
  if len(shape) == 4 and shape[0] in (1, batch) and shape[2:] == (q_len, k_len):
    allowed = mask.astype(bool)
    query_valid = jnp.broadcast_to(jnp.any(allowed, axis=(1, 3)), (batch, q_len))
    key_valid = jnp.broadcast_to(jnp.any(allowed, axis=(1, 2)), (batch, k_len))
    return query_valid, key_valid
  raise ValueError(
    f"mask must have shape [batch, keys] = {(batch, k_len)} or "
    f"[batch, 1 or heads, queries, keys] = {(batch, '1|H', q_len, k_len)}, got {shape}"
  )


def mask_checks(
  mask: jax.Array | None, query_valid: jax.Array | None, key_valid: jax.Array | None, causal: bool, name: str
) -> list[tuple[jax.Array, str]]:
  """([B] ok, message) pairs for `refuse_unhonoured`: the mask's values are 0/1, and it allows every
  (query, key) pair of real positions that the layer mixes (all of them, or j <= i when `causal`)."""
  if mask is None or mask.ndim == 2:  # a padding vector says nothing beyond padding
    return []
  batch = mask.shape[0] if query_valid is None else query_valid.shape[0]
  values = (
    mask_values_ok(mask, batch),
    f"{name}: mask must hold only 0 and 1 or booleans (True = may attend); an additive mask (0 = attend, "
    "-inf = not) is not accepted: pass the boolean mask it was built from",
  )
  used = query_valid[:, :, None] & key_valid[:, None, :]  # [B, N, M]
  if causal:
    used = used & jnp.tril(jnp.ones(used.shape[1:], bool))
  allowed = mask.astype(bool)  # [B|1, 1|H, N, M]
  honoured = jnp.broadcast_to(jnp.all(allowed | ~used[:, None], axis=(1, 2, 3)), (batch,))
  hint = "set causal=True for a causal mask, where the mechanism has a causal form" if not causal else ""
  message = (
    f"{name} cannot honour this mask: it forbids pairs of real positions that the layer mixes "
    f"({'causal' if causal else 'all'} pairs; only padding is honoured){'; ' + hint if hint else ''}"
  )
  return [values, (honoured, message)]


def zero_padded(x: jax.Array, valid: jax.Array | None) -> jax.Array:
  """x [B, H, L, f] with the rows of padded positions (valid [B, L] False) set to 0.

  `where`, not a product: a padded row holding inf/NaN must not leak NaN.
  """
  if valid is None:
    return x
  return jnp.where(valid[:, None, :, None], x, jnp.zeros((), x.dtype))


class BaselineAttention(AttentionShell):
  """The baselines' core on the attention shell: heads_out = attend_heads(Q, K, V) on [B, H, N, p].

  The attributes are `AttentionShell`'s, and:

  Attributes:
    dropout_rate: dropout on the heads' outputs [B, H, N, p] before the output
      projection (there is no attention-weight matrix to drop; the
      Nystromformer LRA code that the paper's baselines come from applies none).
    broadcast_dropout: accepted and ignored, as in `PrimalAttention`.
    decode: True only where `supports_decode` (the constant-state mechanisms keep their running sums in
      the `cache` collection, `decode_carry`).
    causal: True only where `supports_causal`.
    num_kv_heads: grouped key/value heads, shared by repetition before `attend_heads` (a mechanism whose keys
      are its queries refuses it); a decoding state of keys and values alone (`kv_only_state`) is kept per
      key/value head.
  """

  supports_causal: ClassVar[bool] = False
  supports_kv_groups: ClassVar[bool] = True
  kv_only_state: ClassVar[bool] = False

  def attend_heads(
    self,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    query_valid: jax.Array | None,
    key_valid: jax.Array | None,
  ) -> jax.Array:
    """q [B, H, N, p], k/v [B, H, M, p], paddings [B, N] / [B, M] bool or None -> [B, H, N, p]."""
    raise NotImplementedError

  def attend(self, q, k, v, *, inputs_k, mask, deterministic, dropout_rng, sow_weights):
    """Reduces `mask` to padding (`padding_masks`) and runs `attend_heads`; rows of padded queries
    are not zeroed (as `SoftmaxAttention`). `sow_weights` is ignored (no N x M matrix is formed).
    A mask the layer cannot honour is refused: ValueError when concrete, NaN rows under `jit`
    (plus a host-callback ValueError with `debug_checks`), as `PrimalAttention` does."""
    del inputs_k, sow_weights
    batch, length = q.shape[:2]
    if self.causal and k.shape[1] != length:
      raise ValueError(f"causal attention needs as many queries as keys, got {length} and {k.shape[1]}")
    query_valid, key_valid = padding_masks(mask, batch, length, k.shape[1])
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # [B, H, N|M, p]
    heads_out = self.attend_heads(q, k, v, query_valid, key_valid).astype(q.dtype)  # [B, H, N, p]
    heads_out = self.apply_dropout(heads_out, deterministic, dropout_rng)
    for ok, message in mask_checks(mask, query_valid, key_valid, self.causal, type(self).__name__):
      heads_out = refuse_unhonoured(heads_out, ok, message, self.debug_checks)
    return jnp.swapaxes(heads_out, 1, 2)  # [B, N, H, p]


# Positions per chunk of the causal prefix sums (`causal_numerator`): at most this many keys are attended to
# through a masked [chunk, chunk] product; earlier chunks through their running f x p sum.
CAUSAL_CHUNK = 64


def in_chunks(x: jax.Array, size: int, fill: float = 0.0) -> jax.Array:
  """[B, H, T, ...] -> [B, H, ceil(T / size), size, ...], the last chunk completed with `fill`."""
  t = x.shape[2]
  n = -(-t // size)
  if n * size != t:
    x = jnp.pad(x, [(0, 0), (0, 0), (0, n * size - t)] + [(0, 0)] * (x.ndim - 3), constant_values=fill)
  return x.reshape(*x.shape[:2], n, size, *x.shape[3:])


def causal_numerator(
  phi_q: jax.Array, phi_k: jax.Array, v: jax.Array, kv_carry: jax.Array | None = None, chunk: int = CAUSAL_CHUNK
) -> tuple[jax.Array, jax.Array]:
  """sum_{j <= i} <phi_q_i, phi_k_j> v_j for every i, continuing from `kv_carry` (the f x p sum of earlier keys).

  Chunked: within a chunk of `chunk` positions the masked [chunk, chunk] products (phi_q phi_k^T * tril) v, across
  chunks the running sum of phi_k v^T at each chunk's start, so memory is O(T / chunk * f * p + T * chunk), not the
  O(T f p) of a prefix sum per position (at Decision Transformer's 60 positions and f = p = 128 that prefix sum
  was most of a causal training step). The masked entries are exact zeros, so an output never depends on a later
  key or value.

  Args:
    phi_q, phi_k: [B, H, T, f]; v: [B, H, T, p] (zero where a key is padded); kv_carry: [B, H, f, p] or None.
  Returns:
    (numerator [B, H, T, p], the sum through the last position [B, H, f, p]).
  """
  b, h, t, f = phi_q.shape
  size = min(chunk, t)
  q_, k_, v_ = (in_chunks(x, size) for x in (phi_q, phi_k, v))  # zero keys add nothing; their outputs are dropped
  n = q_.shape[2]
  own = jnp.einsum("bhncf,bhncp->bhnfp", k_, v_)  # each chunk's sum of phi_k v^T
  start = jnp.zeros_like(own[:, :, 0]) if kv_carry is None else kv_carry.astype(own.dtype)
  through = start[:, :, None] + jnp.cumsum(own, axis=2)  # the sum through each chunk's end
  before = jnp.concatenate([start[:, :, None], through[:, :, :-1]], axis=2)  # ... and before its start
  scores = jnp.einsum("bhncf,bhndf->bhncd", q_, k_) * jnp.tril(jnp.ones((size, size), q_.dtype))
  num = jnp.einsum("bhncf,bhnfp->bhncp", q_, before) + jnp.einsum("bhncd,bhndp->bhncp", scores, v_)
  return num.reshape(b, h, n * size, -1)[:, :, :t], through[:, :, -1]
