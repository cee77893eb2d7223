"""The TPU and GPU promise, as far as a CPU can prove it (issue 18.13).

No accelerator is available to this project's CI, so `jax.export` lowers, without the hardware, the jitted
functions a run uses for the `tpu` and `cuda` platforms: `Experiment.train_step` and `.eval_step` (the
ones the train loop calls) and the sharded init of every model family, and `CausalLM`'s decode step, on a
data-parallel mesh (8, 1) and a data x model mesh (4, 2) of 8 fake CPU devices (tests/conftest.py). Lowering
is where a primitive without a rule for a platform, a custom call that is not stable across releases, or a
sharding that does not fit the mesh fails; it names the primitive and the platform, and these tests let that
error through rather than skip. Compiling and running on the chips themselves is not proven here
(BUILD_NOTES.md says what was verified where).

The same multi-platform module also carries a `cpu` lowering; running it here must give what the jitted
function gives, so what was lowered for the accelerators is the step itself, not some other function.
"""

from __future__ import annotations

import re
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from device_utils import devices_for
from flax import linen as nn
from jax import export
from train_utils import tiny_optimizer_config

from primal_jax.models.config import model_layers
from primal_jax.models.lm import decode_step, init_cache
from primal_jax.models.registry import build_model
from primal_jax.training.experiment import Experiment
from primal_jax.training.objectives import get_objective
from primal_jax.training.optimizers import make_optimizer
from primal_jax.training.sharding import batch_sharding, global_batch, make_mesh, replicated
from primal_jax.training.state import abstract_state, init_state, make_init_fn

PLATFORMS = ("cpu", "tpu", "cuda")
MESHES = {"data": (8, 1), "data_x_model": (4, 2)}
BATCH = 8  # divisible by both meshes' data axis
PRIMAL = {"primal": dict(low_rank=3, rank_multi=2)}
# The steps are plain StableHLO; only the init's QR is a kernel of each platform's own: LAPACK on cpu, XLA's
# TPU QR expansion, cuSOLVER on cuda.
QR = {
  "lapack_sgeqrf_ffi", "lapack_sorgqr_ffi", "Qr", "ProductOfElementaryHouseholderReflectors", "cusolver_geqrf_ffi",
  "cusolver_orgqr_ffi",
}  # fmt: skip
# Every family has a softmax layer then a Primal layer (`primal_plus`), so both attentions are lowered.
LAYERS = model_layers("primal_plus", 2)


def _model(name: str, **overrides) -> ml_collections.ConfigDict:
  base = dict(name=name, layers=LAYERS, attention=PRIMAL, dim=16, hidden_dim=32, num_heads=2)
  return ml_collections.ConfigDict({**base, "dropout_rate": 0.1, "attention_dropout_rate": 0.1, **overrides})


def _tokens(rng, shape, vocab=11):
  return rng.integers(1, vocab, shape).astype(np.int32)


def _padding(rng, length):
  return np.arange(length)[None, :] < rng.integers(3, length + 1, (BATCH, 1))


def _classification(inputs, rng, **extra):
  weight = np.ones(BATCH, np.float32)
  weight[-1] = 0.0  # a padding row, as the pipelines append to keep the last batch full
  return {"inputs": inputs, **extra, "label": rng.integers(0, 3, BATCH).astype(np.int32), "weight": weight}


def _lra_batch(rng):
  return _classification(_tokens(rng, (BATCH, 12)), rng, mask=_padding(rng, 12))


def _timeseries_batch(rng):
  mask = _padding(rng, 10)
  return _classification(rng.normal(size=(BATCH, 10, 4)).astype(np.float32) * mask[..., None], rng, mask=mask)


def _lm_batch(rng):
  tokens = _tokens(rng, (BATCH, 13))
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weight": _padding(rng, 12).astype(np.float32)}


def _dt_batch(rng, k=5):
  mask = _padding(rng, k)
  return {
    "states": rng.normal(size=(BATCH, k, 3)).astype(np.float32),
    "actions": rng.uniform(-1, 1, (BATCH, k, 2)).astype(np.float32),
    "returns_to_go": rng.uniform(0, 3, (BATCH, k, 1)).astype(np.float32),
    "timesteps": (rng.integers(0, 30, (BATCH, 1)) + np.arange(k)).astype(np.int32),
    "mask": mask,
    "targets": rng.uniform(-1, 1, (BATCH, k, 2)).astype(np.float32),
    "weight": mask.astype(np.float32),
  }


def _vit_batch(rng):
  return _classification(rng.normal(size=(BATCH, 8, 8, 3)).astype(np.float32), rng)


