"""Tests of primal_jax.dual and of Lemma 4.2 (SPEC 6): the primal-dual identities of KSVD."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest

from primal_jax.dual import (
  cumulative_explained_variance,
  dual_scores,
  induced_kernel,
  primal_weights_from_dual,
  singular_value_spectrum,
)
from primal_jax.ksvd import PAPER, RELEASE_SEQUENCE, KSVDSpec, ksvd_objective, ksvd_terms
from primal_jax.scores import data_dependent_weights, primal_scores

# Compares with float64 NumPy or golden numbers at float32 tolerances: full float32 matmuls on every platform.
pytestmark = pytest.mark.matmul_precision("highest")

N, P, S, NS = 12, 8, 4, 6  # positions, per-head width, directions, sampled rows


def _normal(seed, shape):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _unit_rows(seed, shape):
  return ref.cosine(_normal(seed, shape)).astype(np.float32)


class DualTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_induced_kernel(self):
    """K = Phi_q Phi_k^T (data-independent) and K_ij = phi_q_i^T F_X^T F_X phi_k_j (Theorem 3.2)."""
    phi_q, phi_k, rows = _unit_rows(0, (2, N, P)), _unit_rows(1, (2, N, P)), _normal(2, (2, NS, P))
    k_plain = self.variant(induced_kernel)(phi_q, phi_k)
    k_data = self.variant(induced_kernel)(phi_q, phi_k, rows)
    chex.assert_shape([k_plain, k_data], (2, N, N))
    q64, k64, f64 = (a.astype(np.float64) for a in (phi_q, phi_k, rows))
    for b in range(2):
      plain = np.array([[q64[b, i] @ k64[b, j] for j in range(N)] for i in range(N)])
      data = np.array([[(f64[b] @ q64[b, i]) @ (f64[b] @ k64[b, j]) for j in range(N)] for i in range(N)])
      ref.assert_rel_close(k_plain[b], plain, 1e-6)
      ref.assert_rel_close(k_data[b], data, 1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_dual_scores(self):
    """E = K H_r and R = K^T H_e (Remark 3.3)."""
    kernel, h_e, h_r = _normal(3, (N, N)), _normal(4, (N, S)), _normal(5, (N, S))
    e, r = self.variant(dual_scores)(kernel, h_e, h_r)
    k64, he64, hr64 = (a.astype(np.float64) for a in (kernel, h_e, h_r))
    e_ref = np.stack([sum(hr64[j] * k64[i, j] for j in range(N)) for i in range(N)])
    r_ref = np.stack([sum(he64[i] * k64[i, j] for i in range(N)) for j in range(N)])
    ref.assert_rel_close(e, e_ref, 1e-5)
    ref.assert_rel_close(r, r_ref, 1e-5)

  def test_primal_weights_from_dual(self):
    """W_e = Phi_k^T H_r, W_r = Phi_q^T H_e; data-dependent: left-multiplied by F_X."""
    phi_q, phi_k, h_e, h_r = _unit_rows(6, (N, P)), _unit_rows(7, (N, P)), _normal(8, (N, S)), _normal(9, (N, S))
    rows = _normal(10, (NS, P))
    we, wr = primal_weights_from_dual(phi_q, phi_k, h_e, h_r)
    chex.assert_shape([we, wr], (P, S))
    q64, k64, he64, hr64, f64 = (a.astype(np.float64) for a in (phi_q, phi_k, h_e, h_r, rows))
    ref.assert_rel_close(we, sum(np.outer(k64[j], hr64[j]) for j in range(N)), 1e-5)
    ref.assert_rel_close(wr, sum(np.outer(q64[i], he64[i]) for i in range(N)), 1e-5)
    we_d, wr_d = primal_weights_from_dual(phi_q, phi_k, h_e, h_r, rows)
    chex.assert_shape([we_d, wr_d], (NS, S))
    ref.assert_rel_close(we_d, f64 @ k64.T @ hr64, 1e-5)
    ref.assert_rel_close(wr_d, f64 @ q64.T @ he64, 1e-5)

  def test_primal_equals_dual_data_independent(self):
    """With W_e = Phi_k^T H_r, W_r = Phi_q^T H_e (any H), primal scores equal K H_r and K^T H_e."""
    phi_q, phi_k, h_e, h_r = _unit_rows(11, (N, P)), _unit_rows(12, (N, P)), _normal(13, (N, S)), _normal(14, (N, S))
    we, wr = primal_weights_from_dual(phi_q, phi_k, h_e, h_r)
    e, r = primal_scores(phi_q, phi_k, we, wr)
    k64 = phi_q.astype(np.float64) @ phi_k.astype(np.float64).T
    ref.assert_rel_close(e, k64 @ h_r.astype(np.float64), 1e-5)
    ref.assert_rel_close(r, k64.T @ h_e.astype(np.float64), 1e-5)
    e_dual, r_dual = dual_scores(induced_kernel(phi_q, phi_k), h_e, h_r)
    ref.assert_rel_close(e, e_dual, 1e-5)
    ref.assert_rel_close(r, r_dual, 1e-5)

  def test_primal_equals_dual_data_dependent(self):
    """W_e = F_X Phi_k^T H_r gives W_{e|X} = F_X^T W_e and scores = induced_kernel(., F_X) @ H_r."""
    phi_q, phi_k, h_e, h_r = _unit_rows(15, (N, P)), _unit_rows(16, (N, P)), _normal(17, (N, S)), _normal(18, (N, S))
    rows = _normal(19, (NS, P))
    we, wr = primal_weights_from_dual(phi_q, phi_k, h_e, h_r, rows)
    we_x, wr_x = data_dependent_weights(rows, we), data_dependent_weights(rows, wr)
    f64 = rows.astype(np.float64)
    ref.assert_rel_close(we_x, f64.T @ np.asarray(we, np.float64), 1e-5)
    e, r = primal_scores(phi_q, phi_k, we_x, wr_x)
    k64 = (phi_q.astype(np.float64) @ f64.T) @ (phi_k.astype(np.float64) @ f64.T).T
    ref.assert_rel_close(e, k64 @ h_r.astype(np.float64), 1e-5)
    ref.assert_rel_close(r, k64.T @ h_e.astype(np.float64), 1e-5)
    kernel = induced_kernel(phi_q, phi_k, rows)
    ref.assert_rel_close(e, kernel @ h_r, 1e-5)

  def test_spectrum(self):
    """Singular values descending; cumulative explained variance = cumsum(sigma^2) / sum(sigma^2)."""
    kernel = _normal(20, (3, N, N))
    sv = singular_value_spectrum(kernel)
    chex.assert_shape(sv, (3, N))
    for b in range(3):
      ref.assert_rel_close(sv[b], np.linalg.svd(kernel[b].astype(np.float64), compute_uv=False), 1e-5)
    assert np.all(np.diff(np.asarray(sv), axis=-1) <= 0)
    sigma = np.array([3.0, 2.0, 1.0, 0.0], np.float32)
    np.testing.assert_allclose(cumulative_explained_variance(sigma), [9 / 14, 13 / 14, 1.0, 1.0], rtol=1e-6)
    cev = np.asarray(cumulative_explained_variance(sv))
    np.testing.assert_allclose(cev[:, -1], 1.0, rtol=1e-6)
    assert np.all(np.diff(cev, axis=-1) >= -1e-7)

  def test_low_rank_kernel_spectrum(self):
    """Data-independent K = Phi_q Phi_k^T has rank <= p: energy saturates by the p-th singular value."""
    kernel = induced_kernel(_unit_rows(21, (N, P)), _unit_rows(22, (N, P)))
    cev = np.asarray(cumulative_explained_variance(singular_value_spectrum(kernel)))
    np.testing.assert_allclose(cev[P - 1 :], 1.0, rtol=1e-5)
    assert cev[P - 2] < 1.0 - 1e-4


# ----------------------------------------------------------------------------- Lemma 4.2


def _stationary_solution(seed, dtype, data_dependent=False):
  """Dual solution of SPEC 6 from a float64 SVD: Phi_q, Phi_k, F_X, H_e, H_r, sigma_s, W_e, W_r."""
  phi_q = ref.cosine(_normal(seed, (N, P)))
  phi_k = ref.cosine(_normal(seed + 1, (N, P)))
  rows = _normal(seed + 2, (NS, P)).astype(np.float64) if data_dependent else None
  kernel = phi_q @ phi_k.T if rows is None else (phi_q @ rows.T) @ (phi_k @ rows.T).T
  u, sigma, vt = np.linalg.svd(kernel)
  assert np.linalg.matrix_rank(kernel) >= S
  h_e, h_r, sigma = u[:, :S], vt[:S].T, sigma[:S]
  we = phi_k.T @ h_r if rows is None else rows @ phi_k.T @ h_r
  wr = phi_q.T @ h_e if rows is None else rows @ phi_q.T @ h_e
  cast = lambda a: None if a is None else jnp.asarray(a, dtype)
  return dict(
    phi_q=cast(phi_q), phi_k=cast(phi_k), rows=cast(rows), h_e=h_e, h_r=h_r, sigma=sigma, we=cast(we), wr=cast(wr)
  )


def _objective(sol, lam, spec):
  """J of one sequence and head computed by the library (scores, terms, objective)."""
  rows = sol["rows"]
  we_x = sol["we"] if rows is None else data_dependent_weights(rows, sol["we"])
  wr_x = sol["wr"] if rows is None else data_dependent_weights(rows, sol["wr"])
  e, r = primal_scores(sol["phi_q"], sol["phi_k"], we_x, wr_x)
  b = lambda a: a[None, None]  # one sequence, one head
  lam = jnp.asarray(lam, e.dtype)[None]
  terms = ksvd_terms(b(e), b(r), lam, sol["we"][None], sol["wr"][None], b(we_x), b(wr_x))
  return e, r, ksvd_objective(terms, spec)


# Eq. (6) and the proof of Lemma 4.2 put the trace on the raw parameters W_e, W_r ([n, s]); with
# data-dependent weights that is trace="params". Data-independent, both traces coincide (PAPER).
PAPER_RAW_TRACE = KSVDSpec("paper", "params", "per_sample", "sum")


@pytest.mark.parametrize(
  "data_dependent,spec", [(False, PAPER), (True, PAPER_RAW_TRACE)], ids=["data_independent", "data_dependent"]
)
def test_lemma_4_2_kkt_and_zero_objective_float32(data_dependent, spec):
  """At the top-s SVD (Lambda = S^-1): Lambda e_i = h_ei, Lambda r_j = h_rj, E = K H_r, and J = 0 (paper)."""
  sol = _stationary_solution(100, jnp.float32, data_dependent)
  sigma = sol["sigma"]
  e, r, j = _objective(sol, 1.0 / sigma, spec)
  e64, r64 = np.asarray(e, np.float64), np.asarray(r, np.float64)
  ref.assert_rel_close(e64 / sigma, sol["h_e"], 1e-5, "Lambda e_i = h_ei")
  ref.assert_rel_close(r64 / sigma, sol["h_r"], 1e-5, "Lambda r_j = h_rj")
  kernel = induced_kernel(sol["phi_q"], sol["phi_k"], sol["rows"])
  e_dual, r_dual = dual_scores(kernel, jnp.asarray(sol["h_e"], jnp.float32), jnp.asarray(sol["h_r"], jnp.float32))
  ref.assert_rel_close(e, e_dual, 1e-5, "E = K H_r")
  ref.assert_rel_close(r, r_dual, 1e-5, "R = K^T H_e")
  assert abs(float(j[0])) < 1e-5 * sigma.sum()
  # Control: Lambda * 1.1 gives J = 0.1 tr(S_s) (so the zero above is not vacuous).
  _, _, j_off = _objective(sol, 1.1 / sigma, spec)
  np.testing.assert_allclose(float(j_off[0]), 0.1 * sigma.sum(), rtol=1e-5)


def test_lemma_4_2_data_dependent_needs_raw_parameter_trace():
  """Data-dependent: Tr(W_e|X^T W_r|X) = Tr(W_e^T F_X F_X^T W_r) != Tr(W_e^T W_r), so only the raw trace vanishes."""
  sol = _stationary_solution(100, jnp.float32, data_dependent=True)
  _, _, j_data = _objective(sol, 1.0 / sol["sigma"], KSVDSpec("paper", "data", "per_sample", "sum"))
  assert abs(float(j_data[0])) > 0.1 * sol["sigma"].sum()


def test_lemma_4_2_float64():
  """The same zero in float64 to 1e-10 relative to tr(S_s)."""
  with jax.enable_x64(True):
    sol = _stationary_solution(200, jnp.float64)
    _, _, j = _objective(sol, 1.0 / sol["sigma"], PAPER)
    assert j.dtype == jnp.float64
    assert abs(float(j[0])) < 1e-10 * sol["sigma"].sum()
    _, _, j_off = _objective(sol, 1.1 / sol["sigma"], PAPER)
    np.testing.assert_allclose(float(j_off[0]), 0.1 * sol["sigma"].sum(), rtol=1e-10)
  assert jnp.asarray(1.0).dtype == jnp.float32  # x64 restored


def test_lemma_4_2_release_convention():
  """Release convention (Lambda squared, means over N, trace on raw params): zero at lam = sqrt(N / sigma)."""
  sol = _stationary_solution(300, jnp.float32)
  sigma = sol["sigma"]
  _, _, j = _objective(sol, np.sqrt(N / sigma), RELEASE_SEQUENCE)
  assert abs(float(j[0])) < 1e-5 * sigma.sum()
  # The paper's Lambda = 1/sigma is NOT the release's zero.
  _, _, j_paper_lam = _objective(sol, 1.0 / sigma, RELEASE_SEQUENCE)
  assert abs(float(j_paper_lam[0])) > 0.1 * sigma.sum()
  # Trace on the data-dependent weights is the same here (data-independent: W_{.|X} = W).
  _, _, j_data = _objective(sol, np.sqrt(N / sigma), KSVDSpec("release", "data", "per_sample"))
  assert abs(float(j_data[0])) < 1e-5 * sigma.sum()
