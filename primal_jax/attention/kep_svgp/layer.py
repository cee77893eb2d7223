"""`KEPSVGPAttention`: KEP-SVGP attention (Chen et al., ICML 2024) as a mechanism of the one attention shell.

Each call sows the layer's `KSVDTerms` in the `ksvd` collection (as Primal layers do; the release's KSVD term is
`KEP_KSVD_SPEC`) and its KL term in the `kl` collection (`KL_COLLECTION`, a scalar under "kl", replaced by every
call). The posterior noise is drawn from the "posterior" rng stream (falling back to "params" while initialising);
a caller may fix it instead by passing the `random_state` collection with `{"eps": array}` at the layer's path
(shape `posterior.noise_shape(...)`, with a leading sample axis when evaluating with `eval_samples > 1`).
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import linen as nn

from primal_jax.attention.baselines.common import RANDOM_STATE_COLLECTION
from primal_jax.attention.kep_svgp.core import kep_core
from primal_jax.attention.kep_svgp.posterior import (
  FORMS,
  kl_divergence,
  lambda_from_log,
  noise_shape,
  posterior_factors,
)
from primal_jax.attention.shell import AttentionShell
from primal_jax.initializers import linear_inits, torch_orthogonal_init, uniform01_init
from primal_jax.ksvd import KSVD_COLLECTION, KSVDSpec, ksvd_terms
from primal_jax.masks import mask_honoured, mask_values_ok, padding_from_mask, refuse_unhonoured
from primal_jax.sampling import padding_aware_positions, release_sample_indices
from primal_jax.validation import check_choice, check_positive

KL_COLLECTION = "kl"
# The project's collection of replayed randomness (Performer's features, Reformer's rotations): the NNX layers and
# `through_nnx` carry it, so fixed noise reaches a KEP layer through either front end.
NOISE_COLLECTION = RANDOM_STATE_COLLECTION
NOISE_STREAM = "posterior"
# The release's KSVD term (`CIFAR/train.py compute_loss`): lam to the first power inside the squared norms, means
# over batch, heads and positions, the trace of the raw parameters, J squared once per layer and SUMMED over layers.
KEP_KSVD_SPEC = KSVDSpec(convention="release", trace="params", reduction="batch", layer_reduce="sum")


def _replace(_, value):
  return (value,)


def _logical(module, init, names):
  """`init` with logical axis `names` by the shell's rule (`AttentionShell.logical`: boxed when the layer is
  partitioned); a shell without that rule boxes every parameter."""
  rule = getattr(module, "logical", None)
  return rule(init, names) if rule is not None else nn.with_logical_partitioning(init, names)


def _linear_inits(module, fan_in: int, kernel_names, bias_names):
  """(kernel_init, bias_init) of one of the layer's own Linears (`AttentionShell.linear_inits` where it exists)."""
  rule = getattr(module, "linear_inits", None)
  if rule is not None:
    return rule(fan_in, kernel_names, bias_names)
  kernel, bias = linear_inits(module.init_style, fan_in, module.kernel_init, module.bias_init)
  return _logical(module, kernel, kernel_names), _logical(module, bias, bias_names)


def kl_loss(collection) -> jax.Array:
  """Sum of the KEP layers' KL terms in a Linen `kl` collection (the dict `apply(..., mutable=["kl"])` returns),
  one term per layer (the release sums over layers); ValueError when it holds none (an apply without
  mutable=["kl"] would otherwise silently drop the KL)."""
  leaves = jax.tree_util.tree_leaves(collection)
  if not leaves:
    raise ValueError(
      "the kl collection holds no KL term: apply the model with mutable=['kl'] (KEP layers sow only then)"
    )
  return sum(jnp.sum(leaf) for leaf in leaves)


def nnx_kl_loss(model) -> jax.Array:
  """Sum of the KL terms of the NNX KEP layers in `model` (`primal_jax.nnx`), from their parameters.

  The KL depends on the parameters only (not on the data), so it is computed here rather than carried by a call;
  ValueError when `model` has no KEP layer.
  """
  from flax import nnx  # NNX users only

  found = [
    kl_from_params(node.params_tree(), node.linen_layer().form)
    for _, node in nnx.iter_graph(model)
    if getattr(type(node), "linen_class", None) is not None and issubclass(type(node).linen_class, KEPSVGPAttention)
  ]
  if not found:
    raise ValueError("the model has no NNX KEP-SVGP layer (no KL term)")
  return sum(found)


def kl_from_params(params: dict, form: str) -> jax.Array:
  """The KL term of one layer from its `params` (the Linen tree or the NNX `params_tree()`)."""
  lam = lambda_from_log(params["log_lambda"])
  factors = posterior_factors(params["s_sqrt_low_triangle"], params["log_ssqrt"], form)
  return kl_divergence(lam, params["log_lambda"], params["m_u"], factors, params["log_ssqrt"])


