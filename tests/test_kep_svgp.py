"""KEP-SVGP attention: the release form against the authors' golden cases (shared/reference/kep_svgp), the paper
form against the float64 NumPy reference of the intended computation (`reference_kep_numpy`), its KL against the
closed form and a Monte Carlo estimate, and the registered layer's contract (noise stream, fixed noise, evaluation
samples, collections, masks, NNX).

Tolerances: the README's for the golden cases (forward 1e-5 of each array's max, loss_trace 1e-6 absolute, gradients
1e-4 of the max, integers exact); float32 vs float64 reference 1e-5 relative; float64 JAX gradients vs central
differences of the float64 reference 1e-6 relative.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_kep_numpy as ref
from flax import linen as nn
from flax import nnx

import primal_jax.nnx as pnnx
from primal_jax.attention import get_attention
from primal_jax.attention.kep_svgp import (
  KEP_KSVD_SPEC,
  KL_COLLECTION,
  NOISE_COLLECTION,
  KEPSVGPAttention,
  kl_from_params,
  kl_loss,
  nnx_kl_loss,
)
from primal_jax.attention.kep_svgp.posterior import posterior_factors, posterior_sample
from primal_jax.ksvd import collect_terms, ksvd_loss

pytestmark = pytest.mark.matmul_precision("highest")

REPO = Path(__file__).resolve().parents[1]
FOLDER = Path(os.environ.get("PRIMAL_JAX_REFERENCE_DIR", REPO.parent / "shared" / "reference")) / "kep_svgp"
LAYER_CASES = sorted(p.stem for p in FOLDER.glob("kep_layer*.npz")) if FOLDER.exists() else []
B, N, D, H, S, MULTI = 2, 7, 8, 2, 3, 2  # n = 6 < N: rows are sampled


def _layer(**kw):
  return KEPSVGPAttention(num_heads=H, low_rank=S, rank_multi=MULTI, use_bias=False, **kw)


def _x(seed=0, length=N):
  return jnp.asarray(np.random.default_rng(seed).standard_normal((B, length, D)), jnp.float32)


def _params(module, x, seed=0):
  """Initialised params with the output projection set to the identity (the release has none)."""
  init = jax.jit(module.init)  # one compilation, not one per eager op (slow on a loaded CI machine)
  params = nn.unbox(init({"params": jax.random.key(seed), "posterior": jax.random.key(1)}, x)["params"])
  params["out"]["kernel"] = jnp.eye(D).reshape(H, D // H, D)
  return params


def _apply(module, variables, x, **kwargs):
  """`module.apply` compiled once (`mutable` a tuple)."""
  kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}
  static = tuple(k for k in kwargs if k not in ("mask", "rngs"))
  return jax.jit(module.apply, static_argnames=static)(variables, x, **kwargs)


def _kep_params(params):
  return {k: v for k, v in params.items() if k not in ("query", "key", "out")}


# ----- release form: the authors' numbers ---------------------------------------------------------------------


@pytest.mark.skipif(not LAYER_CASES, reason=f"golden cases not found in {FOLDER}")
@pytest.mark.parametrize("name", LAYER_CASES)
def test_release_form_reproduces_every_golden_array(name):
  from primal_jax.convert.cases import load_case
  from primal_jax.convert.kep_svgp_case import run_kep_layer

  case = load_case(str(FOLDER / f"{name}.npz"))
  ours = {k: np.asarray(v) for k, v in run_kep_layer(case).items()}
  assert set(case.outputs) <= set(ours), sorted(set(case.outputs) - set(ours))
  for key, golden in case.outputs.items():
    mine = ours[key]
    assert mine.shape == golden.shape, key
    if np.issubdtype(golden.dtype, np.integer):
      np.testing.assert_array_equal(mine, golden, err_msg=key)
    elif key == "inter/ksvd/loss_trace":
      assert abs(float(mine) - float(golden)) <= 1e-6
    else:
      scale = max(float(np.max(np.abs(golden))), 1e-30)
      tol = 1e-4 if key.startswith("grad/") else 1e-5
      assert float(np.max(np.abs(mine - golden))) <= tol * scale, key


@pytest.mark.skipif(not LAYER_CASES, reason=f"golden cases not found in {FOLDER}")
def test_paper_form_differs_from_the_release_on_the_golden_case():
  """The two forms are not the same computation: same parameters and noise rows, O(1) different outputs."""
  from primal_jax.convert.cases import load_case
  from primal_jax.convert.kep_svgp_case import kep_layer_module, kep_layer_params

  case = load_case(str(FOLDER / "kep_layer_sum.npz"))
  module = kep_layer_module(case.meta["config"], case.params)
  params = kep_layer_params(case.params, "", module.num_heads, module.concat)
  x = jnp.asarray(case.inputs["x"])
  release_eps = jnp.asarray(case.inputs["noise/eps_layer0"][..., 0])
  release = _apply(module, {"params": params, NOISE_COLLECTION: {"eps": release_eps}}, x)
  np.testing.assert_allclose(release, case.outputs["attn_out"], rtol=1e-5, atol=1e-5)
  paper_eps = jnp.broadcast_to(release_eps[..., None, :], (*release_eps.shape[:3], module.low_rank, module.low_rank))
  paper = _apply(module.clone(form="paper"), {"params": params, NOISE_COLLECTION: {"eps": paper_eps}}, x)
  assert float(jnp.max(jnp.abs(paper - release))) > 0.1 * float(jnp.max(jnp.abs(release)))


def test_release_factor_is_rank_deficient_and_its_kl_is_not_the_sampled_gaussians():
  """Quirk 1: output d's release factor has rank s - d, so the KL of the Gaussians it samples is infinite for
  d >= 1, while the release's formula is finite; the paper form's factors are full rank and its KL is exact."""
  module = _layer(form="release")
  params = _kep_params(_params(module, _x()))
  m = np.asarray(posterior_factors(params["s_sqrt_low_triangle"], params["log_ssqrt"], "release"), np.float64)
  assert [np.linalg.matrix_rank(m[0, d]) for d in range(S)] == [S - d for d in range(S)]
  sampled = [
    ref.gaussian_kl(np.asarray(params["m_u"][0, :, d], np.float64), m[0, d] @ m[0, d].T, np.ones(S)) for d in range(S)
  ]
  assert np.isfinite(sampled[0]) and all(np.isinf(v) for v in sampled[1:])
  assert np.isfinite(float(kl_from_params(params, "release")))
  np.testing.assert_allclose(float(kl_from_params(params, "paper")), ref.kl_closed_form(params), rtol=1e-5)


# ----- paper form: float64 reference, KL, Monte Carlo ------------------------------------------------------------


@pytest.mark.parametrize("concat", [False, True])
def test_paper_form_matches_float64_reference(concat):
  x = _x(length=N)
  module = _layer(form="paper", concat=concat, embed_len=N)
  params = _params(module, x)
  rows = 2 * N if concat else N
  eps = np.random.default_rng(5).standard_normal((B, H, rows, S, S)).astype(np.float32)
  out, state = _apply(
    module, {"params": params, NOISE_COLLECTION: {"eps": jnp.asarray(eps)}}, x, mutable=[KL_COLLECTION, "ksvd"]
  )
  wq, wk = (np.asarray(params[n]["kernel"]).reshape(D, D) for n in ("query", "key"))
  want, kl = ref.kep_paper_forward(np.asarray(x), wq, wk, _kep_params(params), eps, concat=concat)
  np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
  np.testing.assert_allclose(float(kl_loss(state[KL_COLLECTION])), kl, rtol=1e-5)
  mean = _apply(module.clone(eval_samples=0), {"params": params}, x, deterministic=True)
  np.testing.assert_allclose(
    mean,
    ref.kep_paper_forward(np.asarray(x), wq, wk, _kep_params(params), None, concat)[0],
    rtol=1e-5,
    atol=1e-5 * np.abs(want).max(),
  )


def test_paper_form_gradients_match_central_differences_of_the_reference():
  with jax.enable_x64(True):
    x = _x().astype(jnp.float64)
    module = _layer(form="paper", param_dtype=jnp.float64, dtype=jnp.float64)
    params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), _params(module, x))
    eps = np.random.default_rng(6).standard_normal((B, H, N, S, S))
    weights = np.random.default_rng(7).standard_normal((B, N, D))

    def loss(params, x):
      out, state = module.apply({"params": params, NOISE_COLLECTION: {"eps": jnp.asarray(eps)}}, x, mutable=["kl"])
      return jnp.sum(out * weights) + 1e-3 * kl_loss(state["kl"])

    def ref_loss(params, x):
      wq, wk = (np.asarray(params[n]["kernel"]).reshape(D, D) for n in ("query", "key"))
      out, kl = ref.kep_paper_forward(np.asarray(x), wq, wk, _kep_params(params), eps)
      return float(np.sum(out * weights) + 1e-3 * kl)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)
    rng = np.random.default_rng(8)
    flat, tree = jax.tree_util.tree_flatten((params, x))
    gflat = jax.tree_util.tree_leaves(grads)
    for i, (leaf, g) in enumerate(zip(flat, gflat, strict=True)):
      if leaf.ndim == 3 and leaf.shape == (H, D // H, D):  # the identity output projection: not in the reference
        continue
      direction = rng.standard_normal(leaf.shape)
      h = 1e-6
      plus = [leaf + h * direction if j == i else v for j, v in enumerate(flat)]
      minus = [leaf - h * direction if j == i else v for j, v in enumerate(flat)]
      fd = ref_loss(*jax.tree_util.tree_unflatten(tree, plus)) - ref_loss(*jax.tree_util.tree_unflatten(tree, minus))
      fd /= 2 * h
      analytic = float(np.sum(np.asarray(g) * direction))
      assert abs(fd - analytic) <= 1e-6 * np.linalg.norm(g) * np.linalg.norm(direction) + 1e-9, (i, fd, analytic)


def test_paper_kl_equals_a_monte_carlo_estimate_of_the_sampled_gaussians():
  """KL(q || p) = E_q[log q(u) - log p(u)], u drawn with the layer's own factors (`posterior_factors`)."""
  params = _kep_params(_params(_layer(form="paper"), _x()))
  factors = np.asarray(posterior_factors(params["s_sqrt_low_triangle"], params["log_ssqrt"], "paper"), np.float64)
  lam4 = np.exp(4 * np.asarray(params["log_lambda"], np.float64))  # prior precision
  rng = np.random.default_rng(9)
  draws, total, var = 100_000, 0.0, 0.0
  for h in range(H):
    for d in range(S):
      m, mean = factors[h, d], np.asarray(params["m_u"][h, :, d], np.float64)
      eps = rng.standard_normal((draws, S))
      u = mean + eps @ m.T
      log_q = -0.5 * np.sum(eps**2, 1) - np.sum(np.log(np.abs(np.diag(m))))
      log_p = -0.5 * np.sum(u**2 * lam4[h], 1) + 0.5 * np.sum(np.log(lam4[h]))
      diff = log_q - log_p  # the 2 pi terms cancel
      total, var = total + diff.mean(), var + diff.var() / draws
  kl = float(kl_from_params(params, "paper"))
  assert abs(total - kl) <= 5 * np.sqrt(var), (total, kl, np.sqrt(var))
  assert np.sqrt(var) < 0.02 * abs(kl)  # the check has power: the error bar is small against the KL


