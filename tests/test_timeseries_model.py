"""Tests of the UEA time-series classifier (primal_jax.models.timeseries) against the authors' release.

Random state dicts in the layout of the release's `PrimalformerClassiregressor`
(torch key names and layouts) are converted with
`torch_layout.timeseries_classifier_params`; the Flax model's logits and KSVD
loss are compared with `reference_torch_numpy.timeseries_classifier`, an
independent float64 re-implementation of the release forward and of its
`NoFussCE_KSVD` loss. The remaining tests pin the config rule for n, input
errors, padding with and without attention masking, BatchNorm statistics and
dropout.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_torch_numpy as tref
from flax import linen as nn
from numpy_reference import rel_err

from primal_jax.attention.registry import option_names
from primal_jax.convert import torch_layout
from primal_jax.ksvd import RELEASE_SEQUENCE, collect_terms, ksvd_loss_per_sample, ksvd_objective
from primal_jax.models.config import TransformerConfig, model_layers
from primal_jax.models.timeseries import TimeSeriesClassifier, timeseries_config

# Compares with float64 NumPy or golden numbers at float32 tolerances: full float32 matmuls on every platform.
pytestmark = pytest.mark.matmul_precision("highest")

B, L, C, D, H, FF, CLASSES = 3, 11, 3, 32, 4, 48, 5
PADS = (0, 3, 7)  # padded steps at the end of each sequence
LOGITS_TOL = 1e-5  # float32 model vs float64 reference, max|diff| / max|ref|
KSVD_TOL = 2e-5  # J = quadratic terms - trace loses a little to cancellation
INVARIANT_TOL = 1e-6
NO_DROPOUT = dict(dropout_rate=0.0, attention_dropout_rate=0.0)

# (family, layers, s, rank_multi): n = min(L, s * rank_multi).
PARITY_CASES = {
  "primalformer_n8": ("primalformer", 2, 4, 2),  # n = 8 < L
  "primal_plus_n8": ("primal_plus", 2, 4, 2),
  "primal_plus_n_is_L": ("primal_plus", 2, 4, 3),  # s * rank_multi = 12 > L: n = L = 11
  "primalformer_s_above_n": ("primalformer", 2, 12, 1),  # n = 11 < s = 12: allow_rank_deficient
  "softmax_3_layers": ("softmax", 3, 4, 2),
}


def _config(family="primalformer", num_layers=2, low_rank=4, rank_multi=2, **overrides):
  """Overrides that are Primal options (and not model fields) go to the Primal layers."""
  model_fields = {f.name for f in dataclasses.fields(TransformerConfig)}
  primal = {k: overrides.pop(k) for k in list(overrides) if k in option_names("primal") and k not in model_fields}
  return timeseries_config(
    family,
    seq_len=L,
    num_classes=CLASSES,
    num_layers=num_layers,
    dim=D,
    hidden_dim=FF,
    num_heads=H,
    attention={"primal": dict(low_rank=low_rank, rank_multi=rank_multi, **primal)},
    **overrides,
  )


def _inputs(seed=0):
  """values [B, L, C] with nonzero values at padded steps, mask [B, L] bool padded at the end."""
  rng = np.random.default_rng(seed)
  values = rng.standard_normal((B, L, C)).astype(np.float32)
  mask = np.arange(L)[None, :] < (L - np.asarray(PADS))[:, None]
  assert np.all(values[~mask] != 0) and not mask.all()
  return values, mask


def _torch_state_dict(seed, layers, low_rank, rank_multi):
  """A release `PrimalformerClassiregressor.state_dict()` (float32 numpy) with every parameter non-trivial.

  Linear weights ~ N(0, 1/fan_in); LayerNorm weights 1 + N(0, 0.2^2) and biases
  N(0, 0.2^2), so a swapped or dropped norm shows; the positional encoding
  N(0, 0.5^2) (larger than the release's U(-0.02, 0.02) init, so that it matters);
  We, Wr ~ N(0, 1); Lambda ~ U[0, 1).
  """
  rng = np.random.default_rng(seed)
  n, p = min(L, low_rank * rank_multi), D // H
  sd = {}

  def linear(name, out_dim, in_dim, kernel_size=None):
    w = rng.standard_normal((out_dim, in_dim)) / np.sqrt(in_dim)
    sd[name + ".weight"] = w if kernel_size is None else w[:, :, None]  # Conv1d weight [out, in, 1]
    sd[name + ".bias"] = 0.1 * rng.standard_normal(out_dim)

  def norm(name):
    sd[name + ".weight"] = 1.0 + 0.2 * rng.standard_normal(D)
    sd[name + ".bias"] = 0.2 * rng.standard_normal(D)

  linear("project_inp", D, C)
  sd["pos_enc.pe"] = 0.5 * rng.standard_normal((L, 1, D))
  for i, kind in enumerate(layers):
    prefix = f"encoder.attn_layers.{i}."
    for name in ("query_projection", "key_projection", "out_projection"):
      linear(prefix + "attention." + name, D, D)
    if kind == "primal":
      sd[prefix + "attention.We"] = rng.standard_normal((H, n, low_rank))
      sd[prefix + "attention.Wr"] = rng.standard_normal((H, n, low_rank))
      sd[prefix + "attention.inner_attention.Lambda"] = rng.uniform(0.0, 1.0, (H, low_rank))
      linear(prefix + "attention.inner_attention.concate_weight", p, 2 * low_rank)
    else:
      linear(prefix + "attention.value_projection", D, D)
    linear(prefix + "conv1", FF, D, kernel_size=1)
    linear(prefix + "conv2", D, FF, kernel_size=1)
    norm(prefix + "norm1")
    norm(prefix + "norm2")
  norm("encoder.norm")
  linear("output_layer", CLASSES, L * D)
  return {k: np.asarray(v, np.float32) for k, v in sd.items()}


def _variables(model, values, mask, seed=0):
  """Variables for `model` from a random release state dict (no initialiser compiles: keeps the file fast).

  BatchNorm statistics, when the model has them, start as Flax's (mean 0, var 1).
  """
  config = model.config
  primal = dict(config.attention)["primal"]  # options of the Primal layers (present in every config here)
  sd = _torch_state_dict(seed, config.layer_names, dict(primal)["low_rank"], dict(primal)["rank_multi"])
  params, _ = torch_layout.timeseries_classifier_params(sd, H)
  variables = {"params": params}
  shapes = jax.eval_shape(model.init, jax.random.key(0), values, mask)
  if "batch_stats" in shapes:
    variables["batch_stats"] = jax.tree_util.tree_map_with_path(
      lambda path, leaf: np.full(leaf.shape, float(jax.tree_util.keystr(path).endswith("['var']")), np.float32),
      shapes["batch_stats"],
    )
  return variables


# ============================================================================ parity with the release forward


@pytest.mark.parametrize("case", list(PARITY_CASES))
def test_converted_release_model_matches_float64_reference(case):
  """Logits (mask_attention=False: the release's attention never sees the mask) and per-sample KSVD loss."""
  family, num_layers, low_rank, rank_multi = PARITY_CASES[case]
  layers = model_layers(family, num_layers)
  sd = _torch_state_dict(sum(map(ord, case)), layers, low_rank, rank_multi)
  params, names = torch_layout.timeseries_classifier_params(sd, H)
  assert names == layers
  config = _config(family, num_layers, low_rank, rank_multi)
  model = TimeSeriesClassifier(config, mask_attention=False)
  values, mask = _inputs()

  shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), values, mask))["params"]
  assert jax.tree.structure(params) == jax.tree.structure(shapes)
  for (path, ours), expected in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(shapes), strict=True):
    assert (ours.shape, ours.dtype) == (expected.shape, expected.dtype), jax.tree_util.keystr(path)

  logits, state = jax.jit(lambda p: model.apply({"params": p}, values, mask, mutable=["ksvd"]))(params)
  ref_cfg = dict(num_heads=H, low_rank=low_rank, rank_multi=rank_multi, max_seq_len=L)
  ref = tref.timeseries_classifier(sd, ref_cfg, dict(x_enc=values, padding_masks=mask))
  assert logits.shape == (B, CLASSES)
  err = rel_err(logits, ref["logits"])
  assert err <= LOGITS_TOL, f"{case}: logits rel err {err:.2e}"

  terms = collect_terms(state.get("ksvd", {}))
  primal = [i for i, name in enumerate(layers) if name == "primal"]
  assert len(terms) == len(primal)
  if not primal:
    assert "loss_ksvd" not in ref
    return
  for i, layer_terms in zip(primal, terms, strict=True):
    j_err = rel_err(ksvd_objective(layer_terms, RELEASE_SEQUENCE), ref[f"layer{i}/J"])
    assert j_err <= KSVD_TOL, f"{case}: layer {i} J rel err {j_err:.2e}"
  loss = ksvd_loss_per_sample(state["ksvd"], RELEASE_SEQUENCE)
  assert loss.shape == (B,)
  ksvd_err = rel_err(loss, ref["loss_ksvd"])
  assert ksvd_err <= KSVD_TOL, f"{case}: KSVD loss rel err {ksvd_err:.2e}"


