"""KEP-SVGP's objective and test-time prediction (`primal_jax.attention.kep_svgp.loss`) against the golden cases:
`kep_loss` on the layer case's collections gives the authors' loss_total (float32, 1e-6 relative), and
`mc_probabilities(average="logits")` on the ViT case's 10 recorded logits gives its `mc/softmax`."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primal_jax.attention.kep_svgp import NOISE_COLLECTION, KEPSVGPAttention
from primal_jax.attention.kep_svgp.loss import elbo_kl_scale, kep_loss, mc_logits, mc_probabilities

REPO = Path(__file__).resolve().parents[1]
FOLDER = Path(os.environ.get("PRIMAL_JAX_REFERENCE_DIR", REPO.parent / "shared" / "reference")) / "kep_svgp"
needs = pytest.mark.skipif(not (FOLDER / "kep_layer_sum.npz").exists(), reason=f"golden cases not in {FOLDER}")
pytestmark = pytest.mark.matmul_precision("highest")


@needs
@pytest.mark.parametrize("name", ["kep_layer_sum", "kep_layer_concat"])
def test_kep_loss_gives_the_authors_total(name):
  from primal_jax.convert.cases import load_case
  from primal_jax.convert.kep_svgp_case import kep_layer_module, kep_layer_params

  case = load_case(str(FOLDER / f"{name}.npz"))
  cfg = case.meta["config"]
  module = kep_layer_module(cfg, case.params)
  params = kep_layer_params(case.params, "", module.num_heads, module.concat)
  noise = {"eps": jnp.asarray(case.inputs["noise/eps_layer0"][..., 0])}
  out, state = jax.jit(lambda p: module.apply({"params": p, NOISE_COLLECTION: noise}, case.inputs["x"],
                                              mutable=["ksvd", "kl"]))(params)  # fmt: skip
  preds = jnp.mean(out, 1) @ case.inputs["probe"].T
  labels = case.inputs["targets"]
  ce = jnp.mean(jax.nn.logsumexp(preds, -1) - preds[jnp.arange(labels.size), labels])
  loss = kep_loss(ce, state, eta_ksvd=cfg["eta_ksvd"], eta_kl=cfg["eta_kl"])
  for key in ("total", "ce", "ksvd", "kl"):
    np.testing.assert_allclose(loss[key], case.outputs[f"loss_{key}"], rtol=2e-6, err_msg=key)
  scaled = kep_loss(ce, state, eta_ksvd=cfg["eta_ksvd"], eta_kl=cfg["eta_kl"], kl_scale=elbo_kl_scale(50_000))
  np.testing.assert_allclose(scaled["total"], loss["total"] - cfg["eta_kl"] * loss["kl"] * (1 - 1 / 50_000), rtol=1e-5)
  with pytest.raises(ValueError, match="mutable"):
    kep_loss(ce, {"ksvd": state["ksvd"]}, eta_ksvd=1.0, eta_kl=1.0)
  with pytest.raises(ValueError, match="eta"):
    kep_loss(ce, state, eta_ksvd=1.0, eta_kl=-1.0)


@pytest.mark.skipif(not (FOLDER / "kep_vit.npz").exists(), reason="kep_vit case not found")
def test_mc_prediction_averages_logits_as_the_authors():
  with np.load(FOLDER / "kep_vit.npz") as z:
    logits, softmax = z["mc/logits"], z["mc/softmax"]
  np.testing.assert_allclose(mc_probabilities(jnp.asarray(logits)), softmax, rtol=1e-5, atol=1e-7)
  by_probs = np.asarray(mc_probabilities(jnp.asarray(logits), "probs"))
  np.testing.assert_allclose(by_probs.sum(-1), 1.0, rtol=1e-6)
  assert np.abs(by_probs - softmax).max() > 1e-3  # the two averages differ (README sensitivity: 7.7e-2)


def test_mc_logits_draws_independent_keys():
  module = KEPSVGPAttention(num_heads=2, low_rank=2, rank_multi=2)
  x = jnp.asarray(np.random.default_rng(0).standard_normal((1, 4, 8)), jnp.float32)
  variables = module.init(jax.random.key(0), x)
  draws = mc_logits(lambda key: module.apply(variables, x, rngs={"posterior": key}), jax.random.key(1), 3)
  assert draws.shape == (3, 1, 4, 8) and float(jnp.abs(draws[0] - draws[1]).max()) > 1e-4
  with pytest.raises(ValueError, match="num_samples"):
    mc_logits(lambda key: x, jax.random.key(1), 0)
  with pytest.raises(ValueError, match="num_train_examples"):
    elbo_kl_scale(0)
