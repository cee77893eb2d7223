"""timm ViT / DeiT checkpoints -> `VisionTransformer`, and the `timm` convert command.

Parity with timm on the committed tests/data/timm_vit_small.npz (a random timm 0.4.12 model's
state_dict, images and logits, written by tools/timm_vit.py; torch is not needed here), against a live
timm model where torch and timm import, and the command end to end on a torch-free .npz state_dict
whose checkpoint `restore_params` (what `config.init_from` calls) reads back.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference_vit_numpy as vref
from flax import linen as nn

from primal_jax.convert import cli
from primal_jax.convert import timm as convert_timm
from primal_jax.convert.vit import model_from_state_dict, nchw_to_nhwc
from primal_jax.training.checkpointing.checkpointer import Checkpointer

# Compares with float64 NumPy or golden numbers at float32 tolerances: full float32 matmuls on every platform.
pytestmark = pytest.mark.matmul_precision("highest")

TIMM_CASE = Path(__file__).resolve().parent / "data" / "timm_vit_small.npz"
TOOLS = Path(__file__).resolve().parents[1] / "tools"
TOL = 1e-5


def _rel(ours, golden) -> float:
  return float(np.max(np.abs(np.asarray(ours, np.float64) - golden)) / np.max(np.abs(golden)))


def _logits(state_dict, num_heads, images_nchw):
  model, params = model_from_state_dict(state_dict, num_heads)
  return np.asarray(jax.jit(model.apply)({"params": params}, jnp.asarray(nchw_to_nhwc(images_nchw))))


@pytest.fixture(scope="module")
def timm_case():
  z = np.load(TIMM_CASE)
  sd = {str(k): z[str(k)] for k in z["param_keys"]}
  return sd, z["images"], z["logits"], json.loads(str(z["config_json"]))


def test_committed_timm_case_parity(timm_case):
  """Our logits vs timm's on its own random model: max rel err < 1e-5."""
  sd, images, logits, config = timm_case
  assert config["timm"] == "0.4.12" and logits.shape == (3, config["num_classes"])
  assert _rel(_logits(sd, config["num_heads"], images), logits) <= TOL


def test_numpy_reference_reproduces_timm(timm_case):
  """The float64 reference used for the release's CV cases agrees with timm too (validates it on softmax blocks)."""
  sd, images, logits, config = timm_case
  ref, _, _ = vref.forward(sd, {"num_heads": config["num_heads"]}, images)
  assert _rel(ref, logits) <= TOL


def test_live_timm_parity():
  """A fresh timm model of another shape (depth 3, 4 heads, 24 x 24 images, patch 6, no class count of the file)."""
  pytest.importorskip("torch")
  pytest.importorskip("torchvision")
  sys.path.insert(0, str(TOOLS))
  try:
    import timm_vit
  finally:
    sys.path.remove(str(TOOLS))
  try:
    model, config = timm_vit.build_model(seed=3, img_size=24, patch_size=6, embed_dim=32, depth=3, num_heads=4)
  except ImportError as err:
    pytest.skip(f"timm is not importable here: {err}")
  images = np.random.default_rng(3).standard_normal((2, 3, 24, 24)).astype(np.float32)
  logits = timm_vit.run_model(model, images)
  assert _rel(_logits(timm_vit.state_dict_arrays(model), 4, images), logits) <= TOL


def test_decode_model_name():
  assert convert_timm.decode_model_name("deit_small_patch16_224") == dict(
    variant="S/16", dim=384, num_heads=6, patch_size=16, image_size=224
  )
  assert convert_timm.decode_model_name("vit_base_patch32_384.augreg_in21k_ft_in1k")["variant"] == "B/32"
  for bad in ("deit_small_distilled_patch16_224", "vit_large_patch16_224", "resnet50"):
    with pytest.raises(ValueError, match="--model must be a timm name"):
      convert_timm.decode_model_name(bad)


def _tiny_state_dict(depth=12, num_primal=0):
  """deit_tiny's sizes (12 blocks of width 192, 3 heads) on 32 x 32 images with patch 16 (5 tokens); the last
  `num_primal` blocks the release's Primal blocks (s = 2, n = 4)."""
  sd = vref.random_state_dict(
    np.random.default_rng(5), dim=192, depth=depth, heads=3, patch=16, channels=3, tokens=5, classes=4, s=2,
    rank_multi=2, num_primal=num_primal,
  )  # fmt: skip
  return sd