def test_reference_zeroes_padded_steps_only_before_the_head():
  """The release's padding mask enters once, after GELU: an all-real mask changes the logits, not the encoder."""
  layers = model_layers("primal_plus", 2)
  sd = _torch_state_dict(1, layers, 4, 2)
  cfg = dict(num_heads=H, low_rank=4, rank_multi=2, max_seq_len=L)
  values, mask = _inputs()
  padded = tref.timeseries_classifier(sd, cfg, dict(x_enc=values, padding_masks=mask))
  full = tref.timeseries_classifier(sd, cfg, dict(x_enc=values, padding_masks=np.ones_like(mask)))
  np.testing.assert_array_equal(padded["encoder_out"], full["encoder_out"])
  np.testing.assert_array_equal(padded["loss_ksvd"], full["loss_ksvd"])
  np.testing.assert_array_equal(padded["logits"][0], full["logits"][0])  # sequence 0 has no padding
  assert rel_err(padded["logits"][1:], full["logits"][1:]) > 1e-2


# ============================================================================ converter


def test_converter_layout_and_values():
  """Conv1d(kernel 1) -> Dense kernel W[:, :, 0].T; pe [max_len, 1, D] -> [max_len, D]; head [L*D, classes]."""
  sd = _torch_state_dict(2, ("softmax", "primal"), 4, 2)
  params, _ = torch_layout.timeseries_classifier_params(sd, H)
  block = params["encoder"]["block_0"]
  np.testing.assert_array_equal(block["mlp"]["fc_in"]["kernel"], sd["encoder.attn_layers.0.conv1.weight"][:, :, 0].T)
  np.testing.assert_array_equal(block["norm2"]["scale"], sd["encoder.attn_layers.0.norm2.weight"])
  w_v = sd["encoder.attn_layers.0.attention.value_projection.weight"]
  np.testing.assert_array_equal(block["attention"]["value"]["kernel"][:, 2, :], w_v[16:24].T)  # head 2 of p = 8
  np.testing.assert_array_equal(params["positions"][5], sd["pos_enc.pe"][5, 0])
  np.testing.assert_array_equal(params["logits"]["kernel"], sd["output_layer.weight"].T)
  primal = params["encoder"]["block_1"]["attention"]
  np.testing.assert_array_equal(primal["Wr"], sd["encoder.attn_layers.1.attention.Wr"])
  assert set(primal) == {"We", "Wr", "Lambda", "combine", "query", "key", "out"}


