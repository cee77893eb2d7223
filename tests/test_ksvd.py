"""Tests of primal_jax.ksvd: the KSVD objective in the paper and release conventions (SPEC 5)."""

import dataclasses
import itertools
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest

from primal_jax.ksvd import (
  PAPER,
  RELEASE_LRA,
  RELEASE_SEQUENCE,
  KSVDSpec,
  KSVDTerms,
  collect_terms,
  ksvd_loss,
  ksvd_loss_per_sample,
  ksvd_objective,
  ksvd_regularizer,
  ksvd_terms,
)
from primal_jax.training.steps import make_train_step

REFERENCE_DIR = "/work/shared/reference"
B, H, N, S, P, A = 3, 2, 7, 4, 5, 6


def _layer(seed, valid=False):
  """Random scores/weights of one layer: escore, rscore, lam, we, wr, we_x, wr_x (and a [B, N] mask)."""
  rng = np.random.default_rng(seed)
  f = lambda *shape: rng.standard_normal(shape).astype(np.float32)
  mask = None
  if valid:
    mask = (rng.random((B, N)) < 0.6).astype(np.float32)
    mask[:, 0] = 1.0  # at least one real position per sequence
    mask[0] = 1.0
  lam = rng.uniform(0.2, 1.5, (H, S)).astype(np.float32)
  return dict(
    escore=f(B, H, N, S),
    rscore=f(B, H, N, S),
    lam=lam,
    we=f(H, A, S),
    wr=f(H, A, S),
    we_x=f(B, H, P, S),
    wr_x=f(B, H, P, S),
    valid=mask,
  )


# Jitted entry points: one compile per shape instead of one per eager op (keeps the suite fast on CPU).
_terms = jax.jit(lambda layer: ksvd_terms(**layer))
_objective = jax.jit(ksvd_objective, static_argnums=1)
_loss_per_sample = jax.jit(ksvd_loss_per_sample, static_argnums=1)
_loss = jax.jit(ksvd_loss, static_argnums=1)


CHOICES = (("paper", "release"), ("data", "params"), ("per_sample", "batch"))
ALL_SPECS = [KSVDSpec(c, t, r, "mean") for c, t, r in itertools.product(*CHOICES)]


def _spec_id(spec):
  return f"{spec.convention}-{spec.trace}-{spec.reduction}"


class KSVDTermsTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_fields(self):
    """Each sufficient statistic equals its float64 definition (sums over real positions)."""
    for valid in (False, True):
      layer = _layer(0, valid)
      t = self.variant(ksvd_terms)(**layer)
      chex.assert_shape([t.energy_e, t.energy_r, t.energy_e_sq, t.energy_r_sq, t.trace_data], (B, H))
      chex.assert_shape(t.count, (B,))
      chex.assert_shape(t.trace_params, (H,))
      e, r, lam = (np.asarray(layer[k], np.float64) for k in ("escore", "rscore", "lam"))
      w = np.ones((B, N)) if layer["valid"] is None else layer["valid"].astype(np.float64)
      for b in range(B):
        for h in range(H):
          lam_h = np.diag(lam[h])
          exp_e = sum(w[b, i] * e[b, h, i] @ lam_h @ e[b, h, i] for i in range(N))
          exp_r = sum(w[b, i] * r[b, h, i] @ lam_h @ r[b, h, i] for i in range(N))
          exp_e_sq = sum(w[b, i] * np.sum((e[b, h, i] * lam[h]) ** 2) for i in range(N))
          exp_r_sq = sum(w[b, i] * np.sum((r[b, h, i] * lam[h]) ** 2) for i in range(N))
          tr_data = np.trace(layer["we_x"][b, h].astype(np.float64).T @ layer["wr_x"][b, h].astype(np.float64))
          for got, expected in [
            (t.energy_e[b, h], exp_e),
            (t.energy_r[b, h], exp_r),
            (t.energy_e_sq[b, h], exp_e_sq),
            (t.energy_r_sq[b, h], exp_r_sq),
            (t.trace_data[b, h], tr_data),
          ]:
            np.testing.assert_allclose(float(got), expected, rtol=1e-5)
      np.testing.assert_allclose(t.count, w.sum(-1), rtol=0)
      tr_params = [np.trace(layer["we"][h].astype(np.float64).T @ layer["wr"][h].astype(np.float64)) for h in range(H)]
      np.testing.assert_allclose(t.trace_params, tr_params, rtol=1e-5)

  def test_bfloat16_scores_reduce_in_float32(self):
    """bf16 scores give float32 statistics."""
    layer = _layer(1)
    layer["escore"] = layer["escore"].astype(jnp.bfloat16)
    layer["rscore"] = layer["rscore"].astype(jnp.bfloat16)
    t = ksvd_terms(**layer)
    for leaf in jax.tree_util.tree_leaves(t):
      chex.assert_type(leaf, jnp.float32)

  def test_padded_positions_do_not_enter(self):
    """With a mask, scores at padded positions are irrelevant: terms equal those of the real rows only."""
    layer = _layer(2, valid=True)
    t = _terms(layer)
    noisy = dict(layer)
    pad = (layer["valid"] == 0)[:, None, :, None]
    noisy["escore"] = np.where(pad, 100.0, layer["escore"]).astype(np.float32)
    noisy["rscore"] = np.where(pad, -50.0, layer["rscore"]).astype(np.float32)
    chex.assert_trees_all_close(_terms(noisy), t, rtol=1e-6)
    for b in range(B):
      real = layer["valid"][b] > 0
      one = {k: v for k, v in layer.items() if k != "valid"}
      one.update(escore=layer["escore"][b : b + 1, :, real], rscore=layer["rscore"][b : b + 1, :, real])
      one.update(we_x=layer["we_x"][b : b + 1], wr_x=layer["wr_x"][b : b + 1])
      t_b = _terms(one)
      np.testing.assert_allclose(t_b.energy_e_sq[0], t.energy_e_sq[b], rtol=1e-5)
      np.testing.assert_allclose(t_b.energy_r[0], t.energy_r[b], rtol=1e-5)
      assert float(t_b.count[0]) == real.sum() == float(t.count[b])


@pytest.mark.parametrize("valid", [False, True], ids=["dense", "masked"])
@pytest.mark.parametrize("spec", ALL_SPECS, ids=_spec_id)
def test_objective_matches_reference(spec, valid):
  """ksvd_objective equals the float64 J for every convention x trace x reduction, masked or not."""
  layer = _layer(3, valid)
  got = _objective(_terms(layer), spec)
  expected = ref.layer_j(**layer, convention=spec.convention, trace=spec.trace, reduction=spec.reduction)
  chex.assert_shape(got, (B,) if spec.reduction == "per_sample" else ())
  ref.assert_rel_close(got, expected, 1e-5, _spec_id(spec))


def test_batch_reduction_of_identical_sequences_equals_per_sample():
  """A batch of B copies of one sequence: the "batch" J equals that sequence's J, in both conventions."""
  layer = _layer(4)
  for key in ("escore", "rscore", "we_x", "wr_x"):
    layer[key] = np.repeat(layer[key][:1], B, axis=0)
  t = _terms(layer)
  for convention, trace in itertools.product(("paper", "release"), ("data", "params")):
    per_sample = _objective(t, KSVDSpec(convention, trace, "per_sample"))
    batch = _objective(t, KSVDSpec(convention, trace, "batch"))
    np.testing.assert_allclose(per_sample, per_sample[0], rtol=1e-6)
    np.testing.assert_allclose(batch, per_sample[0], rtol=1e-5, err_msg=f"{convention}/{trace}")


