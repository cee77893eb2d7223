"""`PrimalAttention`: the Flax Linen module of Primal-Attention.

It accepts the call signature of `flax.linen.MultiHeadDotProductAttention`, so
it can be passed wherever a Transformer takes that class. Each call sows the
layer's `KSVDTerms` in the `ksvd` collection (see `primal_jax.ksvd`) and the
e/r scores in `intermediates`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from primal_jax.attention.head import primal_head, vmap_over_heads_and_batch
from primal_jax.dropout import Dropout
from primal_jax.feature_maps import cosine_feature_map, random_feature_projection, softmax_kernel_feature_map
from primal_jax.initializers import linear_inits, torch_orthogonal_init, uniform01_init
from primal_jax.ksvd import KSVD_COLLECTION, ksvd_terms
from primal_jax.masks import padding_from_mask
from primal_jax.sampling import padding_aware_positions, release_sample_indices
from primal_jax.validation import (
  check_choice,
  check_divisible,
  check_finite,
  check_positive,
  check_rank,
  check_same_shape,
)

FEATURE_MAPS = ("cosine", "softmax_kernel")
SAMPLING_MODES = ("release", "padding_aware")


def _logical(init, names):
  return nn.with_logical_partitioning(init, names)


class PrimalAttention(nn.Module):
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
    The rest mirror `nn.MultiHeadDotProductAttention`.
  """

  num_heads: int
  low_rank: int = 20
  data_dependent: bool = True
  num_samples: int | None = None
  rank_multi: int = 10
  causal: bool = False
  feature_map: str = "cosine"
  feature_seed: int = 0
  sampling: str = "release"
  allow_repeated_samples: bool = True
  allow_rank_deficient: bool = False
  mask_outputs: bool = True
  init_style: str = "flax"
  debug_checks: bool = False
  dtype: Any = None
  param_dtype: Any = jnp.float32
  qkv_features: int | None = None
  out_features: int | None = None
  broadcast_dropout: bool = True
  dropout_rate: float = 0.0
  dropout_impl: str = "threefry"  # mask generator: "threefry" (nn.Dropout) | "hash" (primal_jax.dropout)
  deterministic: bool | None = None
  precision: Any = None
  kernel_init: Any = None
  bias_init: Any = None
  use_bias: bool = True
  decode: bool = False

  @property
  def sampled_rows(self) -> int | None:
    """n, the number of sampled rows (None when data-independent)."""
    if not self.data_dependent:
      return None
    return self.num_samples if self.num_samples is not None else self.low_rank * self.rank_multi

  def _validate(self):
    check_positive(self.num_heads, "num_heads")
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
    if self.decode and not self.causal:
      raise ValueError("decode=True needs causal=True (only the causal variant can be decoded token by token)")
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

  @nn.compact
  def __call__(
    self,
    inputs_q: jax.Array,
    inputs_k: jax.Array | None = None,
    inputs_v: jax.Array | None = None,
    *,
    inputs_kv: jax.Array | None = None,
    mask: jax.Array | None = None,
    deterministic: bool | None = None,
    dropout_rng: jax.Array | None = None,
    sow_weights: bool = False,
  ) -> jax.Array:
    """Applies Primal-Attention.

    Args:
      inputs_q: [B, N, D] the block input x.
      inputs_k: [B, N, D] keys input (default `inputs_q`); its rows build W_e|X.
      inputs_v: ignored (Primal-Attention has no value projection).
      inputs_kv: alias setting `inputs_k` (Flax compatibility).
      mask: [B, N] padding (True = real) or a Flax attention mask
        [B, 1|H, N, N] (a position is real iff it may attend to itself).
      deterministic: disables dropout; merged with the attribute.
      dropout_rng: optional explicit dropout key.
      sow_weights: ignored (there is no attention-weight matrix; the e/r
        scores are always sown in `intermediates`).
    Returns:
      [B, N, out_features].
    """
    del inputs_v, sow_weights
    self._validate()
    if inputs_kv is not None:
      if inputs_k is not None:
        raise ValueError("pass either inputs_k or inputs_kv, not both")
      inputs_k = inputs_kv
    inputs_k = inputs_q if inputs_k is None else inputs_k
    check_rank(inputs_q, 3, "inputs_q", "[batch, length, features]")
    check_same_shape(inputs_q, inputs_k, "inputs_q", "inputs_k")
    if self.debug_checks:
      check_finite(inputs_q, "inputs_q")
      check_finite(inputs_k, "inputs_k")
    batch, length, width = inputs_q.shape
    heads, s = self.num_heads, self.low_rank
    features = self.qkv_features or width
    check_divisible(features, heads, "qkv_features", "num_heads")
    p = features // heads
    n = self.sampled_rows
    if n is not None and features != width:
      raise ValueError(
        f"data-dependent weights split the block input into heads, so qkv_features ({features}) "
        f"must equal the input width ({width})"
      )
    if n is not None and length < n and not self.allow_repeated_samples:
      raise ValueError(
        f"sequence length {length} < num_samples n={n} and allow_repeated_samples=False "
        f"(the paper's rule n = min(s * rank_multi, N) needs N >= n)"
      )
    dtype = self.dtype or jnp.result_type(inputs_q.dtype, jnp.float32)

    kernel_init, bias_init = linear_inits(self.init_style, width, self.kernel_init, self.bias_init)
    project = functools.partial(
      nn.DenseGeneral,
      features=(heads, p),
      dtype=dtype,
      param_dtype=self.param_dtype,
      precision=self.precision,
      use_bias=self.use_bias,
      kernel_init=_logical(kernel_init, ("embed", "heads", "kv")),
      bias_init=_logical(bias_init, ("heads", "kv")),
    )
    q = jnp.swapaxes(project(name="query")(inputs_q), 1, 2)  # [B, H, N, p]
    k = jnp.swapaxes(project(name="key")(inputs_k), 1, 2)  # [B, H, N, p]

    a = n if n is not None else p
    orth = _logical(torch_orthogonal_init(), ("heads", None, "rank"))
    we = self.param("We", orth, (heads, a, s), self.param_dtype).astype(dtype)  # [H, a, s]
    wr = self.param("Wr", orth, (heads, a, s), self.param_dtype).astype(dtype)  # [H, a, s]
    lam = self.param("Lambda", _logical(uniform01_init(), ("heads", "rank")), (heads, s), self.param_dtype)

    padding = padding_from_mask(mask, batch, length)  # [B, N] bool or None
    aware = self.sampling == "padding_aware" and padding is not None
    valid = padding.astype(dtype) if aware else None  # [B, N] 0/1 or None

    rows = None
    if n is not None:
      if aware:
        positions = padding_aware_positions(padding, n)  # [B, n]
        rows = jnp.take_along_axis(inputs_k, positions[:, :, None], axis=1)
      else:
        rows = inputs_k[:, release_sample_indices(length, n)]  # [B, n, D]
      rows = jnp.swapaxes(rows.astype(dtype).reshape(batch, n, heads, p), 1, 2)  # [B, H, n, p]

    feature_fn, normalize = self._features(p)
    offset = None
    running_mean = self.causal
    if self.decode:
      q, k, offset = self._decode_state(q, k, valid, feature_fn if normalize else None)
      running_mean = False
    head_fn = functools.partial(
      primal_head,
      feature_map=feature_fn,
      running_mean=running_mean,
      normalize=normalize,
      causal_normalizer=self.causal,
    )
    lifted = vmap_over_heads_and_batch(
      lambda *args: head_fn(*args[:6], key_sum_offset=args[6]),
      has_rows=rows is not None,
      has_valid=valid is not None,
      has_offset=offset is not None,
    )
    escore, rscore, we_x, wr_x = lifted(q, k, we, wr, rows, valid, offset)  # [B,H,N,s], [B,H,p,s]
    # Not while initialising: `init` would return stale terms that a later
    # `apply(variables, mutable=["ksvd"])` appends to.
    if not self.is_initializing():
      self.sow("intermediates", "escore", escore)
      self.sow("intermediates", "rscore", rscore)
      if not self.decode:
        self.sow(KSVD_COLLECTION, "terms", ksvd_terms(escore, rscore, lam, we, wr, we_x, wr_x, valid))

    combine_kernel, combine_bias = linear_inits(self.init_style, 2 * s, self.kernel_init, self.bias_init)
    heads_out = nn.Dense(
      p,
      dtype=dtype,
      param_dtype=self.param_dtype,
      precision=self.precision,
      kernel_init=_logical(combine_kernel, ("rank2", "kv")),
      bias_init=_logical(combine_bias, ("kv",)),
      name="combine",
    )(jnp.concatenate([escore, rscore], axis=-1))  # [B, H, N, p], one Linear for all heads
    if padding is not None and self.mask_outputs:
      heads_out = heads_out * padding[:, None, :, None].astype(heads_out.dtype)
    if self.dropout_rate > 0.0:
      deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
      heads_out = Dropout(self.dropout_rate, broadcast_dims=(), impl=self.dropout_impl, name="dropout")(
        heads_out, deterministic=deterministic, rng=dropout_rng
      )
    out_kernel, out_bias = linear_inits(self.init_style, features, self.kernel_init, self.bias_init)
    return nn.DenseGeneral(
      features=self.out_features or width,
      axis=(-2, -1),
      dtype=dtype,
      param_dtype=self.param_dtype,
      precision=self.precision,
      use_bias=self.use_bias,
      kernel_init=_logical(out_kernel, ("heads", "kv", "embed")),
      bias_init=_logical(out_bias, ("embed",)),
      name="out",
    )(jnp.swapaxes(heads_out, 1, 2))  # [B, N, H, p] -> [B, N, D_out]

  def _decode_state(self, q, k, valid, feature_fn):
    """Running means of a chunk of T new tokens from the cached sums.

    The cache holds, per sequence and head, sum_q, sum_k [B, H, p] and the
    token count [B] (plus sum phi_k for the softmax-kernel normaliser): the
    causal layer's whole state, independent of the sequence length.

    Returns q_mean, k_mean [B, H, T, p] and the normaliser offset [B, H, m] or None.
    """
    batch, heads, chunk, p = q.shape
    initialized = self.has_variable("cache", "sum_q")
    f32 = jnp.float32
    sum_q = self.variable("cache", "sum_q", jnp.zeros, (batch, heads, p), f32)
    sum_k = self.variable("cache", "sum_k", jnp.zeros, (batch, heads, p), f32)
    count = self.variable("cache", "count", jnp.zeros, (batch,), f32)
    w = jnp.ones((batch, chunk), f32) if valid is None else valid.astype(f32)  # [B, T]
    counts = count.value[:, None] + jnp.cumsum(w, axis=1)  # [B, T]
    denom = jnp.maximum(counts, 1.0)[:, None, :, None]
    run_q = sum_q.value[:, :, None] + jnp.cumsum(q.astype(f32) * w[:, None, :, None], axis=2)
    run_k = sum_k.value[:, :, None] + jnp.cumsum(k.astype(f32) * w[:, None, :, None], axis=2)
    q_mean, k_mean = (run_q / denom).astype(q.dtype), (run_k / denom).astype(k.dtype)
    offset = None
    if feature_fn is not None:
      sum_phi_k = self.variable("cache", "sum_phi_k", jnp.zeros, (batch, heads, p), f32)
      offset = sum_phi_k.value
    if initialized:
      sum_q.value, sum_k.value, count.value = run_q[:, :, -1], run_k[:, :, -1], counts[:, -1]
      if feature_fn is not None:
        phi_k = feature_fn(k_mean).astype(f32) * w[:, None, :, None]
        sum_phi_k.value = offset + jnp.sum(phi_k, axis=2)
    return q_mean, k_mean, offset