def test_converter_errors():
  sd = _torch_state_dict(3, ("primal", "primal"), 4, 2)
  with pytest.raises(ValueError, match="num_heads=2"):
    torch_layout.timeseries_classifier_params(sd, 2)
  missing = "encoder.attn_layers.1.attention.inner_attention.Lambda"
  with pytest.raises(KeyError, match=re.escape(f"'{missing}'")):
    torch_layout.timeseries_classifier_params({k: v for k, v in sd.items() if k != missing}, H)
  with pytest.raises(ValueError, match="not a time-series PrimalformerClassiregressor"):
    torch_layout.timeseries_classifier_params({"project_inp.weight": sd["project_inp.weight"]}, H)
  short_head = dict(sd, **{"output_layer.weight": sd["output_layer.weight"][:, :-D]})
  with pytest.raises(ValueError, match=r"expected max_len \* d_model = 11 \* 32"):
    torch_layout.timeseries_classifier_params(short_head, H)


# ============================================================================ config and input errors


@pytest.mark.parametrize(
  "seq_len, low_rank, rank_multi, n, deficient",
  [
    (11, 4, 2, 8, False),  # s * rank_multi < N
    (11, 4, 3, 11, False),  # s * rank_multi > N: every position sampled
    (11, 11, 1, 11, False),  # s = n is full rank
    (11, 12, 1, 11, True),  # s > n
    (29, 40, 5, 29, True),  # the release's JapaneseVowels run
    (1751, 30, 10, 300, False),  # EthanolConcentration
  ],
)
def test_timeseries_config_num_samples(seq_len, low_rank, rank_multi, n, deficient):
  attention = {"primal": dict(low_rank=low_rank, rank_multi=rank_multi)}
  config = timeseries_config(seq_len=seq_len, num_classes=4, attention=attention)
  primal = config.layers[0].kwargs
  assert (primal["num_samples"], primal["allow_rank_deficient"]) == (n, deficient)
  assert (config.max_len, config.layer_names, config.norm_position, config.mask_final) == (
    seq_len,
    ("primal", "primal"),
    "post",
    False,
  )
  assert timeseries_config("primal_plus", seq_len=seq_len, num_classes=4, num_layers=3).layer_names == (
    "softmax",
    "softmax",
    "primal",
  )


