"""`PrimalAttention`: the Flax Linen module of Primal-Attention.

It accepts the call signature of `flax.linen.MultiHeadDotProductAttention`, so
it can be passed wherever a Transformer takes that class. Each call sows the
layer's `KSVDTerms` in the `ksvd` collection (see `primal_jax.ksvd`; a 1-tuple
under "terms", replaced by every call) and the e/r scores in `intermediates`.

Under `nn.scan` over blocks, stack the collection with the parameters
(`variable_axes={"params": 0, "ksvd": 0}`) and name the new parameter axis for
the logical partitioning the parameters carry:
`metadata_params={nn.PARTITION_NAME: "layers"}` (Flax refuses to scan boxed
parameters without it); `ksvd_loss` reads the stacked terms as one layer per
index of the leading axis.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import linen as nn

from primal_jax.attention.head import head_features, primal_head, vmap_over_heads_and_batch
from primal_jax.attention.shell import AttentionShell
from primal_jax.dual import induced_kernel
from primal_jax.feature_maps import cosine_feature_map, random_feature_projection, softmax_kernel_feature_map
from primal_jax.initializers import torch_orthogonal_init, uniform01_init
from primal_jax.ksvd import KSVD_COLLECTION, ksvd_terms
from primal_jax.masks import mask_honoured, mask_values_ok, padding_from_mask, refuse_unhonoured
from primal_jax.sampling import padding_aware_positions, release_sample_indices
from primal_jax.validation import check_choice, check_positive

FEATURE_MAPS = ("cosine", "softmax_kernel")
SAMPLING_MODES = ("release", "padding_aware")


def _replace(_, value):
  return (value,)


def _heads_major(x):
  """[B, N, H, ...] <-> [B, H, N, ...] (None passes through)."""
  return None if x is None else jnp.swapaxes(x, 1, 2)


class PrimalAttention(AttentionShell):
  """Self-attention as asymmetric kernel SVD in the primal (Chen et al., 2023).

  Per head h: phi_q, phi_k = phi(x Wq), phi(x Wk); e = phi_q W_e|X,
  r = phi_k W_r|X; head output = Linear_{2s -> p}([e; r]) (one Linear shared by
  all heads); heads merged and projected to `out_features`. There is no value
  projection: `inputs_v` is accepted for compatibility and ignored.

  Attributes:
    num_heads: H.
    low_rank: s, the number of projection directions.
    data_dependent: W_e|X = F_X^T W_e with F_X the n sampled input rows
      ([H, n, s] parameters); else W_e|X = W_e ([H, p, s]).
    num_samples: n (data-dependent only); default `low_rank * rank_multi`.
    rank_multi: the release's n / s ratio used when `num_samples` is None.
    causal: running means of q and k over j <= i before the feature map
      (appendix B); needs data-independent weights.
    feature_map: "cosine" (every published experiment) or "softmax_kernel"
      (Remark 4.1 positive random features with the D^-1/2 normaliser).
    feature_seed: seed of the fixed random features of "softmax_kernel".
    sampling: "release" (positions trunc(linspace(0, N-1, n)), padded ones
      included, every position in the KSVD means) or "padding_aware" (only
      real positions are sampled, averaged and counted in running means).
    allow_repeated_samples: if False, N < n is an error instead of repeated rows.
    allow_rank_deficient: allow s > n (W_e|X then has at most n independent
      columns). The release's UEA scripts do this for short series
      (JapaneseVowels: s = 40, n = min(29, 200) = 29); otherwise it is an error.
    mask_outputs: zero the head outputs at padded positions (release LRA).
    init_style: "flax", "torch" (the release's nn.Linear init) or "gpt2".
    debug_checks: raise ValueError on NaN/inf inputs (costs a host sync).
    decode: incremental causal decoding; the `cache` collection holds the
      running sums of q and k per head (O(1) memory in the sequence length).
    num_kv_heads: grouped key heads (there are no values): each key projection head shared by
      num_heads / num_kv_heads query heads, W_e, W_r and Lambda per query head; the decoding cache keeps the
      key sums per key head.
    The rest mirror `nn.MultiHeadDotProductAttention`.
  """

  low_rank: int = 20
  data_dependent: bool = True
  num_samples: int | None = None
  rank_multi: int = 10
  feature_map: str = "cosine"
  feature_seed: int = 0
  sampling: str = "release"
  allow_repeated_samples: bool = True
  allow_rank_deficient: bool = False
  mask_outputs: bool = True

  projections: ClassVar[tuple[str, ...]] = ("query", "key")
  supports_decode: ClassVar[bool] = True
  # Grouped key heads: head h's r-scores are phi(x W_k,g(h)) W_r,h|X, a key projection shared by a group of query
  # heads with W_e, W_r, Lambda still per query head (each head's asymmetric kernel and KSVD terms as before).
  supports_kv_groups: ClassVar[bool] = True
  self_attention_only: ClassVar[bool] = True  # W_e|X and W_r|X come from one sequence's rows

  @property
  def mixed_pairs(self) -> str:
    """Which (query i, key j) pairs of real positions the outputs mix: "causal", "all" or "self".

    Sampled rows span the whole input and the softmax-kernel normaliser sums over keys ("all");
    a data-independent cosine layer maps each x_i alone ("self").
    """
    if self.causal:
      return "causal"
    return "all" if self.data_dependent or self.feature_map != "cosine" else "self"

  @property
  def decode_needs_causal(self) -> bool:
    """Whether `decode=True` asks for `causal=True`: not for a data-independent cosine layer, whose output at
    position i reads x_i alone ("self"), so it decodes a token at a time with no state (Flax's decode flag alone,
    e.g. Flax's wmt decoder under a causal mask); every other form decodes its causal form."""
    return self.mixed_pairs != "self"

  @property
  def sampled_rows(self) -> int | None:
    """n, the number of sampled rows (None when data-independent)."""
    if not self.data_dependent:
      return None
    return self.num_samples if self.num_samples is not None else self.low_rank * self.rank_multi

  def validate(self):
    check_positive(self.low_rank, "low_rank")
    check_positive(self.rank_multi, "rank_multi")
    if self.num_samples is not None:
      check_positive(self.num_samples, "num_samples")
    check_choice(self.feature_map, FEATURE_MAPS, "feature_map")
    check_choice(self.sampling, SAMPLING_MODES, "sampling")
    if self.causal and self.data_dependent:
      raise ValueError(
        "causal=True needs data_dependent=False: rows sampled over the whole sequence would leak "
        "future positions into W_e|X"
      )
    n = self.sampled_rows
    if n is not None and self.low_rank > n and not self.allow_rank_deficient:
      raise ValueError(
        f"low_rank (s={self.low_rank}) must be <= num_samples (n={n}): W_e|X = F_X^T W_e has rank <= n "
        "(set allow_rank_deficient=True to accept this, as the release's UEA scripts do)"
      )

  def _features(self, p: int):
    if self.feature_map == "cosine":
      return cosine_feature_map, False
    projection = random_feature_projection(jax.random.key(self.feature_seed), p, p)
    return functools.partial(softmax_kernel_feature_map, projection=projection), True

  def attend(self, q, k, v, *, inputs_k, mask, deterministic, dropout_rng, sow_weights):
    """Primal-Attention's core: q, k [B, N, H, p] (no values) -> head outputs [B, N, H, p].

    `inputs_k` [B, N, D] is the block input whose sampled rows build W_e|X. `mask` is [B, N]
    padding (True = real) or a Flax attention mask [B, 1|H, N, N] (a position is real iff it may
    attend to itself). A mask that forbids pairs of real positions the layer mixes (a causal mask
    for a non-causal layer, a block mask) or holds values other than 0/1 (an additive mask) is
    refused: ValueError when the mask is concrete, NaN outputs for those sequences under `jit`
    (plus the ValueError from a host callback with `debug_checks`). `sow_weights` is ignored: there
    is no attention-weight matrix; the e/r scores are always sown in `intermediates`, the induced
    kernel in the spectrum collection.
    """
    del v, sow_weights
    batch, length, heads, p = q.shape
    width = inputs_k.shape[-1]
    dtype, s, n = q.dtype, self.low_rank, self.sampled_rows
    if n is not None and heads * p != width:
      raise ValueError(
        f"data-dependent weights split the block input into heads, so qkv_features ({heads * p}) "
        f"must equal the input width ({width})"
      )
    if n is not None and length < n and not self.allow_repeated_samples:
      raise ValueError(
        f"sequence length {length} < num_samples n={n} and allow_repeated_samples=False "
        f"(the paper's rule n = min(s * rank_multi, N) needs N >= n)"
      )
    # The heads are computed in the token-major layout q and k arrive in ([B, N, H, p]): swapping to
    # [B, H, N, p] costs XLA:CPU a copy of every per-head tensor and of its gradient (about a fifth of the
    # LRA step at N = 4096 went to such transposes); vmapping over the head axis in place lets XLA fold
    # the layout change into the fusions that produce and consume the features.

    a = n if n is not None else p
    orth = self.logical(torch_orthogonal_init(), ("heads", None, "rank"))
    we = self.param("We", orth, (heads, a, s), self.param_dtype).astype(dtype)  # [H, a, s]
    wr = self.param("Wr", orth, (heads, a, s), self.param_dtype).astype(dtype)  # [H, a, s]
    lam = self.param("Lambda", self.logical(uniform01_init(), ("heads", "rank")), (heads, s), self.param_dtype)

    padding = padding_from_mask(mask, batch, length)  # [B, N] bool or None
    checks = self._mask_checks(mask, padding)
    aware = self.sampling == "padding_aware" and padding is not None
    valid = padding.astype(dtype) if aware else None  # [B, N] 0/1 or None

    rows = None
    if n is not None:
      if aware:
        positions = padding_aware_positions(padding, n)  # [B, n]
        rows = jnp.take_along_axis(inputs_k, positions[:, :, None], axis=1)
      else:
        rows = inputs_k[:, release_sample_indices(length, n)]  # [B, n, D]
      rows = rows.astype(dtype).reshape(batch, n, heads, p)  # [B, n, H, p]

    feature_fn, normalize = self._features(p)
    offset = None
    running_mean = self.causal
    if self.decode and self.causal:
      q, k, offset = self._decode_state(_heads_major(q), _heads_major(k), valid, feature_fn if normalize else None)
      q, k = _heads_major(q), _heads_major(k)  # the chunk's running means, back to [B, T, H, p]
      running_mean = False
    elif self.decode:  # pointwise ("self"): no state; the cache counts the tokens seen, batch-leading
      self._count_tokens(valid, batch, length)
    head_options = dict(
      feature_map=feature_fn, running_mean=running_mean, normalize=normalize, causal_normalizer=self.causal
    )
    lifted = vmap_over_heads_and_batch(
      lambda *args: primal_head(*args[:6], key_sum_offset=args[6], **head_options),
      has_rows=rows is not None,
      has_valid=valid is not None,
      has_offset=offset is not None,
      token_major=True,
    )
    escore_t, rscore_t, we_x, wr_x = lifted(q, k, we, wr, rows, valid, offset)  # [B,N,H,s], [B,H,p,s]
    escore, rscore = _heads_major(escore_t), _heads_major(rscore_t)  # [B, H, N, s]: read by reductions only
    # Not while initialising: `init` would return stale terms that a later
    # `apply(variables, mutable=["ksvd"])` appends to.
    if not self.is_initializing():
      self.sow("intermediates", "escore", escore)
      self.sow("intermediates", "rscore", rscore)
      if not self.decode:
        # Replaced, not appended: state merged back into the variables ({**variables, **state}, as for
        # batch_stats) must not pile up stale terms (a growing tuple, stale terms in the loss, a retrace
        # per step). The price: a layer called twice in one apply keeps its last call's terms.
        terms = ksvd_terms(escore, rscore, lam, we, wr, we_x, wr_x, valid)
        self.sow(KSVD_COLLECTION, "terms", terms, reduce_fn=_replace, init_fn=tuple)
    self.sow_matrix(
      "primal",
      lambda: self._induced_kernel(*map(_heads_major, (q, k, rows)), valid, head_options),
      mask,
      batch,
      length,
    )

    combine_kernel, combine_bias = self.linear_inits(2 * s, ("rank2", "kv"), ("kv",))
    heads_out = nn.Dense(
      p,
      dtype=dtype,
      param_dtype=self.param_dtype,
      precision=self.precision,
      kernel_init=combine_kernel,
      bias_init=combine_bias,
      name="combine",
    )(jnp.concatenate([escore_t, rscore_t], axis=-1))  # [B, N, H, p], one Linear for all heads
    if padding is not None and self.mask_outputs:
      heads_out = heads_out * padding[:, :, None, None].astype(heads_out.dtype)
    # The dropout mask is drawn for the [B, H, N, p] layout, so a seed drops the same elements as before.
    heads_out = _heads_major(self.apply_dropout(_heads_major(heads_out), deterministic, dropout_rng))
    for ok, message in checks:
      heads_out = refuse_unhonoured(heads_out, ok, message, self.debug_checks)
    return heads_out  # [B, N, H, p]

  def _mask_checks(self, mask, padding) -> list[tuple[jax.Array, str]]:
    """([B] ok, message) pairs: the mask's values are 0/1, and it forbids no pair the layer mixes.

    Primal-Attention has no N x N score matrix to edit: a mask acts only through the padding it
    implies (`sampling` says how). A mask forbidding pairs of real positions (causal, block,
    per-head) would otherwise be silently reduced to that padding.
    """
    if mask is None:
      return []
    values = (
      mask_values_ok(mask, padding.shape[0]),
      "PrimalAttention: mask must hold only 0 and 1 or booleans (True = may attend); an additive mask "
      "(0 = attend, -inf = not) is not accepted: pass the boolean mask it was built from",
    )
    pairs = self.mixed_pairs
    hint = (
      "for a causal mask set causal=True (with data_dependent=False)"
      if pairs == "all"
      else "a causal layer honours padding and causality only"
    )
    honoured = (
      mask_honoured(mask, padding, pairs),
      f"PrimalAttention cannot honour this mask: it forbids pairs of real positions that the layer mixes "
      f"({pairs!r}; a mask acts only through its padding, the diagonal); {hint}",
    )
    return [values, honoured]

  @staticmethod
  def _induced_kernel(q, k, rows, valid, head_options) -> jax.Array:
    """[B, H, N, N] K = phi_q F_X^T F_X phi_k^T of every head (Theorem 3.2), from this call's q, k, rows.

    Remark 4.1's D^-1/2 scales position i's scores, so it is folded into phi_q(x_i) and phi_k(x_i):
    the kernel is then the one whose dual form gives the layer's scores.
    """
    features = functools.partial(head_features, **head_options)
    in_axes = (0, 0, None if valid is None else 0)
    phi_q, phi_k, scale = jax.vmap(jax.vmap(features, in_axes=(0, 0, None)), in_axes=in_axes)(q, k, valid)
    if scale is not None:
      phi_q, phi_k = phi_q * scale[..., None], phi_k * scale[..., None]
    # The analysis wants exact float32 products, not the TF32/bf16 passes accelerators use by default.
    with jax.default_matmul_precision("highest"):
      return induced_kernel(phi_q.astype(jnp.float32), phi_k.astype(jnp.float32), rows)

  @staticmethod
  def _check_cache_batch(cached: int, batch: int) -> None:
    """A decoding chunk of another batch than the cache's is refused (static shapes: also under `jit`)."""
    if cached != batch:
      raise ValueError(f"PrimalAttention decode: the chunk's batch ({batch}) differs from the cache's ({cached})")

  def _count_tokens(self, valid, batch: int, chunk: int) -> None:
    """The pointwise decoding's cache: the number of real tokens seen per sequence [B] (Flax's examples read
    `init(...)["cache"]`, and a batch-leading leaf is what beam searches gather)."""
    initialized = self.has_variable("cache", "count")
    count = self.variable("cache", "count", jnp.zeros, (batch,), jnp.float32)
    self._check_cache_batch(count.value.shape[0], batch)
    if initialized:
      seen = jnp.full((batch,), float(chunk)) if valid is None else jnp.sum(valid.astype(jnp.float32), axis=1)
      count.value = count.value + seen

  def _decode_state(self, q, k, valid, feature_fn):
    """Running means of a chunk of T new tokens from the cached sums.

    The cache holds, per sequence and head, sum_q, sum_k [B, H, p] and the
    token count [B] (plus sum phi_k for the softmax-kernel normaliser): the
    causal layer's whole state, independent of the sequence length.

    Returns q_mean, k_mean [B, H, T, p] and the normaliser offset [B, H, m] or None.
    """
    batch, heads, chunk, p = q.shape
    initialized = self.has_variable("cache", "sum_q")
    if initialized:
      self._check_cache_batch(self.get_variable("cache", "count").shape[0], batch)
    f32 = jnp.float32
    sum_q = self.variable("cache", "sum_q", jnp.zeros, (batch, heads, p), f32)
    sum_k, store_k = self.kv_state("sum_k", jnp.zeros((batch, heads, p), f32))  # per key head when grouped
    count = self.variable("cache", "count", jnp.zeros, (batch,), f32)
    w = jnp.ones((batch, chunk), f32) if valid is None else valid.astype(f32)  # [B, T]
    counts = count.value[:, None] + jnp.cumsum(w, axis=1)  # [B, T]
    denom = jnp.maximum(counts, 1.0)[:, None, :, None]
    run_q = sum_q.value[:, :, None] + jnp.cumsum(q.astype(f32) * w[:, None, :, None], axis=2)
    run_k = sum_k[:, :, None] + jnp.cumsum(k.astype(f32) * w[:, None, :, None], axis=2)
    q_mean, k_mean = (run_q / denom).astype(q.dtype), (run_k / denom).astype(k.dtype)
    offset = None
    if feature_fn is not None:  # one random-feature projection for all heads: equal within a key group too
      offset, store_phi_k = self.kv_state("sum_phi_k", jnp.zeros((batch, heads, p), f32))
    if initialized:
      sum_q.value, count.value = run_q[:, :, -1], counts[:, -1]
      store_k(run_k[:, :, -1])
      if feature_fn is not None:
        phi_k = feature_fn(k_mean).astype(f32) * w[:, None, :, None]
        store_phi_k(offset + jnp.sum(phi_k, axis=2))
    return q_mean, k_mean, offset
