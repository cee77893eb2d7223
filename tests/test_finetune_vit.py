"""Fine-tuning Primal.+DeiT from a converted DeiT checkpoint (`restore_matching_params`).

The pretrained model is the random timm model of tests/data/timm_vit_small.npz (2 blocks, width 48,
3 heads, 32 x 32 images, patch 8, 5 classes), converted and written as an orbax checkpoint as the
`timm` command does. The new model swaps the last block's attention for the release's CV Primal
attention, and may change the class count (head re-initialised) and the image size (position embedding
resized): as the release's `main_combo.py --finetune`, every leaf of the same path and shape is loaded,
the Primal layer's own parameters keep their (release) initialisation.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from primal_jax.convert.timm import write_params_checkpoint
from primal_jax.convert.vit import model_from_state_dict
from primal_jax.ksvd import RELEASE_LRA, ksvd_loss
from primal_jax.models.vit import VisionTransformer, vit_config
from primal_jax.training.checkpointing.checkpointer import Checkpointer, CheckpointError
from primal_jax.training.checkpointing.warm_start import restore_matching_params

TIMM_CASE = Path(__file__).resolve().parent / "data" / "timm_vit_small.npz"
NEW_PRIMAL = {"query/kernel", "query/bias", "key/kernel", "key/bias", "We", "Wr", "Lambda", "combine/kernel"}
NEW_PRIMAL |= {"combine/bias"}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  """(converted DeiT module, its params, checkpoint directory)."""
  z = np.load(TIMM_CASE)
  config = json.loads(str(z["config_json"]))
  sd = {str(k): z[str(k)] for k in z["param_keys"]}
  model, params = model_from_state_dict(sd, config["num_heads"])
  out = write_params_checkpoint(params, tmp_path_factory.mktemp("deit") / "converted")
  return model, params, out


def _primal_plus(image_size=32, num_classes=5):
  config = vit_config(
    "S/8", "primal_plus", num_layers=2, dim=48, num_heads=3, low_rank=4, rank_multi=10, num_classes=num_classes
  )
  return VisionTransformer(config, image_size=image_size, patch_size=8)


def _init(model, image_size, seed=0):
  return nn.unbox(jax.jit(model.init)(jax.random.key(seed), jnp.zeros((1, image_size, image_size, 3)))["params"])


def _zeros(model, image_size):
  """Params of `model` as zeros, shaped by tracing its init (no compile): enough where values do not matter."""
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, image_size, image_size, 3)))["params"]
  return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), nn.unbox(shapes))


def _flat(tree):
  return {
    jax.tree_util.keystr(p, simple=True, separator="/"): np.asarray(v) for p, v in jax.tree.leaves_with_path(tree)
  }


def test_swapped_last_block_loads_the_rest(pretrained):
  deit, deit_params, out = pretrained
  model = _primal_plus()
  init = _init(model, 32)
  params, report = restore_matching_params(
    out, init, adapt=model.adapt_pretrained, keep_init=model.keep_init_on_finetune
  )
  attn = "encoder/block_1/attention/"
  qk = {attn + f"{role}/{leaf}" for role in ("query", "key") for leaf in ("kernel", "bias")}
  assert set(report["new"]) | set(report["kept"]) == {attn + leaf for leaf in NEW_PRIMAL}
  assert set(report["kept"]) == qk  # the release's fused qk is not in a DeiT checkpoint: drawn afresh
  assert set(report["unused"]) == {attn + "value/kernel", attn + "value/bias"}
  assert report["adapted"] == [] and report["reinitialised"] == []
  ours, theirs, fresh = _flat(params), _flat(deit_params), _flat(init)
  for path in report["loaded"]:
    np.testing.assert_array_equal(ours[path], theirs[path], err_msg=path)
  for path in report["new"] + report["kept"]:
    np.testing.assert_array_equal(ours[path], fresh[path], err_msg=path)
  assert attn + "out/kernel" in report["loaded"]  # the release loads the block's proj as well
  # The release's init of the new parameters: PyTorch's default Linear (U(+-1/sqrt(fan_in))), orthogonal We.
  bound = 1 / math.sqrt(48)
  query = ours[attn + "query/kernel"]
  assert np.abs(query).max() <= bound and np.std(query) == pytest.approx(bound / math.sqrt(3), rel=0.1)
  we = ours[attn + "We"].reshape(3, -1)  # torch.nn.init.orthogonal_ on [H, n, s]: orthonormal rows of [H, n*s]
  np.testing.assert_allclose(we @ we.T, np.eye(3), atol=1e-5)
  # The loaded softmax block computes what the DeiT block did: the first block's outputs agree.
  images = jax.random.normal(jax.random.key(1), (2, 32, 32, 3))

  def block0(module, p):
    def run(p):
      _, state = module.apply({"params": p}, images, capture_intermediates=True, mutable=["intermediates"])
      return state["intermediates"]["encoder"]["block_0"]["__call__"][0]

    return jax.jit(run)(p)

  np.testing.assert_allclose(block0(model, params), block0(deit, deit_params), rtol=1e-6, atol=1e-6)
  # Or the pretrained q and k (an option; the release has none).
  reuse = model.clone(primal_qk_on_finetune="pretrained")
  params, report = restore_matching_params(out, init, keep_init=reuse.keep_init_on_finetune)
  assert report["kept"] == [] and qk <= set(report["loaded"])
  np.testing.assert_array_equal(params["encoder"]["block_1"]["attention"]["key"]["bias"], theirs[attn + "key/bias"])


def test_other_classes_and_image_size(pretrained):
  """10 classes at 48 x 48: the head re-initialised, the position embedding resized (class row kept)."""
  _, deit_params, out = pretrained
  model = _primal_plus(image_size=48, num_classes=10)
  init = _zeros(model, 48)
  params, report = restore_matching_params(out, init, adapt=VisionTransformer.adapt_pretrained)
  assert set(report["reinitialised"]) == {"head/kernel", "head/bias"}
  assert report["adapted"] == ["pos_embed"]
  assert params["pos_embed"].shape == (1, 37, 48)
  np.testing.assert_array_equal(params["pos_embed"][0, 0], deit_params["pos_embed"][0, 0])
  np.testing.assert_array_equal(params["head"]["kernel"], init["head"]["kernel"])


@pytest.mark.slow  # compiles the gradient of a 48 x 48 model
def test_fine_tuned_model_trains(pretrained):
  """A gradient step of CE + eta * KSVD (the release's LRA-style J) from the fine-tuning start is finite."""
  _, _, out = pretrained
  model = _primal_plus(image_size=48, num_classes=10)
  params, _ = restore_matching_params(out, _init(model, 48), adapt=model.adapt_pretrained)

  def loss(p, images, labels):
    logits, state = model.apply({"params": p}, images, mutable=["ksvd"])
    ce = jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, labels[:, None], -1)[:, 0])
    return ce + 0.05 * ksvd_loss(state["ksvd"], RELEASE_LRA)

  images = jax.random.normal(jax.random.key(2), (4, 48, 48, 3))
  value, grads = jax.jit(jax.value_and_grad(loss))(params, images, jnp.arange(4))
  assert np.isfinite(value) and np.isfinite(sum(float(jnp.sum(g**2)) for g in jax.tree.leaves(grads)))


def test_mismatches_that_cannot_be_fine_tuned(pretrained):
  """Exact restores refuse the swapped model; a mismatch outside `reinit` and the adapter is an error."""
  _, _, out = pretrained
  model = _primal_plus(num_classes=10)
  init = _zeros(model, 32)
  with pytest.raises(CheckpointError, match="differing leaves"):
    Checkpointer.restore_params(out, init)
  with pytest.raises(CheckpointError, match=r"head/(kernel|bias) has shape"):
    restore_matching_params(out, init, reinit=())
  wider = VisionTransformer(vit_config("S/8", num_layers=2, dim=48, num_heads=3, num_classes=5, mlp_ratio=2), 32, 8)
  with pytest.raises(CheckpointError, match="encoder/block_0/mlp/fc_in/(kernel|bias) has shape"):
    restore_matching_params(out, _zeros(wider, 32))
