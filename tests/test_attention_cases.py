"""The session fixture `attention_cases` (tests/conftest.py): one layer per mechanism and options, its jitted
functions compiled once and shared by every test that asks for it, and equal to the eager layer.

Tolerance: float32 jitted against eager (XLA may fuse differently), rtol 1e-5 / atol 1e-6 (gradients: atol 1e-6
times the largest gradient)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.matmul_precision("highest")


@pytest.mark.parametrize("name", ["primal"])  # its ksvd collection too; one case: eager references cost
def test_a_case_is_built_once_and_equals_the_eager_layer(name, attention_cases):
  case = attention_cases(name)
  assert attention_cases(name) is case and attention_cases(name, length=6) is not case
  eager, _ = case.module.apply({"params": case.params}, case.x, mask=case.mask, mutable=["ksvd"])
  out = case.apply(case.params, case.x, case.mask)
  np.testing.assert_allclose(out, eager, rtol=1e-5, atol=1e-6)
  assert out.shape == case.x.shape and float(jnp.max(jnp.abs(out))) > 0.1  # a real output, not zeros
  loss, (g_params, g_x) = case.loss_and_grad(case.params, case.x, case.mask)
  real = np.asarray(eager, np.float64)[np.asarray(case.mask)]
  np.testing.assert_allclose(loss, np.sum(real**2), rtol=1e-5)
  assert not np.asarray(case.mask).all()  # a padded row: the loss counts real outputs only

  def eager_loss(params, x):
    full = case.module.apply({"params": params}, x, mask=case.mask, mutable=["ksvd"])[0]
    return jnp.sum(jnp.where(case.mask[..., None], full, 0.0) ** 2)

  want_params, want_x = jax.grad(eager_loss, argnums=(0, 1))(case.params, case.x)
  # atol relative to the largest gradient: some are zero up to round-off (softmax's key bias shifts no weight).
  scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves((want_params, want_x)))
  for got, want in zip(jax.tree.leaves((g_params, g_x)), jax.tree.leaves((want_params, want_x)), strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * scale)
  # Another input of the same shape reuses the compilation: one executable per function.
  other = case.apply(case.params, case.x[::-1], case.mask)
  assert not np.allclose(other, out) and case.apply._cache_size() == 1


def test_options_and_causal_forms_are_separate_cases(attention_cases):
  performer = attention_cases("performer", num_features=4)
  assert performer.module.num_features == 4 and attention_cases("performer").module.num_features == 8
  causal = attention_cases("linear", causal=True, length=5)
  assert causal.module.causal and causal.x.shape == (2, 5, 16) and causal.mask.shape == (2, 5)
  linformer = attention_cases("linformer", length=6)
  assert linformer.module.max_len == 6  # max_len follows the length