def test_paper_samples_have_the_posterior_marginals_and_are_independent_across_output_dims():
  """f[r, d] ~ N(v.m_d, v^T S_d v) independently over d (paper); the release's shared noise correlates them."""
  rng = np.random.default_rng(10)
  params = _kep_params(_params(_layer(form="paper"), _x()))
  z = jnp.asarray(rng.standard_normal((1, H, 1, S)), jnp.float32)
  lam = jnp.exp(params["log_lambda"])
  draws = 40_000
  for form, shape in (("paper", (draws, 1, H, 1, S, S)), ("release", (draws, 1, H, 1, S))):
    factors = posterior_factors(params["s_sqrt_low_triangle"], params["log_ssqrt"], form)
    eps = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    samples = jax.vmap(lambda e, f=factors, form=form: posterior_sample(z, lam, params["m_u"], f, e, form)[0])(eps)
    f = np.asarray(samples[:, 0, 0, 0], np.float64)  # [draws, s] of head 0
    v = np.asarray(z[0, 0, 0] * lam[0] ** 2, np.float64)
    m = np.asarray(factors[0], np.float64)
    cov = np.cov(f.T)
    want_var = np.array([v @ m[d] @ m[d].T @ v for d in range(S)])
    np.testing.assert_allclose(np.diag(cov), want_var, rtol=0.05)
    corr = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    off = np.abs(corr[~np.eye(S, dtype=bool)]).max()
    if form == "paper":
      assert off < 0.03, corr
    else:
      expected = np.array([[v @ m[a] @ m[b].T @ v for b in range(S)] for a in range(S)])
      assert np.abs(expected / np.sqrt(np.outer(want_var, want_var)))[~np.eye(S, dtype=bool)].max() > 0.1
      np.testing.assert_allclose(cov, expected, atol=0.05 * want_var.max())


