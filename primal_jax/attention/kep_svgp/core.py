"""The KEP-SVGP attention core as one pure function of its parameters (what the Flax layer calls).

q, k arrive projected and split into heads ([B, N, H, p], the shell's layout); the data-dependent weights come from
sampled rows of the layer input, as in Primal-Attention (`primal_jax.scores`), and the scores feed the posterior of
`primal_jax.attention.kep_svgp.posterior`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from primal_jax.attention.kep_svgp.posterior import (
  kl_terms,
  lambda_from_log,
  posterior_factors,
  posterior_sample,
)
from primal_jax.feature_maps import cosine_feature_map

# Parameter names of the layer (Flax) and the release's state_dict keys they come from.
PARAM_NAMES = ("We", "Wr", "log_lambda", "m_u", "s_sqrt_low_triangle", "log_ssqrt")


class KEPOutputs(NamedTuple):
  """What one call computes besides the head outputs (everything the golden cases record)."""

  heads_out: jax.Array  # [B, N, H, p]
  escore: jax.Array  # [B, H, N, s]
  rscore: jax.Array  # [B, H, N, s]
  we_x: jax.Array  # [B, H, p, s]
  wr_x: jax.Array  # [B, H, p, s]
  mean: jax.Array  # [B, H, R, s] posterior mean (R = N sum, 2N concat)
  samples: jax.Array  # [B, H, R, s]
  kl: jax.Array  # []
  kl_terms: dict


def kep_scores(q, k, rows, we, wr):
  """escore, rscore [B, H, N, s] and W_e|X, W_r|X [B, H, p, s].

  q, k: [B, N, H, p]; rows: [B, n, H, p] sampled rows of the layer input; we, wr: [H, n, s].
  """
  we_x = jnp.einsum("bnhp,hns->bhps", rows, we)
  wr_x = jnp.einsum("bnhp,hns->bhps", rows, wr)
  escore = jnp.einsum("bnhp,bhps->bhns", cosine_feature_map(q), we_x)
  rscore = jnp.einsum("bnhp,bhps->bhns", cosine_feature_map(k), wr_x)
  return escore, rscore, we_x, wr_x


def kep_core(q, k, rows, params: dict, eps, *, form: str, concat: bool) -> KEPOutputs:
  """One KEP-SVGP attention forward.

  Args:
    q, k: [B, N, H, p]; rows: [B, n, H, p].
    params: `PARAM_NAMES` arrays ([H, n, s] We/Wr, [H, s] log_lambda, [H, s, s] m_u, [H, s, s, s]
      s_sqrt_low_triangle, [H, s, s] log_ssqrt) plus "final_kernel" [s, p], "final_bias" [p] and, when `concat`,
      "row_mix_kernel" [2N, N], "row_mix_bias" [N].
    eps: noise of `posterior.noise_shape(B, H, R, s, form)`, or None for the posterior mean.
    form: "paper" or "release"; concat: z = [e; r] over rows (then mixed back to N rows) instead of e + r.
  """
  escore, rscore, we_x, wr_x = kep_scores(q, k, rows, params["We"], params["Wr"])
  z = jnp.concatenate([escore, rscore], axis=2) if concat else escore + rscore  # [B, H, R, s]
  lam = lambda_from_log(params["log_lambda"])
  factors = posterior_factors(params["s_sqrt_low_triangle"], params["log_ssqrt"], form)
  samples, mean = posterior_sample(z, lam, params["m_u"], factors, eps, form)
  out = samples @ params["final_kernel"] + params["final_bias"]  # [B, H, R, p]
  if concat:
    out = jnp.einsum("bhmc,mn->bhnc", out, params["row_mix_kernel"]) + params["row_mix_bias"][:, None]
  terms = kl_terms(lam, params["log_lambda"], params["m_u"], factors, params["log_ssqrt"])
  kl = terms["trace"] + terms["mean"] + terms["logdet_s"] + terms["logdet_lambda"] + terms["const"]
  return KEPOutputs(jnp.swapaxes(out, 1, 2), escore, rscore, we_x, wr_x, mean, samples, kl, terms)