# family -> (model section, dataset info, batch maker): tiny sizes of the five model families.
FAMILIES = {
  "lra_classifier": (_model("lra"), types.SimpleNamespace(seq_len=12, num_classes=3, vocab_size=11), _lra_batch),
  "uea_timeseries": (_model("timeseries"), types.SimpleNamespace(seq_len=10, num_classes=3), _timeseries_batch),
  "causal_lm": (_model("lm"), types.SimpleNamespace(seq_len=12, num_classes=0, vocab_size=11), _lm_batch),
  "decision_transformer": (
    _model("decision_transformer", embed_dropout_rate=0.1),
    types.SimpleNamespace(state_dim=3, act_dim=2, max_ep_len=40),
    _dt_batch,
  ),
  "vit": (
    _model("vit", patch_size=4, dropout_rate=0.0, attention_dropout_rate=0.0),
    types.SimpleNamespace(name="tiny_images", image_shape=(8, 8, 3), num_classes=3),
    _vit_batch,
  ),
}


def _experiment(family: str, mesh_shape) -> tuple[Experiment, dict]:
  """The `Experiment` the train loop would build for a tiny model of `family` (no input pipeline), and a batch."""
  model_config, info, make_batch = FAMILIES[family]
  config = ml_collections.ConfigDict({"model": model_config, "ksvd": {"eta": 0.5, "spec": "release_sequence"}})
  built = build_model(model_config, info)
  tx, schedule = make_optimizer(tiny_optimizer_config(), 100)
  batch = make_batch(np.random.default_rng(0))
  mesh = make_mesh(mesh_shape, devices_for(8))
  init_fn = make_init_fn(built.module, tx, tuple(batch[k][:1] for k in built.input_keys))
  rng = jax.random.PRNGKey(0)
  abstract, shardings = abstract_state(init_fn, rng, mesh)
  experiment = Experiment(
    config=config, mesh=mesh, pipeline=None, built=built, objective=get_objective(built.task), tx=tx,
    schedule=schedule, total_steps=100, init_fn=init_fn, rng=rng, abstract=abstract, shardings=shardings,
  )  # fmt: skip
  return experiment, batch


def _abstract(tree, sharding):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype, sharding=sharding), tree)


def _specs(tree) -> list:
  """The PartitionSpecs of a tree of shardings or of sharded ShapeDtypeStructs, flattened."""
  return [getattr(x, "sharding", x).spec for x in jax.tree.leaves(tree)]


def _custom_calls(exported: export.Exported) -> set[str]:
  """Targets of the custom calls in a module: its platform-specific kernels (export admits only stable ones)."""
  return set(re.findall(r"custom_call @([\w.$]+)", exported.mlir_module()))


def _check_exported(exported: export.Exported, mesh, in_shardings, out_shardings, custom_calls=frozenset()) -> None:
  """Both accelerators (and cpu) in one module over the mesh's devices, with the shardings the run uses."""
  assert exported.platforms == PLATFORMS
  assert exported.nr_devices == mesh.size == 8
  module = exported.mlir_module()
  axes = ", ".join(f'"{name}"={size}' for name, size in mesh.shape.items())
  assert f"sdy.mesh @mesh = <[{axes}]>" in module
  assert len(exported.mlir_module_serialized) > 10_000  # a whole step, not a stub
  # Arguments the function never reads (the eval step's optimizer state) are dropped from the module.
  kept, expected = exported.module_kept_var_idx, _specs(in_shardings)
  assert [exported.in_shardings_jax(mesh)[i].spec for i in kept] == [expected[i] for i in kept]
  assert [s.spec for s in exported.out_shardings_jax(mesh)] == _specs(out_shardings)
  assert _custom_calls(exported) == custom_calls


def _assert_trees_close(actual, expected) -> None:
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(actual), jax.tree.leaves(expected), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6, err_msg=jax.tree_util.keystr(path))


def _export_steps(family: str, mesh_name: str):
  """(experiment, batch, exported train step, exported eval step), their lowering and shardings checked."""
  experiment, batch = _experiment(family, MESHES[mesh_name])
  mesh, shardings = experiment.mesh, experiment.shardings
  data, scalars = batch_sharding(mesh), replicated(mesh)
  abstract_batch = _abstract(batch, data)

  train = export.export(experiment.train_step(), platforms=PLATFORMS)(experiment.abstract, abstract_batch)
  _, out_scalars = train.out_tree.unflatten(train.out_avals)
  _check_exported(train, mesh, (shardings, abstract_batch), (shardings, _abstract(out_scalars, scalars)))
  assert {"loss", "ksvd_loss", "grad_norm"} <= set(out_scalars)

  evaluate = export.export(experiment.eval_step(), platforms=PLATFORMS)(experiment.abstract, abstract_batch)
  sums = evaluate.out_tree.unflatten(evaluate.out_avals)
  _check_exported(evaluate, mesh, (shardings, abstract_batch), _abstract(sums, scalars))
  return experiment, batch, train, evaluate