# ----- the registered layer -------------------------------------------------------------------------------------


def test_registered_and_noise_is_deterministic_given_the_key():
  assert get_attention("kep_svgp") is KEPSVGPAttention
  x = _x()
  module = _layer()
  params = _params(module, x)
  a = _apply(module, {"params": params}, x, rngs={"posterior": jax.random.key(3)})
  b = _apply(module, {"params": params}, x, rngs={"posterior": jax.random.key(3)})
  c = _apply(module, {"params": params}, x, rngs={"posterior": jax.random.key(4)})
  np.testing.assert_array_equal(a, b)
  assert float(jnp.max(jnp.abs(a - c))) > 1e-3
  with pytest.raises(Exception, match="posterior"):
    module.apply({"params": params}, x)  # no key, no fixed noise: refused, not a silent mean


def test_fixed_noise_evaluation_samples_and_collections():
  x = _x()
  module = _layer(eval_samples=3)
  params = _params(module, x)
  eps = jnp.asarray(np.random.default_rng(2).standard_normal((3, B, H, N, S, S)), jnp.float32)
  out, state = _apply(
    module, {"params": params, NOISE_COLLECTION: {"eps": eps}}, x, deterministic=True, mutable=["ksvd", KL_COLLECTION]
  )
  singles = [_apply(module, {"params": params, NOISE_COLLECTION: {"eps": eps[i]}}, x) for i in range(3)]
  np.testing.assert_allclose(out, sum(singles) / 3, rtol=1e-5, atol=1e-6)
  mean = _apply(module.clone(eval_samples=0), {"params": params}, x, deterministic=True)
  never = _apply(module.clone(sample_posterior=False), {"params": params}, x)
  np.testing.assert_allclose(never, mean, rtol=0, atol=0)
  kl = kl_loss(state[KL_COLLECTION])
  np.testing.assert_allclose(kl, kl_from_params(_kep_params(params), "paper"), rtol=1e-6)
  assert collect_terms(state["ksvd"]) and np.isfinite(float(ksvd_loss(state["ksvd"], KEP_KSVD_SPEC)))
  with pytest.raises(ValueError, match="random_state eps .* must have shape"):
    module.apply({"params": params, NOISE_COLLECTION: {"eps": eps[:2]}}, x, deterministic=True)