def test_rank_deficient_config_needs_the_flag():
  with pytest.raises(ValueError, match="allow_rank_deficient"):  # refused by the config, before any call
    _config(low_rank=12, rank_multi=1, allow_rank_deficient=False)
  config = _config(low_rank=12, rank_multi=1, allow_rank_deficient=True)
  values, mask = _inputs()
  jax.eval_shape(TimeSeriesClassifier(config).init, jax.random.key(0), values, mask)


@pytest.mark.parametrize(
  "shape, mask_shape, match",
  [
    ((B, L + 1, C), None, r"values length 12 must equal config.max_len=11"),
    ((B, L - 1, C), None, r"values length 10 must equal config.max_len=11"),
    ((B, L), None, r"values must have rank 3"),
    ((B, L, C), (B, L - 1), r"mask must have shape \[batch, length\]=\(3, 11\), got \(3, 10\)"),
  ],
)
def test_input_errors_name_the_argument(shape, mask_shape, match):
  model = TimeSeriesClassifier(_config())
  mask = None if mask_shape is None else jnp.ones(mask_shape, bool)
  with pytest.raises(ValueError, match=match):
    jax.eval_shape(model.init, jax.random.key(0), jnp.zeros(shape), mask)


# ============================================================================ padding


@pytest.mark.parametrize("family", ["primalformer", "primal_plus", "softmax"])
def test_padded_values_matter_only_without_attention_masking(family):
  """mask_attention=True with padding-aware sampling: logits and KSVD loss ignore padded steps.

  The release (mask_attention=False) lets them in through softmax keys and,
  in Primal layers, through the sampled rows (position L-1 is always sampled).
  """
  values, mask = _inputs()
  changed = np.where(mask[..., None], values, values + 5.0 * np.random.default_rng(9).standard_normal(values.shape))
  primal = family != "softmax"

  def run(config, mask_attention):
    model = TimeSeriesClassifier(config, mask_attention=mask_attention)
    variables = _variables(model, values, mask)
    apply = jax.jit(lambda x: model.apply(variables, x, mask, mutable=["ksvd"]))
    (a, state_a), (b, state_b) = apply(values), apply(changed)
    loss = [ksvd_loss_per_sample(s["ksvd"]) if primal else jnp.zeros(B) for s in (state_a, state_b)]
    return rel_err(b, a), rel_err(loss[1], loss[0])

  config = _config(family, sampling="padding_aware", **NO_DROPOUT)
  logits_err, ksvd_err = run(config, mask_attention=True)
  assert logits_err <= INVARIANT_TOL and ksvd_err <= INVARIANT_TOL, (logits_err, ksvd_err)
  logits_err, ksvd_err = run(_config(family, **NO_DROPOUT), mask_attention=False)
  assert logits_err > 1e-3
  assert (ksvd_err > 1e-3) == primal


def test_release_sampling_leaks_padding_even_with_attention_masking():
  """Why padding_aware exists: release sampling takes rows at padded positions into W_e|X."""
  values, mask = _inputs()
  changed = np.where(mask[..., None], values, -values)
  model = TimeSeriesClassifier(_config("primalformer", sampling="release", **NO_DROPOUT), mask_attention=True)
  variables = _variables(model, values, mask)
  apply = jax.jit(lambda x: model.apply(variables, x, mask))
  a, b = apply(values), apply(changed)
  np.testing.assert_array_equal(a[0], b[0])  # sequence 0 has no padding
  assert rel_err(b[1:], a[1:]) > 1e-3