def test_timm_command_writes_a_checkpoint_restore_params_reads(tmp_path, capsys):
  sd = _tiny_state_dict()
  np.savez(tmp_path / "deit.npz", **sd)
  out = tmp_path / "converted"
  assert cli.main(["timm", str(tmp_path / "deit.npz"), str(out), "--model=deit_tiny_patch16_32"]) == 0
  assert "wrote" in capsys.readouterr().out
  described = json.loads((out / convert_timm.MODEL_FILE).read_text())
  assert described["variant"] == "Ti/16" and described["layers"] == ["softmax"] * 12 and described["num_classes"] == 4
  model, params = model_from_state_dict(sd, 3)
  target = jax.tree.map(jnp.zeros_like, params)
  restored = Checkpointer.restore_params(out, target)
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(restored)[0], jax.tree.leaves(params), strict=True):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
  # The checkpoint's tree is the module's own: init and the converted params have the same structure.
  init = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))["params"])
  assert jax.tree.structure(init) == jax.tree.structure(restored)


def test_timm_command_errors(tmp_path, capsys):
  sd = _tiny_state_dict()
  np.savez(tmp_path / "deit.npz", **sd)
  cases = [
    (["timm", str(tmp_path / "deit.npz"), str(tmp_path / "a"), "--model=deit_small_patch16_224"], "dim 384"),
    (["timm", str(tmp_path / "missing.pth"), str(tmp_path / "b"), "--model=deit_tiny_patch16_224"], "not a file"),
  ]
  (tmp_path / "c").mkdir()
  (tmp_path / "c" / "x").write_text("taken")
  cases.append((["timm", str(tmp_path / "deit.npz"), str(tmp_path / "c"), "--model=deit_tiny_patch16_32"], "not empty"))
  np.savez(tmp_path / "shallow.npz", **_tiny_state_dict(depth=2))
  cases.append(
    (["timm", str(tmp_path / "shallow.npz"), str(tmp_path / "d"), "--model=deit_tiny_patch16_32"], "depth 12")
  )
  for argv, message in cases:
    assert cli.main(argv) == 2  # an input that cannot be used
    err = capsys.readouterr().err
    assert "error:" in err and message in err, err
  with pytest.raises(SystemExit):
    cli.main(["timm", "x.pth", "out"])  # --model is required


def test_pth_without_torch_says_what_to_do(tmp_path, capsys):
  """Reading a torch checkpoint needs torch (not a test dependency): one clear line, not a traceback."""
  try:
    import torch  # noqa: F401

    pytest.skip("torch is installed here")
  except ImportError:
    pass
  (tmp_path / "deit.pth").write_bytes(b"PK\x03\x04 not read")
  assert cli.main(["timm", str(tmp_path / "deit.pth"), str(tmp_path / "out"), "--model=deit_small_patch16_224"]) == 2
  err = capsys.readouterr().err
  assert "needs torch" in err and ".npz" in err and "Traceback" not in err


def test_headless_checkpoint_converts_for_fine_tuning(tmp_path):
  """A state_dict without a head (timm num_classes=0) converts; fine-tuning initialises the head."""
  from primal_jax.convert.vit import vit_params

  sd = {k: v for k, v in _tiny_state_dict(depth=1).items() if not k.startswith("head.")}
  params, _, sizes = vit_params(sd, 3)
  assert "head" not in params and sizes["num_classes"] == 0
  with pytest.raises(ValueError, match="no head"):
    model_from_state_dict(sd, 3)


def test_timm_command_refuses_a_non_square_grid_or_non_finite_weights(tmp_path, capsys):
  """Issue 26.11: both wrote a checkpoint (a model that cannot be built; NaN outputs after fine-tuning)."""
  sd = _tiny_state_dict(depth=12)
  rng = np.random.default_rng(0)
  oblong = dict(sd, pos_embed=rng.normal(size=(1, 7, 192)).astype(np.float32))  # 6 patch rows: not k x k
  nan = dict(sd)
  nan["blocks.3.mlp.fc1.weight"] = sd["blocks.3.mlp.fc1.weight"].copy()
  nan["blocks.3.mlp.fc1.weight"][5, 7] = np.nan
  inf = dict(sd, cls_token=np.full_like(sd["cls_token"], np.inf))
  for name, state_dict, message in (
    ("oblong", oblong, "pos_embed [1, 7, 192] holds 6 patch positions: not a square grid"),
    ("nan", nan, "non-finite values (NaN or inf) in blocks.3.mlp.fc1.weight (1 of 147456)"),
    ("inf", inf, "non-finite values (NaN or inf) in cls_token (192 of 192)"),
  ):
    np.savez(tmp_path / f"{name}.npz", **state_dict)
    out = tmp_path / f"out_{name}"
    assert cli.main(["timm", str(tmp_path / f"{name}.npz"), str(out), "--model=deit_tiny_patch16_32"]) == 2
    err = capsys.readouterr().err
    assert f"{name}.npz: error: checkpoint: " in err and message in err and err.count("\n") == 1, err
    assert not out.exists()


