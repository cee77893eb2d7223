"""Tests of primal_jax.feature_maps against float64 NumPy (SPEC section 1, Remark 4.1)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
from absl.testing import parameterized

from primal_jax.feature_maps import (
  COSINE_EPS,
  cosine_feature_map,
  random_feature_projection,
  softmax_kernel_feature_map,
  softmax_kernel_normalizer,
)


def _normal(seed, shape, scale=1.0):
  return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


class CosineFeatureMapTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_f_normalize(self):
    """phi(z) = z / max(||z||_2, 1e-12) over the last axis."""
    z = _normal(0, (3, 5, 7), scale=3.0)
    out = self.variant(cosine_feature_map)(z)
    chex.assert_shape(out, z.shape)
    chex.assert_type(out, jnp.float32)
    ref.assert_rel_close(out, ref.cosine(z), 1e-6)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(out, np.float64), axis=-1), 1.0, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_zero_vector_maps_to_zero(self):
    """A zero row maps to exactly 0 (never NaN); other rows are unaffected."""
    z = _normal(1, (4, 6))
    z[1] = 0.0
    out = np.asarray(self.variant(cosine_feature_map)(z))
    np.testing.assert_array_equal(out[1], np.zeros(6, np.float32))
    ref.assert_rel_close(out, ref.cosine(z), 1e-6)

  def test_scale_invariance(self):
    """phi(c z) = phi(z) for c > 0 (why running means equal normalised running sums)."""
    z = _normal(2, (5, 8))
    np.testing.assert_allclose(cosine_feature_map(z), cosine_feature_map(37.5 * z), rtol=1e-6, atol=1e-7)

  def test_eps_clamps_small_norms(self):
    """||z|| < eps gives z / eps (the clamp of F.normalize), here with a large eps."""
    z = np.array([[0.3, -0.4], [30.0, 40.0]], np.float32)
    out = np.asarray(cosine_feature_map(z, eps=10.0))
    np.testing.assert_allclose(out, [[0.03, -0.04], [0.6, 0.8]], rtol=1e-6)

  def test_gradient_at_zero_is_finite(self):
    """At z = 0 the Jacobian is I / eps (as torch's F.normalize), finite, never NaN."""
    jac = jax.jit(jax.jacfwd(cosine_feature_map))(jnp.zeros(4, jnp.float32))
    assert np.all(np.isfinite(np.asarray(jac)))
    np.testing.assert_allclose(np.asarray(jac, np.float64), np.eye(4) / COSINE_EPS, rtol=1e-5)
    grad = jax.jit(jax.grad(lambda v: jnp.sum(cosine_feature_map(v) ** 2)))(jnp.zeros((3, 4)))
    assert np.all(np.isfinite(np.asarray(grad)))

  def test_gradient_matches_analytic_jacobian(self):
    """d phi / d z = (I - u u^T) / ||z|| with u = z / ||z||."""
    z = _normal(3, (6,))
    jac = np.asarray(jax.jit(jax.jacrev(cosine_feature_map))(z), np.float64)
    z64 = z.astype(np.float64)
    u = z64 / np.linalg.norm(z64)
    ref.assert_rel_close(jac, (np.eye(6) - np.outer(u, u)) / np.linalg.norm(z64), 1e-5)

  def test_bfloat16_keeps_dtype(self):
    """bf16 inputs give bf16 outputs (norms computed in float32)."""
    z = _normal(4, (3, 8)).astype(jnp.bfloat16)
    out = cosine_feature_map(z)
    chex.assert_type(out, jnp.bfloat16)
    np.testing.assert_allclose(np.asarray(out, np.float64), ref.cosine(np.asarray(z, np.float64)), atol=1e-2)


class SoftmaxKernelFeatureMapTest(chex.TestCase):
  def test_projection_is_standard_normal(self):
    """random_feature_projection: [m, d] float32 N(0, 1) draws, deterministic in the key."""
    w = random_feature_projection(jax.random.key(0), 4096, 8)
    chex.assert_shape(w, (4096, 8))
    chex.assert_type(w, jnp.float32)
    w64 = np.asarray(w, np.float64)
    assert abs(w64.mean()) < 0.02 and abs(w64.std() - 1.0) < 0.02
    np.testing.assert_array_equal(w, random_feature_projection(jax.random.key(0), 4096, 8))
    assert not np.allclose(w, random_feature_projection(jax.random.key(1), 4096, 8))

  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_formula(self):
    """g(z) = exp(w_i^T z - ||z||^2 / 2) / sqrt(m) (exact float64 formula)."""
    z = _normal(5, (2, 5, 4), scale=0.7)
    w = _normal(6, (9, 4))
    out = self.variant(softmax_kernel_feature_map)(z, w)
    chex.assert_shape(out, (2, 5, 9))
    chex.assert_type(out, jnp.float32)
    ref.assert_rel_close(out, ref.softmax_features(z, w), 1e-5)
    assert np.all(np.asarray(out) > 0)

  def test_monte_carlo_unbiased_softmax_kernel(self):
    """E[g(x)^T g(y)] = exp(x^T y): Monte Carlo with m = 2^17 features, 3% tolerance (> 5 sigma)."""
    x = _normal(7, (4, 4), scale=0.25)
    y = _normal(8, (4, 4), scale=0.25)
    w = random_feature_projection(jax.random.key(42), 2**17, 4)
    estimate = np.asarray(softmax_kernel_feature_map(x, w) @ softmax_kernel_feature_map(y, w).T, np.float64)
    exact = np.exp(x.astype(np.float64) @ y.astype(np.float64).T)
    np.testing.assert_allclose(estimate, exact, rtol=0.03)
    # The estimate is not trivially exp(0) = 1: the kernel varies across pairs.
    assert exact.max() - exact.min() > 0.1

  @parameterized.parameters(False, True)
  def test_normalizer(self, causal):
    """D_ii = phi_q(x_i)^T sum_j phi_k(x_j), j <= i when causal, padded keys left out."""
    phi_q = np.abs(_normal(9, (7, 5))) + 0.1
    phi_k = np.abs(_normal(10, (7, 5))) + 0.1
    valid = np.array([1, 1, 0, 1, 0, 1, 1], np.float32)
    d = softmax_kernel_normalizer(phi_q, phi_k, causal=causal)
    chex.assert_shape(d, (7,))
    ref.assert_rel_close(d, ref.softmax_normalizer(phi_q, phi_k, causal=causal), 1e-6)
    d_valid = softmax_kernel_normalizer(phi_q, phi_k, valid, causal=causal)
    ref.assert_rel_close(d_valid, ref.softmax_normalizer(phi_q, phi_k, valid, causal=causal), 1e-6)
    assert not np.allclose(d, d_valid)

  def test_normalizer_without_keys_is_one(self):
    """No real key in the sum (leading padding, causal): D = 1, so D^-1/2 and its gradient stay finite."""
    phi = np.abs(_normal(11, (5, 3))) + 0.1
    valid = np.array([0, 0, 1, 1, 0], np.float32)
    d = np.asarray(softmax_kernel_normalizer(phi, phi, valid, causal=True))
    np.testing.assert_array_equal(d[:2], 1.0)
    ref.assert_rel_close(d[2:], ref.softmax_normalizer(phi, phi, valid, causal=True)[2:], 1e-6)
    np.testing.assert_array_equal(softmax_kernel_normalizer(jnp.zeros((3, 4)), jnp.zeros((3, 4))), 1.0)
    grad = jax.jit(jax.grad(lambda q: jnp.sum(jax.lax.rsqrt(softmax_kernel_normalizer(q, phi, valid, True)))))(phi)
    assert np.all(np.isfinite(np.asarray(grad)))
    np.testing.assert_array_equal(np.asarray(grad)[:2], 0.0)