@pytest.mark.parametrize(
  "options, message",
  [
    (dict(form="exact"), "form"),
    (dict(eval_samples=-1), "eval_samples"),
    (dict(concat=True), "embed_len"),
    (dict(low_rank=0), "low_rank"),
    (dict(causal=True), "causal"),
  ],
)
def test_bad_options_are_refused(options, message):
  module = KEPSVGPAttention(num_heads=H, **{"low_rank": S, "rank_multi": MULTI, **options})
  with pytest.raises(ValueError, match=message):
    module.init(jax.random.key(0), _x())


def test_padding_never_reaches_a_real_output():
  x = _x()
  mask = np.ones((B, N), bool)
  mask[1, -2:] = False
  module = _layer(sample_posterior=False)
  params = _params(module, x)
  out = _apply(module, {"params": params}, x, mask=jnp.asarray(mask))
  changed = x.at[1, -2:].set(100.0)
  out2 = _apply(module, {"params": params}, changed, mask=jnp.asarray(mask))
  np.testing.assert_allclose(out2[1, :-2], out[1, :-2], rtol=1e-6, atol=1e-6)
  assert float(jnp.max(jnp.abs(out[1, -2:]))) == 0.0
  causal = jnp.tril(jnp.ones((N, N), bool))[None, None]
  with pytest.raises(ValueError, match="cannot honour this mask"):
    module.apply({"params": params}, x, mask=causal)


