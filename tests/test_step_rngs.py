"""The train and eval steps feed every stream a layer draws from at each call: dropout and Reformer's
per-call rotations (`rotations="per_call"`, the release's redraw), fresh per training step, fixed at evaluation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from primal_jax.attention import SoftmaxAttention, registered_attention
from primal_jax.attention.baselines import REDRAW_RNG
from primal_jax.ksvd import resolve_spec
from primal_jax.models.registry import build_model
from primal_jax.training.objectives import get_objective
from primal_jax.training.steps import batch_terms

N = 128  # two 64-long chunks: LSH bucketing is used (shorter sequences attend fully)


def _model(attention: str, options: dict):
  model = ml_collections.ConfigDict(
    dict(
      name="lra", layers=(attention,), attention={attention: options},
      dim=8, hidden_dim=16, num_heads=2, dropout_rate=0.0, attention_dropout_rate=0.0,
    )
  )  # fmt: skip
  return build_model(model, ml_collections.ConfigDict(dict(seq_len=N, vocab_size=11, num_classes=3)))


def _terms(built, params, rng, train):
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 11, (2, N)), jnp.int32)
  batch = {"inputs": tokens, "mask": tokens > 0, "label": jnp.array([0, 2]), "weight": jnp.ones(2)}
  batch = {k: batch[k] for k in (*built.input_keys, "label", "weight")}
  terms, _ = batch_terms(
    built, get_objective("classification"), params, {}, batch, rng, spec=resolve_spec("release_sequence"), train=train
  )
  return float(terms["task_loss_sum"])


class NoisyAttention(SoftmaxAttention):
  """Softmax plus noise drawn from the redraw stream at every call: shows which key the step feeds it."""

  def attend(self, q, k, v, **kwargs):
    out = super().attend(q, k, v, **kwargs)
    return out + jax.random.normal(self.make_rng(REDRAW_RNG), out.shape, out.dtype)


def _init(built):
  tokens = jnp.ones((2, N), jnp.int32)
  return built.module.init({"params": jax.random.key(0), REDRAW_RNG: jax.random.key(1)}, tokens, tokens > 0)["params"]


def test_the_redraw_stream_is_fed_from_the_step_key_and_fixed_at_evaluation():
  with registered_attention("noisy", NoisyAttention):
    built = _model("noisy", {})
    params = _init(built)
    train = [_terms(built, params, jax.random.PRNGKey(s), True) for s in (0, 0, 1)]
    assert train[0] == train[1] and train[0] != train[2]  # drawn from the step key: reproducible, new per step
    evals = {_terms(built, params, None, False) for _ in range(2)}
    assert len(evals) == 1  # a fixed key at evaluation


def test_per_call_reformer_trains_and_evaluates_through_the_step():
  built = _model("reformer", {"rotations": "per_call", "num_hashes": 1})
  params = _init(built)
  assert np.isfinite(_terms(built, params, jax.random.PRNGKey(0), True))
  assert np.isfinite(_terms(built, params, None, False))


def test_seeded_reformer_ignores_the_step_key():
  built = _model("reformer", {"rotations": "seeded", "num_hashes": 1})
  params = _init(built)
  assert _terms(built, params, jax.random.PRNGKey(0), True) == _terms(built, params, jax.random.PRNGKey(1), True)