class KEPSVGPAttention(AttentionShell):
  """Self-attention whose head outputs are samples of a KEP-SVGP posterior over Primal-Attention's KSVD features.

  Per head: phi_q, phi_k = cosine(q), cosine(k); e = phi_q W_e|X, r = phi_k W_r|X (n sampled rows X of the layer
  input); z = e + r (or [e; r] over rows with `concat`); the GP output f = z lam^2 m + noise (see
  `primal_jax.attention.kep_svgp.posterior`); head output = Linear_{s -> p}(f) (one Linear for all heads; with
  `concat` the 2N rows are mixed back to N by a Linear over rows). There is no value projection.

  A mask ([B, N] padding, or a Flax attention mask whose diagonal gives the padding) acts through its padding
  only: rows are sampled among real positions (the release's rule over each sequence's real positions), the KSVD
  sums run over real positions, and padded outputs are zero; a mask forbidding pairs of real positions is refused.
  The release has no mask; without one the rows are the release's `linspace` rows.

  Attributes:
    low_rank: s, the number of projection directions (and GP output dims).
    rank_multi: n = low_rank * rank_multi sampled rows (capped at `embed_len`).
    embed_len: the release's token count; n = min(embed_len, low_rank * rank_multi). Needed by `concat`, whose
      row mixing Linear is [2 embed_len -> embed_len] (then N must equal embed_len).
    concat: [e; r] over rows instead of e + r (the release's `concate=True`).
    form: "paper" (default: factor, noise and KL consistent) or "release" (the authors' code, quirks included).
    eval_samples: posterior samples averaged at evaluation (`deterministic=True`); 0 = the posterior mean.
      Training always draws one sample.
    sample_posterior: False gives the posterior mean in training and evaluation alike (a deterministic layer that
      draws no noise); the KL and KSVD terms are unchanged.
    The rest: see `AttentionShell`. The release has no q/k bias (`use_bias=False`) and no output projection
    (its converter sets `out` to the identity).
  """

  low_rank: int = 10
  rank_multi: int = 10
  embed_len: int | None = None
  concat: bool = False
  form: str = "paper"
  eval_samples: int = 1
  sample_posterior: bool = True

  projections: ClassVar[tuple[str, ...]] = ("query", "key")
  supports_causal: ClassVar[bool] = False
  self_attention_only: ClassVar[bool] = True
  # Grouped key heads (`num_kv_heads`): as for Primal, head h's r-scores read its group's shared key projection
  # while W_e, W_r, the posterior and its KL stay per query head; the shell repeats the key heads.
  supports_kv_groups: ClassVar[bool] = True

  @property
  def sampled_rows(self) -> int:
    n = self.low_rank * self.rank_multi
    return n if self.embed_len is None else min(n, self.embed_len)

  def rng_streams(self) -> tuple[str, ...]:
    """The "posterior" stream, unless the layer never samples (`sample_posterior=False`)."""
    return (NOISE_STREAM,) if self.sample_posterior else ()

  def validate(self):
    check_positive(self.low_rank, "low_rank")
    check_positive(self.rank_multi, "rank_multi")
    check_choice(self.form, FORMS, "form")
    if self.embed_len is not None:
      check_positive(self.embed_len, "embed_len")
    if self.concat and self.embed_len is None:
      raise ValueError("concat=True needs embed_len (its row-mixing Linear is [2 embed_len -> embed_len])")
    if not isinstance(self.eval_samples, int) or self.eval_samples < 0:
      raise ValueError(f"eval_samples must be an integer >= 0 (0 = posterior mean), got {self.eval_samples!r}")

  def _noise(self, shape, samples: int, dtype):
    """[S, *shape] standard normal: the fixed noise (`random_state` "eps") if given, else the "posterior" stream."""
    full = (samples, *shape)
    if self.has_variable(NOISE_COLLECTION, "eps"):
      eps = jnp.asarray(self.get_variable(NOISE_COLLECTION, "eps"))
      eps = eps[None] if eps.shape == tuple(shape) else eps
      if eps.shape != full:
        raise ValueError(
          f"random_state eps (the fixed posterior noise) must have shape {tuple(shape)} or {full}, got {eps.shape}"
        )
      return eps.astype(dtype)
    return jax.random.normal(self.make_rng(NOISE_STREAM), full, dtype)

  def attend(self, q, k, v, *, inputs_k, mask, deterministic, dropout_rng, sow_weights):
    """q, k [B, N, H, p] -> head outputs [B, N, H, p] (posterior samples through the final Linear)."""
    del v, sow_weights
    batch, length, heads, p = q.shape
    padding = padding_from_mask(mask, batch, length)  # [B, N] bool or None
    if padding is not None and self.concat:
      raise ValueError("KEPSVGPAttention: concat=True mixes all 2N rows into every output row, so it takes no mask")
    width, dtype, s, n = inputs_k.shape[-1], q.dtype, self.low_rank, self.sampled_rows
    if heads * p != width:
      raise ValueError(
        f"the sampled rows of the layer input are split into heads, so qkv_features ({heads * p}) must equal "
        f"the input width ({width})"
      )
    if self.concat and length != self.embed_len:
      raise ValueError(
        f"concat=True mixes 2 embed_len rows: sequence length {length} must equal embed_len {self.embed_len}"
      )
    orth = _logical(self, torch_orthogonal_init(), ("heads", None, "rank"))
    # A logical name occurs once per array (Flax's rule): the second and third rank axes are unnamed (replicated).
    normal = _logical(self, nn.initializers.normal(1.0), ("heads", "rank", None))
    pdt = self.param_dtype
    params = {
      "We": self.param("We", orth, (heads, n, s), pdt),
      "Wr": self.param("Wr", orth, (heads, n, s), pdt),
      "log_lambda": self.param("log_lambda", _logical(self, uniform01_init(), ("heads", "rank")), (heads, s), pdt),
      "m_u": self.param("m_u", normal, (heads, s, s), pdt),
      "s_sqrt_low_triangle": self.param(
        "s_sqrt_low_triangle",
        _logical(self, nn.initializers.normal(1.0), ("heads", "rank", None, None)),
        (heads, s, s, s),
        pdt,
      ),
      "log_ssqrt": self.param("log_ssqrt", normal, (heads, s, s), pdt),
    }
    kernel_init, bias_init = _linear_inits(self, s, ("rank", "kv"), ("kv",))
    params["final_kernel"] = self.param("final_kernel", kernel_init, (s, p), pdt)
    params["final_bias"] = self.param("final_bias", bias_init, (p,), pdt)
    rows_out = 2 * length if self.concat else length
    if self.concat:
      mix_kernel, mix_bias = _linear_inits(self, rows_out, (None, None), (None,))
      params["row_mix_kernel"] = self.param("row_mix_kernel", mix_kernel, (rows_out, length), pdt)
      params["row_mix_bias"] = self.param("row_mix_bias", mix_bias, (length,), pdt)
    params = {name: value.astype(dtype) for name, value in params.items()}

    if padding is None:
      rows = inputs_k[:, release_sample_indices(length, n)]
    else:  # the release's rule over each sequence's real positions: padding never reaches a real output
      rows = jnp.take_along_axis(inputs_k, padding_aware_positions(padding, n)[:, :, None], axis=1)
    rows = rows.astype(dtype).reshape(batch, n, heads, p)
    det = self.deterministic if deterministic is None else deterministic
    samples = (self.eval_samples if det else 1) if self.sample_posterior else 0
    if samples == 0:
      out = kep_core(q, k, rows, params, None, form=self.form, concat=self.concat)
      heads_out = out.heads_out
    else:
      eps = self._noise(noise_shape(batch, heads, rows_out, s, self.form), samples, dtype)
      run = jax.vmap(lambda e: kep_core(q, k, rows, params, e, form=self.form, concat=self.concat))
      outs = run(eps)
      out = jax.tree_util.tree_map(lambda a: a[0], outs)
      heads_out = jnp.mean(outs.heads_out, axis=0)

    if not self.is_initializing():
      self.sow("intermediates", "escore", out.escore)
      self.sow("intermediates", "rscore", out.rscore)
      lam = lambda_from_log(params["log_lambda"])
      valid = None if padding is None else padding.astype(dtype)
      terms = ksvd_terms(out.escore, out.rscore, lam, params["We"], params["Wr"], out.we_x, out.wr_x, valid)
      self.sow(KSVD_COLLECTION, "terms", terms, reduce_fn=_replace, init_fn=tuple)
      self.sow(
        KL_COLLECTION, "kl", out.kl.astype(jnp.promote_types(dtype, jnp.float32)), reduce_fn=_replace, init_fn=tuple
      )
    if padding is not None:
      heads_out = heads_out * padding[:, :, None, None].astype(heads_out.dtype)
    heads_out = jnp.swapaxes(self.apply_dropout(jnp.swapaxes(heads_out, 1, 2), deterministic, dropout_rng), 1, 2)
    for ok, message in self._mask_checks(mask, padding):
      heads_out = refuse_unhonoured(heads_out, ok, message, self.debug_checks)
    return heads_out  # [B, N, H, p]

  def _mask_checks(self, mask, padding) -> list[tuple[jax.Array, str]]:
    """A mask acts only through the padding it implies: one forbidding pairs of real positions (the sampled rows
    span the whole sequence) or holding values other than 0/1 is refused, as for Primal-Attention."""
    if mask is None:
      return []
    return [
      (
        mask_values_ok(mask, padding.shape[0]),
        "KEPSVGPAttention: mask must hold only 0 and 1 or booleans (True = may attend), not an additive mask",
      ),
      (
        mask_honoured(mask, padding, "all"),
        "KEPSVGPAttention cannot honour this mask: it forbids pairs of real positions, but the sampled rows of "
        "W_e|X, W_r|X span every real position (a mask acts only through its padding; no causal form)",
      ),
    ]