# ============================================================================ BatchNorm and dropout


def _batch_norm_inputs(model, variables, values, mask):
  """A training-mode apply; returns (logits, updated batch_stats, {norm path: its input [B, L, D]})."""

  @jax.jit
  def train(variables):
    seen = {}

    def record(next_fun, args, kwargs, context):
      if isinstance(context.module, nn.BatchNorm) and context.method_name == "__call__":
        seen["/".join(context.module.path)] = args[0]
      return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
      logits, updated = model.apply(variables, values, mask, deterministic=False, mutable=["batch_stats"])
    return logits, updated["batch_stats"], seen

  return train(variables)


def test_batch_norm_updates_running_averages_and_uses_them_when_deterministic():
  config = _config("primal_plus", norm_type="batch", **NO_DROPOUT)
  model = TimeSeriesClassifier(config, mask_attention=False)
  values, mask = _inputs()
  variables = _variables(model, values, mask)
  stats = variables["batch_stats"]
  assert set(stats["encoder"]) == {"block_0", "block_1"}  # the final norm stays a LayerNorm
  assert "final_norm" in variables["params"]["encoder"]
  for block in stats["encoder"].values():
    assert set(block) == {"norm1", "norm2"}
    np.testing.assert_array_equal(block["norm1"]["mean"], np.zeros(D))
    np.testing.assert_array_equal(block["norm1"]["var"], np.ones(D))

  train_logits, new_stats, seen = _batch_norm_inputs(model, variables, values, mask)
  assert len(seen) == 4
  for path, x in seen.items():  # e.g. "encoder/block_0/norm1"
    _, block, norm = path.split("/")
    x = np.asarray(x, np.float64)
    updated = new_stats["encoder"][block][norm]
    # Flax momentum 0.9 = torch momentum 0.1 over (batch, positions), biased batch variance.
    np.testing.assert_allclose(updated["mean"], 0.1 * x.mean((0, 1)), rtol=1e-5, atol=1e-6, err_msg=path)
    np.testing.assert_allclose(updated["var"], 0.9 + 0.1 * x.var((0, 1)), rtol=1e-5, err_msg=path)

  # Deterministic: running averages, so each sequence's logits do not depend on the rest of the batch.
  trained = dict(variables, batch_stats=new_stats)
  evaluate = jax.jit(lambda v, x, m: model.apply(v, x, m))
  eval_logits = evaluate(trained, values, mask)
  alone = evaluate(trained, values[:1], mask[:1])
  assert rel_err(alone, eval_logits[:1]) <= INVARIANT_TOL
  assert rel_err(eval_logits, evaluate(variables, values, mask)) > 1e-3  # the statistics are used
  assert rel_err(eval_logits, train_logits) > 1e-3  # training mode used the batch statistics instead


def test_dropout_changes_outputs_only_when_not_deterministic():
  model = TimeSeriesClassifier(_config("primal_plus"), mask_attention=False)  # dropout 0.1
  values, mask = _inputs()
  variables = _variables(model, values, mask)
  apply = jax.jit(
    lambda key, deterministic: model.apply(variables, values, mask, deterministic, rngs={"dropout": key}),
    static_argnums=1,
  )
  # "rbg" keys: XLA compiles threefry bit generation slowly on CPU (seconds per dropout site).
  key_a, key_b = jax.random.key(1, impl="rbg"), jax.random.key(2, impl="rbg")
  eval_logits = jax.jit(lambda: model.apply(variables, values, mask))()
  np.testing.assert_array_equal(apply(key_a, True), eval_logits)
  np.testing.assert_array_equal(apply(key_b, True), eval_logits)
  train_a = apply(key_a, False)
  np.testing.assert_array_equal(apply(key_a, False), train_a)  # reproducible per key
  assert rel_err(train_a, eval_logits) > 1e-3
  assert rel_err(apply(key_b, False), train_a) > 1e-3
  off = TimeSeriesClassifier(_config("primal_plus", **NO_DROPOUT), mask_attention=False)
  no_dropout = jax.jit(lambda: off.apply(variables, values, mask, False, rngs={"dropout": key_a}))()
  assert rel_err(no_dropout, eval_logits) <= INVARIANT_TOL