@pytest.mark.parametrize("mesh_name", MESHES)
@pytest.mark.parametrize("family", FAMILIES)
def test_train_eval_and_init_lower_for_tpu_and_cuda(family, mesh_name):
  experiment, _, _, _ = _export_steps(family, mesh_name)
  mesh, shardings = experiment.mesh, experiment.shardings

  # The sharded init as `init_state` jits it (Primal layers' torch-style orthogonal init is a QR).
  init = jax.jit(lambda r: nn.unbox(experiment.init_fn(r)), out_shardings=shardings)
  key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated(mesh))
  _check_exported(export.export(init, platforms=PLATFORMS)(key), mesh, key, shardings, QR)

  # The heads of every Primal W_e [H, n, s] are split over "model" (size 2 in the data x model layout).
  we = [
    (leaf, sharding) for (path, leaf), sharding in zip(
      jax.tree_util.tree_leaves_with_path(experiment.abstract.params), jax.tree.leaves(shardings.params), strict=True
    ) if path[-1].key == "We"
  ]  # fmt: skip
  assert we and all(s.shard_shape(x.shape)[0] == x.shape[0] // mesh.shape["model"] for x, s in we)


@pytest.mark.slow
def test_the_exported_cpu_lowering_equals_the_jitted_steps():
  """One family and layout only: each compile of an 8-device step costs seconds on a 2-core CPU."""
  experiment, batch, train, evaluate = _export_steps("uea_timeseries", "data_x_model")
  state = init_state(experiment.init_fn, experiment.rng, experiment.shardings)
  device_batch = global_batch(batch, experiment.mesh)
  sums = evaluate.call(state, device_batch)
  _assert_trees_close(sums, experiment.eval_step()(state, device_batch))
  assert float(sums["count"]) == BATCH - 1  # the padding row counts nowhere

  copy = jax.jit(lambda t: jax.tree.map(jnp.copy, t), out_shardings=experiment.shardings)  # the step donates
  exported_state, exported_scalars = train.call(copy(state), device_batch)
  state, jitted_scalars = experiment.train_step()(state, device_batch)
  _assert_trees_close(exported_scalars, jitted_scalars)
  _assert_trees_close(exported_state.params, state.params)
  assert int(exported_state.step) == 1 and float(exported_scalars["ksvd_loss"]) != 0.0


def _export_decode_step(mesh_name: str):
  """(experiment, jitted decode step, its export, cache shardings): batch over "data", params as in training."""
  experiment, _ = _experiment("causal_lm", MESHES[mesh_name])
  mesh, model = experiment.mesh, experiment.built.module
  data, whole = batch_sharding(mesh), replicated(mesh)
  cache = jax.eval_shape(lambda: init_cache(model, BATCH))
  cache_shardings = jax.tree.map(lambda x: data if x.ndim else whole, cache)  # the position is a scalar
  param_shardings = experiment.shardings.params
  step = jax.jit(
    lambda params, cache, tokens: decode_step(model, params, cache, tokens),
    in_shardings=(param_shardings, cache_shardings, data),
    out_shardings=(data, cache_shardings),
  )
  abstract_cache = jax.tree.map(lambda x, s: x.update(sharding=s), cache, cache_shardings)
  tokens = jax.ShapeDtypeStruct((BATCH, 1), jnp.int32, sharding=data)
  exported = export.export(step, platforms=PLATFORMS)(experiment.abstract.params, abstract_cache, tokens)
  logits, new_cache = exported.out_tree.unflatten(exported.out_avals)
  assert logits.shape == (BATCH, 1, 11)
  assert jax.tree.structure(new_cache) == jax.tree.structure(cache)
  _check_exported(exported, mesh, (param_shardings, cache_shardings, data), (data, cache_shardings))
  return experiment, step, exported, cache_shardings


@pytest.mark.parametrize("mesh_name", MESHES)
def test_causal_lm_decode_step_lowers_for_tpu_and_cuda(mesh_name):
  """One token per step from the Primal running sums and the softmax key/value cache."""
  _export_decode_step(mesh_name)


@pytest.mark.slow
def test_the_exported_decode_step_equals_the_jitted_one():
  """Three decoded tokens through the exported cpu lowering equal the jitted decode step's, cache included."""
  experiment, step, exported, cache_shardings = _export_decode_step("data_x_model")
  model = experiment.built.module
  params = init_state(experiment.init_fn, experiment.rng, experiment.shardings).params
  tokens = jax.device_put(_tokens(np.random.default_rng(1), (BATCH, 3)), batch_sharding(experiment.mesh))
  cache_a = cache_b = jax.device_put(init_cache(model, BATCH), cache_shardings)
  for t in range(3):
    logits_a, cache_a = exported.call(params, cache_a, tokens[:, t : t + 1])
    logits_b, cache_b = step(params, cache_b, tokens[:, t : t + 1])
    _assert_trees_close(logits_a, logits_b)
    assert np.isfinite(np.asarray(logits_a)).all()
  _assert_trees_close(cache_a, cache_b)
  assert int(cache_a["position"]) == 3