# Issue 54.7: each of these wrote a checkpoint ("wrote OUT", exit 0) that `init_from` would load; only the fused qkv
# weight was checked. (state_dict change, parameter, shape found, shape expected) with deit_tiny at 32 x 32.
WRONG_SHAPES = {
  "norm_scale": (("blocks.2.norm1.weight", np.ones(100)), "encoder/block_2/norm1/scale", "(100,)", "(192,)"),
  "fc1_transposed": (("blocks.0.mlp.fc1.weight", "T"), "encoder/block_0/mlp/fc_in/kernel", "(768, 192)", "(192, 768)"),
  "head_bias": (("head.bias", np.zeros(5)), "head/bias", "(5,)", "(4,)"),
  "final_norm_bias": (("norm.bias", np.zeros(191)), "encoder/final_norm/bias", "(191,)", "(192,)"),
  "cls_token": (("cls_token", np.zeros((1, 1, 96))), "cls_token", "(1, 1, 96)", "(1, 1, 192)"),
  "lambda": (("blocks.11.attn.Lambda", np.ones((3, 5))), "encoder/block_11/attention/Lambda", "(3, 5)", "(3, 2)"),
}


@pytest.mark.parametrize("name", sorted(WRONG_SHAPES))
def test_timm_command_refuses_any_parameter_of_the_wrong_shape(tmp_path, capsys, name):
  """One line (exit 2) naming the parameter, its state_dict key, the shape found and the shape expected; nothing
  written. The state_dict is the committed layout the converter reads (the last block a release Primal block)."""
  sd = _tiny_state_dict(num_primal=1)
  (key, value), parameter, found, expected = WRONG_SHAPES[name]
  sd[key] = sd[key].T.copy() if isinstance(value, str) else value.astype(np.float32)
  np.savez(tmp_path / "deit.npz", **sd)
  out = tmp_path / "out"
  assert cli.main(["timm", str(tmp_path / "deit.npz"), str(out), "--model=deit_tiny_patch16_32"]) == 2
  captured = capsys.readouterr()
  assert captured.err == (
    f"{tmp_path / 'deit.npz'}: error: checkpoint: parameter {parameter} (state_dict key {key}) has shape {found}, "
    f"but --model=deit_tiny_patch16_32 expects {expected}\n"
  )
  assert "wrote" not in captured.out and not out.exists()


def test_every_converted_parameter_names_the_state_dict_key_it_came_from():
  """`state_dict_key` (what the refusal names) maps each leaf of a converted softmax + Primal model to a key of the
  state_dict whose values it holds (as is, transposed, or rows of the fused projection)."""
  from primal_jax.convert.timm import expected_param_shapes
  from primal_jax.convert.vit import state_dict_key, vit_params

  sd = _tiny_state_dict(depth=2, num_primal=1)
  params, layers, sizes = vit_params(sd, 3)
  named = convert_timm.decode_model_name("deit_tiny_patch16_32")
  leaves = jax.tree_util.tree_leaves_with_path(params)
  assert len(leaves) == len(expected_param_shapes(named, layers, sizes)) == 43
  for path, leaf in leaves:
    names = [str(k.key) for k in path]
    key = state_dict_key("/".join(names), primal=names[:2] == ["encoder", "block_1"])
    source = sd[key.split(" ")[0]]
    if key.endswith("rows)"):  # query / key / value: its rows of the fused [3D, D] (or [2D, D]) projection
      role = ("query", "key", "value").index(names[-2])
      rows = source[role * 192 : (role + 1) * 192]
      source = rows.T.reshape(leaf.shape) if names[-1] == "kernel" else rows.reshape(leaf.shape)
    elif names[-1] == "kernel" and names[0] == "patch_embed":
      source = source.transpose(2, 3, 1, 0)
    elif names[-1] == "kernel":
      source = source.T.reshape(leaf.shape)
    np.testing.assert_array_equal(np.asarray(leaf), source.reshape(np.shape(leaf)), err_msg="/".join(names))


def test_timm_command_names_a_fused_bias_of_the_wrong_length(tmp_path, capsys):
  """A fused qk / qkv bias one short was a numpy 'cannot reshape array of size 383' (exit 2, no parameter named)."""
  sd = _tiny_state_dict(depth=12, num_primal=1)
  sd["blocks.11.attn.qk.bias"] = sd["blocks.11.attn.qk.bias"][:-1]
  np.savez(tmp_path / "deit.npz", **sd)
  assert cli.main(["timm", str(tmp_path / "deit.npz"), str(tmp_path / "out"), "--model=deit_tiny_patch16_32"]) == 2
  err = capsys.readouterr().err
  assert err.endswith(": error: blocks.11.attn.qk.bias must be [2D] = [384] as its weight, got [383]\n"), err
  assert not (tmp_path / "out").exists()
