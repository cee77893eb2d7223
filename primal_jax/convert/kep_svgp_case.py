"""KEP-SVGP golden cases (shared/reference/kep_svgp) rebuilt with `KEPSVGPAttention` in its release form.

Every shape and option is read from the case (`<case>.json` config, state_dict shapes), and the posterior noise the
official forward drew (`noise/eps_layer<l>`) is fed through the layer's `random_state` collection. Outputs: the
layer's, the intermediates, the KL terms, the `compute_loss` terms and the gradient of each loss w.r.t. the input
and every parameter, in the release's state_dict names (parameters the release never uses, `proj.*`, get zeros).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from primal_jax.attention.kep_svgp import (
  KEP_KSVD_SPEC,
  KL_COLLECTION,
  NOISE_COLLECTION,
  KEPSVGPAttention,
  kl_from_params,
  kl_loss,
)
from primal_jax.attention.kep_svgp.core import kep_core
from primal_jax.attention.kep_svgp.posterior import factor_tensor, posterior_factors
from primal_jax.feature_maps import cosine_feature_map
from primal_jax.ksvd import collect_terms, ksvd_loss

LOSSES = ("total", "ce", "ksvd", "kl")


def kep_layer_params(state_dict, prefix: str, heads: int, concat: bool) -> dict:
  """Release `KEP_SVGPAttention` state_dict entries under `prefix` -> `KEPSVGPAttention` params.

  The release has no q/k bias and no output projection: `out` is the identity (so `use_bias=False`).
  """
  g = lambda key: jnp.asarray(state_dict[prefix + key], jnp.float32)  # noqa: E731  (traceable: grads flow back)
  qk = g("qk.weight")  # [2D, D]
  width = qk.shape[1]
  p = width // heads
  params = {
    "query": {"kernel": qk[:width].T.reshape(width, heads, p)},
    "key": {"kernel": qk[width:].T.reshape(width, heads, p)},
    "out": {"kernel": jnp.eye(width, dtype=jnp.float32).reshape(heads, p, width)},
    "We": g("we"),
    "Wr": g("wr"),
    "log_lambda": g("log_lambda_sqrt_inv_diag"),
    "m_u": g("m_u")[0],
    "s_sqrt_low_triangle": g("s_sqrt_low_triangle")[0],
    "log_ssqrt": g("log_ssqrt")[0],
    "final_kernel": g("final_weight.weight").T,
    "final_bias": g("final_weight.bias"),
  }
  if concat:
    params["row_mix_kernel"] = g("embed_len_weight.weight").T
    params["row_mix_bias"] = g("embed_len_weight.bias")
  return params


def kep_layer_grads(grads: dict, prefix: str, state_dict) -> dict[str, np.ndarray]:
  """Gradients of `kep_layer_params` back in the release's state_dict names and shapes."""
  q, k = np.asarray(grads["query"]["kernel"]), np.asarray(grads["key"]["kernel"])
  width = q.shape[0]
  out = {
    "qk.weight": np.concatenate([q.reshape(width, width).T, k.reshape(width, width).T], 0),
    "we": grads["We"],
    "wr": grads["Wr"],
    "log_lambda_sqrt_inv_diag": grads["log_lambda"],
    "m_u": grads["m_u"][None],
    "s_sqrt_low_triangle": grads["s_sqrt_low_triangle"][None],
    "log_ssqrt": grads["log_ssqrt"][None],
    "final_weight.weight": np.asarray(grads["final_kernel"]).T,
    "final_weight.bias": grads["final_bias"],
  }
  if "row_mix_kernel" in grads:
    out["embed_len_weight.weight"] = np.asarray(grads["row_mix_kernel"]).T
    out["embed_len_weight.bias"] = grads["row_mix_bias"]
  for key in ("proj.weight", "proj.bias"):  # created by the release, never applied
    if prefix + key in state_dict:
      out[key] = np.zeros_like(state_dict[prefix + key])
  return {prefix + key: np.asarray(value) for key, value in out.items()}


def kep_layer_module(cfg: dict, state_dict, prefix: str = "") -> KEPSVGPAttention:
  """The release-form layer a case's constructor config describes (rows n read from `we`)."""
  n, s = np.shape(state_dict[prefix + "we"])[1:]
  return KEPSVGPAttention(
    num_heads=int(cfg["num_heads"]),
    low_rank=int(s),
    rank_multi=int(cfg["rank_multi"]),
    embed_len=int(cfg["embed_len"]),
    concat=bool(cfg["concate"]),
    form="release",
    use_bias=False,
  )