@pytest.mark.parametrize("trace", ["data", "params"])
@pytest.mark.parametrize("valid", [False, True], ids=["dense", "masked"])
def test_release_equals_paper_with_lambda_squared_over_n(trace, valid):
  """Per (sequence, head): release J(lam) == paper J(Lambda = lam^2 / N) with the same trace (SPEC 5)."""
  layer = _layer(5, valid)
  release = _objective(_terms(layer), KSVDSpec("release", trace, "per_sample"))
  count = N if not valid else layer["valid"].sum(-1)  # [B] real positions
  # Lambda_paper depends on N_b: evaluate one sequence at a time.
  for b in range(B):
    one = {k: v[b : b + 1] for k, v in layer.items() if k in ("escore", "rscore", "we_x", "wr_x")}
    one.update(we=layer["we"], wr=layer["wr"])
    one["valid"] = None if not valid else layer["valid"][b : b + 1]
    n_b = count if not valid else count[b]
    one["lam"] = (layer["lam"].astype(np.float64) ** 2 / n_b).astype(np.float32)
    paper = _objective(_terms(one), KSVDSpec("paper", trace, "per_sample"))
    np.testing.assert_allclose(paper[0], release[b], rtol=1e-5)
  # ... and the two conventions really differ at the same lam (the identity is not trivial).
  paper_same_lam = _objective(_terms(layer), KSVDSpec("paper", trace, "per_sample"))
  assert not np.allclose(paper_same_lam, release, rtol=1e-2)


def test_all_padding_sequence_gives_finite_objective():
  """A sequence without real positions: no 0/0; its quadratic terms are 0, so J = -trace (release)."""
  layer = _layer(7, valid=True)
  layer["valid"][1] = 0.0
  t = _terms(layer)
  assert float(t.count[1]) == 0.0
  for spec in ALL_SPECS:
    chex.assert_tree_all_finite(_objective(t, spec))
  j = _objective(t, RELEASE_SEQUENCE)
  np.testing.assert_allclose(j[1], -np.mean(np.asarray(t.trace_params)), rtol=1e-6)
  grads = jax.jit(jax.grad(lambda e: ksvd_loss([ksvd_terms(**{**layer, "escore": e})])))(layer["escore"])
  chex.assert_tree_all_finite(grads)


def test_presets():
  """PAPER, RELEASE_LRA, RELEASE_SEQUENCE are the documented conventions; the default is RELEASE_SEQUENCE."""
  assert dataclasses.astuple(PAPER) == ("paper", "data", "per_sample", "sum")
  assert dataclasses.astuple(RELEASE_LRA) == ("release", "params", "batch", "mean")
  assert dataclasses.astuple(RELEASE_SEQUENCE) == ("release", "params", "per_sample", "mean")
  assert KSVDSpec() == RELEASE_SEQUENCE
  layer = _layer(6)
  np.testing.assert_array_equal(ksvd_objective(_terms(layer)), _objective(_terms(layer), RELEASE_SEQUENCE))


@pytest.mark.parametrize(
  "kwargs,name",
  [
    (dict(convention="torch"), "convention"),
    (dict(trace="raw"), "trace"),
    (dict(reduction="mean"), "reduction"),
    (dict(layer_reduce="max"), "layer_reduce"),
  ],
)
def test_spec_rejects_unknown_names(kwargs, name):
  """KSVDSpec validates each field and names it in the error."""
  with pytest.raises(ValueError, match=name):
    KSVDSpec(**kwargs)


def _loss_reference(layers, spec):
  """[B] or [] float64 loss: J_l^2 summed or averaged over layers."""
  squares = [
    ref.layer_j(**layer, convention=spec.convention, trace=spec.trace, reduction=spec.reduction) ** 2
    for layer in layers
  ]
  return np.sum(squares, 0) if spec.layer_reduce == "sum" else np.mean(squares, 0)


@pytest.mark.parametrize("spec", [PAPER, RELEASE_LRA, RELEASE_SEQUENCE, KSVDSpec("release", "data", "batch", "sum")])
def test_loss_over_layers(spec):
  """ksvd_loss_per_sample = sum_l / mean_l J_l^2; ksvd_loss its batch mean; regularizer eta times that."""
  layers = [_layer(10), _layer(11, valid=True), _layer(12)]
  terms = [_terms(layer) for layer in layers]
  expected = _loss_reference(layers, spec)
  per_sample = _loss_per_sample(terms, spec)
  chex.assert_shape(per_sample, (B,) if spec.reduction == "per_sample" else ())
  ref.assert_rel_close(per_sample, expected, 1e-5)
  ref.assert_rel_close(_loss(terms, spec), np.mean(expected), 1e-5)
  ref.assert_rel_close(ksvd_regularizer(terms, 0.05, spec), 0.05 * np.mean(expected), 1e-5)