def test_nnx_layer_draws_from_its_posterior_stream_and_gives_the_linen_kl():
  layer = pnnx.get_attention("kep_svgp")(
    num_heads=H, in_features=D, rngs=nnx.Rngs(0, posterior=1), low_rank=S, rank_multi=MULTI
  )
  x = _x()
  a, b = layer(x), layer(x)
  assert float(jnp.max(jnp.abs(a - b))) > 1e-3 and np.isfinite(np.asarray(a)).all()
  module, _ = pnnx.to_linen(layer)
  _, state = _apply(module, {"params": layer.params_tree()}, x, rngs={"posterior": jax.random.key(0)}, mutable=["kl"])
  np.testing.assert_allclose(nnx_kl_loss(layer), kl_loss(state["kl"]), rtol=1e-6)


def test_one_line_switch_in_a_model_family_with_padding():
  """A model's layer list names "kep_svgp" (no other edit); padded tokens never reach the logits."""
  import ml_collections

  from primal_jax.models.registry import build_model

  model = ml_collections.ConfigDict(
    dict(
      name="lra",
      layers=("softmax", "kep_svgp"),
      attention={"kep_svgp": {"low_rank": 3, "rank_multi": 2}},
      dim=8,
      hidden_dim=16,
      num_heads=2,
      dropout_rate=0.0,
      attention_dropout_rate=0.0,
    )
  )
  built = build_model(model, ml_collections.ConfigDict(dict(seq_len=7, vocab_size=11, num_classes=3)))
  tokens = jnp.asarray([[3, 4, 5, 6, 7, 8, 9], [3, 4, 5, 6, 7, 0, 0]], jnp.int32)
  variables = jax.jit(built.module.init)(
    {"params": jax.random.key(0), "posterior": jax.random.key(1)}, tokens, tokens > 0
  )

  mask = tokens > 0

  @jax.jit
  def run(tokens, key):
    return built.module.apply(variables, tokens, mask, rngs={"posterior": key}, mutable=["kl", "ksvd"])

  logits, state = run(tokens, jax.random.key(2))
  assert np.isfinite(np.asarray(logits)).all() and float(kl_loss(state["kl"])) > 0
  assert np.isfinite(float(ksvd_loss(state["ksvd"], KEP_KSVD_SPEC)))
  other, _ = run(tokens.at[1, 5:].set(10), jax.random.key(2))  # other ids at the padded positions
  np.testing.assert_allclose(other[1], logits[1], rtol=1e-5, atol=1e-6)


def test_bfloat16_forward_and_gradient_are_finite():
  x = _x()
  module = _layer(dtype=jnp.bfloat16)
  params = _params(module, x)

  @jax.jit
  def loss(params):
    out, state = module.apply({"params": params}, x, rngs={"posterior": jax.random.key(0)}, mutable=["kl"])
    return jnp.mean(jnp.square(out.astype(jnp.float32))) + 1e-3 * kl_loss(state["kl"])

  value, grads = jax.value_and_grad(loss)(params)
  assert np.isfinite(float(value)) and all(np.isfinite(np.asarray(g)).all() for g in jax.tree_util.tree_leaves(grads))
