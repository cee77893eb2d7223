"""Tests of primal_jax.scores: W_{.|X}, e/r scores and causal running means (SPEC 2-4)."""

import chex
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref

from primal_jax.feature_maps import cosine_feature_map
from primal_jax.scores import causal_running_mean, data_dependent_weights, primal_scores


def _normal(seed, shape):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class ScoresTest(chex.TestCase):
  @chex.variants(with_jit=True, without_jit=True)
  def test_data_dependent_weights(self):
    """W_{e|X} = F_X^T W_e: [n, p] sampled rows and [n, s] parameter give [p, s]."""
    rows, w = _normal(0, (6, 4)), _normal(1, (6, 3))
    out = self.variant(data_dependent_weights)(rows, w)
    chex.assert_shape(out, (4, 3))
    expected = np.array(
      [[sum(float(rows[m, d]) * float(w[m, j]) for m in range(6)) for j in range(3)] for d in range(4)]
    )
    ref.assert_rel_close(out, expected, 1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_primal_scores(self):
    """e_i = W_{e|X}^T phi_q(x_i) and r_i = W_{r|X}^T phi_k(x_i), row by row."""
    phi_q, phi_k = _normal(2, (7, 4)), _normal(3, (7, 4))
    we_x, wr_x = _normal(4, (4, 3)), _normal(5, (4, 3))
    e, r = self.variant(primal_scores)(phi_q, phi_k, we_x, wr_x)
    chex.assert_shape([e, r], (7, 3))
    e_ref = np.stack([we_x.astype(np.float64).T @ phi_q[i].astype(np.float64) for i in range(7)])
    r_ref = np.stack([wr_x.astype(np.float64).T @ phi_k[i].astype(np.float64) for i in range(7)])
    ref.assert_rel_close(e, e_ref, 1e-6)
    ref.assert_rel_close(r, r_ref, 1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_causal_running_mean(self):
    """z_i -> (1 / i) sum_{j <= i} z_j (i 1-based), per leading batch entry."""
    z = _normal(6, (2, 3, 9, 4))
    out = self.variant(causal_running_mean)(z)
    chex.assert_shape(out, z.shape)
    for b in range(2):
      for h in range(3):
        ref.assert_rel_close(out[b, h], ref.running_mean(z[b, h]), 1e-6)
    np.testing.assert_allclose(out[..., 0, :], z[..., 0, :], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_causal_running_mean_valid(self):
    """With a [.., N] mask, padded positions neither contribute nor count; before any real one: 0."""
    z = _normal(7, (2, 8, 3))
    valid = np.array([[1, 0, 1, 1, 0, 0, 1, 1], [0, 0, 1, 0, 1, 1, 1, 0]], np.float32)
    out = np.asarray(self.variant(causal_running_mean)(z, valid))
    for b in range(2):
      ref.assert_rel_close(out[b], ref.running_mean(z[b], valid[b]), 1e-6)
    np.testing.assert_array_equal(out[1, :2], 0.0)
    # Padded content is irrelevant: changing it changes nothing.
    z2 = np.where(valid[..., None] > 0, z, 1e3)
    np.testing.assert_allclose(causal_running_mean(z2, valid), out, rtol=1e-6)

  def test_causal_running_mean_axis(self):
    """The sequence axis can be chosen: axis=0 on [N, B, p] equals the default on [B, N, p]."""
    z = _normal(8, (3, 6, 5))
    a = causal_running_mean(jnp.swapaxes(z, 0, 1), axis=0)
    np.testing.assert_allclose(jnp.swapaxes(a, 0, 1), causal_running_mean(z), rtol=1e-6)

  def test_cosine_of_mean_equals_cosine_of_sum(self):
    """phi(running mean) = phi(running sum): the 1/i scale is invisible to the cosine map (appendix B)."""
    z = _normal(9, (10, 4))
    np.testing.assert_allclose(
      cosine_feature_map(causal_running_mean(z)), cosine_feature_map(jnp.cumsum(z, axis=0)), rtol=1e-5, atol=1e-6
    )