def test_collect_terms_from_nested_collection():
  """collect_terms finds sown KSVDTerms in a nested `ksvd` collection, in module-path order."""
  t0, t1, t2 = (_terms(_layer(s)) for s in (20, 21, 22))
  collection = {"block_1": {"attn": {"terms": (t1,)}}, "block_0": {"attn": {"terms": (t0,)}}, "head": {"terms": (t2,)}}
  found = collect_terms(collection)
  assert len(found) == 3 and all(isinstance(t, KSVDTerms) for t in found)
  chex.assert_trees_all_equal(found, [t0, t1, t2])
  np.testing.assert_array_equal(_loss(collection, PAPER), _loss([t0, t1, t2], PAPER))
  np.testing.assert_array_equal(ksvd_loss({"ksvd": collection}), ksvd_loss([t0, t1, t2]))


def test_empty_collection_is_refused_unless_allowed():
  """No terms (a forgotten mutable=["ksvd"]) is an error, not a silently disabled regulariser (issue 18.4).

  Code serving models with and without Primal layers (the train step) says so with allow_empty=True.
  """
  for empty in ({}, [], {"ksvd": {}}):
    with pytest.raises(ValueError, match="mutable"):
      ksvd_loss(empty)
  with pytest.raises(ValueError, match="mutable"):
    ksvd_regularizer({}, 0.1)
  assert float(ksvd_loss({}, allow_empty=True)) == 0.0
  assert float(ksvd_loss_per_sample([], PAPER, allow_empty=True)) == 0.0
  assert float(ksvd_regularizer({}, 0.1, allow_empty=True)) == 0.0


def test_empty_batch_is_refused():
  """A batch of size 0 has no mean: a ValueError instead of NaN (per-sample) or -trace (batch reduction)."""
  layer = _layer(30)
  empty = {k: (v[:0] if k in ("escore", "rscore", "we_x", "wr_x") else v) for k, v in layer.items()}
  terms = _terms(empty)
  for spec in (RELEASE_SEQUENCE, RELEASE_LRA, PAPER):
    with pytest.raises(ValueError, match="batch of size 0"):
      ksvd_loss([terms], spec)


@pytest.mark.parametrize(
  "name,spec", [("paper", PAPER), ("release_lra", RELEASE_LRA), ("release_sequence", RELEASE_SEQUENCE)]
)
def test_spec_by_name(name, spec):
  """Configs name the spec; every entry point takes the name as well as the KSVDSpec."""
  terms = [_terms(_layer(31)), _terms(_layer(32))]
  np.testing.assert_array_equal(ksvd_regularizer(terms, 0.1, name), ksvd_regularizer(terms, 0.1, spec))
  np.testing.assert_array_equal(ksvd_loss_per_sample(terms, name), ksvd_loss_per_sample(terms, spec))
  np.testing.assert_array_equal(ksvd_objective(terms[0], name), ksvd_objective(terms[0], spec))
  with pytest.raises(ValueError, match="release_lra"):
    ksvd_loss(terms, "lra")
  with pytest.raises(ValueError, match="KSVDSpec"):
    ksvd_loss(terms, 3)


@pytest.mark.parametrize("eta", [-0.1, float("nan"), float("inf")])
def test_eta_must_be_finite_and_non_negative(eta):
  terms = [_terms(_layer(33))]
  with pytest.raises(ValueError, match="eta"):
    ksvd_regularizer(terms, eta)
  assert float(ksvd_regularizer(terms, 0.0)) == 0.0
  with pytest.raises(ValueError, match="eta"):  # the train step (config.ksvd.eta) checks it when built
    make_train_step(None, None, None, eta=eta, spec=PAPER)