def _kl(state, params, form):
  """The layer's KL from its `kl` collection; through the NNX layers (`--frontend=nnx`), which carry no `kl`
  collection, from its parameters (the KL depends on them only)."""
  if state.get(KL_COLLECTION):
    return kl_loss(state[KL_COLLECTION])
  return kl_from_params(params, form)


def _cross_entropy(logits, labels):
  return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, labels[:, None], -1)[:, 0])


def run_kep_layer(case) -> dict[str, np.ndarray]:
  """Cases `kep_layer_sum` / `kep_layer_concat`: one layer, a fixed linear probe, `compute_loss`, gradients."""
  cfg = case.meta["config"]
  module = kep_layer_module(cfg, case.params)
  params = kep_layer_params(case.params, "", module.num_heads, module.concat)
  x = jnp.asarray(case.inputs["x"], jnp.float32)
  probe = jnp.asarray(case.inputs["probe"], jnp.float32)
  targets = jnp.asarray(case.inputs["targets"], jnp.int32)
  noise = {"eps": jnp.asarray(case.inputs["noise/eps_layer0"][..., 0], jnp.float32)}
  eta_ksvd, eta_kl = float(cfg["eta_ksvd"]), float(cfg["eta_kl"])

  def losses(params, x):
    variables = {"params": params, NOISE_COLLECTION: noise}
    out, state = module.apply(variables, x, mutable=["ksvd", KL_COLLECTION, "intermediates"])
    preds = jnp.mean(out, axis=1) @ probe.T
    ce = _cross_entropy(preds, targets)
    ksvd = ksvd_loss(state["ksvd"], KEP_KSVD_SPEC)
    kl = _kl(state, params, module.form)
    total = ce + eta_ksvd * ksvd + eta_kl * kl
    return {"total": total, "ce": ce, "ksvd": ksvd, "kl": kl}, (out, preds, state)

  values, (out, preds, state) = losses(params, x)
  terms = collect_terms(state["ksvd"])[0]
  lam = np.exp(np.asarray(params["log_lambda"]))
  escore, rscore = state["intermediates"]["escore"][0], state["intermediates"]["rscore"][0]
  result = {
    "attn_out": out,
    "escore": escore,
    "rscore": rscore,
    "scores/we": params["We"],
    "scores/wr": params["Wr"],
    "lambda_sqrt_inv_diag": np.einsum("hs,st->hst", lam, np.eye(lam.shape[1], dtype=lam.dtype)),
    "kl": values["kl"],
    "preds": preds,
    "inter/sampled_indices": _sampled_indices(module, x.shape[1]),
    "inter/ksvd/loss_trace": jnp.mean(terms.trace_params),
  }
  count = jnp.sum(terms.count)
  result["inter/ksvd/loss_escore"] = 0.5 * jnp.mean(jnp.sum(terms.energy_e_sq, 0) / count)
  result["inter/ksvd/loss_rscore"] = 0.5 * jnp.mean(jnp.sum(terms.energy_r_sq, 0) / count)
  result.update({f"loss_{name}": value for name, value in values.items()})
  result.update(_core_intermediates(module, params, x, noise["eps"]))
  stacked = jax.jit(jax.jacrev(lambda p, x: jnp.stack([losses(p, x)[0][n] for n in LOSSES]), argnums=(0, 1)))
  grad_p, grad_x = stacked(params, x)  # every leaf with a leading axis over LOSSES: one reverse pass
  for i, name in enumerate(LOSSES):
    result[f"grad/{name}/x"] = grad_x[i]
    per_loss = jax.tree_util.tree_map(lambda g, i=i: g[i], grad_p)
    result.update({f"grad/{name}/{k}": v for k, v in kep_layer_grads(per_loss, "", case.params).items()})
  return result