def test_objective_is_jittable_and_differentiable():
  """J is a smooth function of the scores: jit gives the same value, grads are finite and non-zero."""
  layer = _layer(30)
  fn = lambda e, r, lam: ksvd_loss([ksvd_terms(e, r, lam, *(layer[k] for k in ("we", "wr", "we_x", "wr_x")))])
  value = fn(layer["escore"], layer["rscore"], layer["lam"])
  np.testing.assert_allclose(jax.jit(fn)(layer["escore"], layer["rscore"], layer["lam"]), value, rtol=1e-6)
  grads = jax.grad(fn, argnums=(0, 1, 2))(layer["escore"], layer["rscore"], layer["lam"])
  for g in grads:
    assert np.all(np.isfinite(np.asarray(g))) and np.any(np.asarray(g) != 0)


# ----------------------------------------------------------------------------- golden values (official code)


def _golden(case):
  path = os.path.join(REFERENCE_DIR, f"{case}.npz")
  if not os.path.exists(path):
    pytest.skip(f"{path} not available")
  return np.load(path)


def _golden_terms(escore, rscore, lam, we, wr):
  """KSVDTerms from golden scores and raw parameters (trace on raw params: W_{.|X} unused)."""
  batch, heads, _, s = escore.shape
  dummy = np.zeros((batch, heads, 1, s), np.float32)
  return jax.jit(ksvd_terms)(escore, rscore, lam, we, wr, dummy, dummy)


def test_golden_rl_per_sample():
  """RL Decision Transformer layer: ksvd_per_sample = J[b]^2, loss_ksvd its mean (RELEASE_SEQUENCE)."""
  z = _golden("rl_causal_layer")
  t = _golden_terms(z["escore"], z["rscore"], z["Lambda"], z["We"], z["Wr"])
  ref.assert_rel_close(_loss_per_sample([t], RELEASE_SEQUENCE), z["ksvd_per_sample"], 2e-5)
  ref.assert_rel_close(_loss([t], RELEASE_SEQUENCE), z["loss_ksvd"], 2e-5)
  ref.assert_rel_close(ksvd_regularizer([t], 0.05, RELEASE_SEQUENCE), z["trainer_eta_loss_ksvd"], 2e-5)


def test_golden_nlp_criterion():
  """fairseq criterion: 0.1 * mean_b J[b]^2 (RELEASE_SEQUENCE)."""
  z = _golden("nlp_causal_layer")
  t = _golden_terms(z["escore"], z["rscore"], z["Lambda"], z["We"], z["Wr"])
  ref.assert_rel_close(ksvd_regularizer([t], 0.1, RELEASE_SEQUENCE), z["criterion_ksvd_term"], 2e-5)


def test_golden_time_series_two_layers():
  """Time series: loss_ksvd[b] = (J_0[b]^2 + J_1[b]^2) / 2 (RELEASE_SEQUENCE, mean over layers)."""
  z = _golden("ts_primal_layer")
  terms = []
  for i, prefix in enumerate(("", "layer1.")):
    scores = np.load(os.path.join(REFERENCE_DIR, f"ts_primal_layer_layer{i}.npz"))
    lam = z[prefix + "inner_attention.Lambda"]
    terms.append(_golden_terms(scores["escore"], scores["rscore"], lam, z[prefix + "We"], z[prefix + "Wr"]))
  ref.assert_rel_close(_loss_per_sample(terms, RELEASE_SEQUENCE), z["loss_ksvd"], 1e-5)


@pytest.mark.parametrize("case,layers", [("lra_primalformer", (0, 1)), ("lra_primal_plus_trans", (1,))])
def test_golden_lra_batch(case, layers):
  """LRA: one J per layer from batch means (padded positions included), squared, mean over layers."""
  z = _golden(case)
  terms = []
  for i in layers:
    scores = np.load(os.path.join(REFERENCE_DIR, f"{case}_layer{i}.npz"))
    prefix = f"model.transformer_{i}.mha."
    lam = z[prefix + "attn.Lambda"]
    terms.append(_golden_terms(scores["escore"], scores["rscore"], lam, z[prefix + "We"], z[prefix + "Wr"]))
  ref.assert_rel_close(_loss(terms, RELEASE_LRA), z["loss_ksvd"], 1e-5)
  # The per-sample reduction is a different number here (the reduction matters).
  assert ref.rel_err(_loss(terms, RELEASE_SEQUENCE), z["loss_ksvd"]) > 1e-3