def _core_intermediates(module: KEPSVGPAttention, params: dict, x, eps) -> dict:
  """`inter/*` arrays of the release's steps 3-10 and its KL terms, from the layer's pure core."""
  batch, length, width = x.shape
  heads, n = module.num_heads, module.sampled_rows
  p = width // heads
  q = jnp.einsum("bnd,dhp->bnhp", x, params["query"]["kernel"])
  k = jnp.einsum("bnd,dhp->bnhp", x, params["key"]["kernel"])
  rows = x[:, _sampled_indices(module, length)].reshape(batch, n, heads, p)
  core = kep_core(q, k, rows, params, eps, form=module.form, concat=module.concat)
  lam = jnp.exp(params["log_lambda"])
  z = jnp.concatenate([core.escore, core.rscore], 2) if module.concat else core.escore + core.rscore
  v1 = z * jnp.square(lam)[None, :, None, :]
  factors = posterior_factors(params["s_sqrt_low_triangle"], params["log_ssqrt"], module.form)
  v2 = jnp.einsum("bhri,hdij->bhdrj", v1, factors)
  pre_mix = core.samples @ params["final_kernel"] + params["final_bias"]
  out = {
    "inter/gen_we": core.we_x,
    "inter/gen_wr": core.wr_x,
    "inter/q_feat": jnp.swapaxes(cosine_feature_map(q), 1, 2),
    "inter/k_feat": jnp.swapaxes(cosine_feature_map(k), 1, 2),
    "inter/v1": v1,
    "inter/mean": core.mean,
    "inter/s_sqrt_local": factor_tensor(params["s_sqrt_low_triangle"], params["log_ssqrt"])[None],
    "inter/v2": v2,
    "inter/noise_term": core.samples - core.mean,
    "inter/samples": core.samples,
    "inter/head_out_pre_mix": pre_mix,
  }
  if module.concat:
    out["inter/head_out"] = jnp.swapaxes(core.heads_out, 1, 2)
  out.update({f"inter/kl_terms/{name}": value for name, value in core.kl_terms.items()})
  return out


def _sampled_indices(module: KEPSVGPAttention, length: int) -> np.ndarray:
  from primal_jax.sampling import release_sample_indices

  return release_sample_indices(length, module.sampled_rows).astype(np.int64)


RUNNERS = {"KEP_SVGPAttention": run_kep_layer}


# valid.py's table scaling of each metric (`valid_py/*` outputs).
VALID_PY = {
  "Acc.": ("acc", 100.0),
  "FPR": ("fpr95", 100.0),
  "AUROC": ("auroc", 100.0),
  "AUPR": ("aupr_err", 100.0),
  "AUPR Succ.": ("aupr_success", 100.0),
  "ECE": ("ece", 100.0),
  "Brier": ("brier", 100.0),
  "AURC": ("aurc", 1000.0),
  "EAURC": ("eaurc", 1000.0),
  "NLL": ("nll", 10.0),
}


def run_kep_metrics(case) -> dict[str, np.ndarray]:
  """Case `kep_metrics`: the release's `CIFAR/utils/metrics.py` on fixed predictions (by
  `primal_jax.analysis.uncertainty`). Not computed: `inter/roc_thresholds` (scikit-learn's thresholds, the first
  of them +inf)."""
  from primal_jax.analysis import uncertainty as U

  probs, labels, logits = case.inputs["softmax"], case.inputs["labels"], case.inputs["logits"]
  bins = int(case.meta["config"]["bins"])
  metrics = U.uncertainty_metrics(probs, labels, logits, bins=bins)
  out = {key: np.float64(value) for key, value in metrics.items()}
  out["acc"] = np.float64(100.0 * metrics["acc"])
  for name, (key, scale) in VALID_PY.items():
    out[f"valid_py/{name}"] = np.float64(scale * metrics[key])
  confidence, correct = U.confidence_and_correct(probs, labels)
  out["inter/confidence"], out["inter/correct"] = confidence, correct.astype(np.int64)
  out["inter/risk"] = U.risk_curve(confidence, correct)
  out["inter/roc_fpr"], out["inter/roc_tpr"] = U.roc_curve(confidence, correct)
  out["inter/pr_precision"], out["inter/pr_recall"] = U.precision_recall_curve(correct, confidence)
  rel = U.reliability_bins(confidence, correct, bins)
  out["inter/ece_bin_edges"], out["inter/ece_bin_count"] = rel.edges, rel.count
  # The release leaves an empty bin's accuracy and confidence at 0 (ours: NaN, no samples to average).
  out["inter/ece_bin_acc"], out["inter/ece_bin_conf"] = np.nan_to_num(rel.accuracy), np.nan_to_num(rel.confidence)
  return out
