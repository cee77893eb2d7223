"""timm ViT / DeiT checkpoints -> an orbax checkpoint of `VisionTransformer` params (`config.init_from`).

`python -m primal_jax.convert timm CHECKPOINT OUT_DIR --model=deit_small_patch16_224` reads the
state_dict (a torch `.pth` / `.pt` / `.bin`, DeiT's `{"model": state_dict}` included, needs torch; a
`.safetensors` file needs the safetensors package; an `.npz` of the arrays needs neither), converts it
(`primal_jax.convert.vit`), checks it against the named size, and writes step 0 of a `Checkpointer`
directory holding `{"params": ...}` plus `vit_model.json` (the sizes and layers to configure the model
with). `restore_params` reads it as any run's checkpoint. A state_dict with NaN or infinite values, or whose
`pos_embed` is not a square grid of patches (plus the class token), is refused before anything is written, and
so is one with any parameter of another shape than the named model's (`check_param_shapes`: every leaf of the
converted tree against the tree `VisionTransformer.init` builds, one line naming the parameter, its state_dict
key, the shape found and the shape expected).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from primal_jax.convert.cases import load_npz
from primal_jax.convert.vit import state_dict_key, vit_params
from primal_jax.errors import ConfigError
from primal_jax.models.config import TransformerConfig
from primal_jax.models.vit import DEIT_BODY, DEPTH, VARIANTS, VisionTransformer

MODEL_NAME = re.compile(r"(deit|vit)_(tiny|small|base)_patch(\d+)_(\d+)(\..+)?")
SIZE_NAMES = {"tiny": "Ti", "small": "S", "base": "B"}
MODEL_FILE = "vit_model.json"
CHECKPOINT_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors", ".npz")
MLP_RATIO = 4  # timm's {deit,vit}_{tiny,small,base}: hidden_dim = 4 * dim


def decode_model_name(name: str) -> dict:
  """The sizes a timm name means: "deit_small_patch16_224" -> variant "S/16", dim 384, 6 heads, patch 16, image 224."""
  match = MODEL_NAME.fullmatch(name)
  if not match:
    raise ValueError(
      f"--model must be a timm name like deit_small_patch16_224 or vit_base_patch16_224 (sizes tiny, small, base); "
      f"got {name!r}"
    )
  size = SIZE_NAMES[match.group(2)]
  dim, heads = VARIANTS[size]
  patch, image = int(match.group(3)), int(match.group(4))
  return {"variant": f"{size}/{patch}", "dim": dim, "num_heads": heads, "patch_size": patch, "image_size": image}


def _unwrap(checkpoint) -> dict:
  """DeiT's release files wrap the state_dict as {"model": ...}; others as {"state_dict": ...}."""
  for key in ("model", "state_dict"):
    if isinstance(checkpoint, dict) and isinstance(checkpoint.get(key), dict):
      return checkpoint[key]
  return checkpoint


def load_state_dict(path: str | Path) -> dict[str, np.ndarray]:
  """A checkpoint file's state_dict as float32 NumPy arrays (module doc for the formats)."""
  path = Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"checkpoint {str(path)!r} is not a file")
  suffix = path.suffix.lower()
  if suffix not in CHECKPOINT_SUFFIXES:
    raise ConfigError(
      f"checkpoint {str(path)!r}: unknown file type {suffix!r}; accepted: {', '.join(CHECKPOINT_SUFFIXES)}"
    )
  if suffix == ".npz":
    z = load_npz(path)
    keys = [str(k) for k in z["param_keys"]] if "param_keys" in z else list(z)
    return {k: np.asarray(z[k], np.float32) for k in keys}
  if suffix == ".safetensors":
    try:
      from safetensors.numpy import load_file
    except ImportError:
      raise ValueError(
        "reading a .safetensors checkpoint needs the safetensors package (pip install safetensors)"
      ) from None
    return {k: np.asarray(v, np.float32) for k, v in load_file(str(path)).items()}
  try:
    import torch
  except ImportError:
    raise ValueError(
      f"reading {path.name} needs torch (pip install torch); or save its state_dict as .npz "
      "(numpy.savez(out, **{k: v.numpy() for k, v in state_dict.items()})) and pass that"
    ) from None
  checkpoint = _unwrap(torch.load(str(path), map_location="cpu", weights_only=True))
  return {k: v.detach().float().numpy() for k, v in checkpoint.items() if hasattr(v, "detach")}


def check_finite_weights(state_dict) -> None:
  """ConfigError naming the arrays of `state_dict` that hold NaN or inf (and how many of their values)."""
  bad = []
  for key, value in state_dict.items():
    finite = np.isfinite(np.asarray(value))
    if not finite.all():
      bad.append(f"{key} ({int(finite.size - finite.sum())} of {finite.size})")
  if bad:
    shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
    raise ConfigError(f"checkpoint: non-finite values (NaN or inf) in {shown}; refusing to convert a broken model")


def _leaf_shapes(tree) -> dict[str, tuple[int, ...]]:
  leaves = jax.tree_util.tree_leaves_with_path(tree)
  return {"/".join(str(k.key) for k in path): tuple(np.shape(leaf)) for path, leaf in leaves}


def expected_param_shapes(named: dict, layers: tuple, sizes: dict) -> dict[str, tuple[int, ...]]:
  """Parameter path -> shape of the `VisionTransformer` the named model is (its width, heads, depth, patch and MLP
  ratio), with the checkpoint's attention layers, image size, channels and class count (no head when it has none),
  from `VisionTransformer.init` traced without computing anything (`jax.eval_shape`)."""
  config = TransformerConfig(**{
    **DEIT_BODY, "layers": layers, "dim": named["dim"], "hidden_dim": MLP_RATIO * named["dim"],
    "num_heads": named["num_heads"], "num_classes": max(sizes["num_classes"], 1),
  })  # fmt: skip
  module = VisionTransformer(config, image_size=sizes["image_size"], patch_size=named["patch_size"])
  images = jax.ShapeDtypeStruct((1, sizes["image_size"], sizes["image_size"], sizes["channels"]), jnp.float32)
  shapes = _leaf_shapes(nn.unbox(jax.eval_shape(module.init, jax.random.key(0), images)["params"]))
  return {path: shape for path, shape in shapes.items() if sizes["num_classes"] or not path.startswith("head/")}


def check_param_shapes(params: dict, expected: dict[str, tuple[int, ...]], model: str) -> None:
  """ConfigError naming the first parameter of `params` (in the model's order) whose shape is not `expected`'s, the
  state_dict key it came from, the shape found and the shape expected; or one the model lacks or has beyond it."""
  found = _leaf_shapes(params)

  def key(path: str) -> str:
    parts = path.split("/")
    primal = len(parts) > 2 and "We" in params.get("encoder", {}).get(parts[1], {}).get("attention", {})
    return state_dict_key(path, primal)

  for path, shape in expected.items():
    if path not in found:
      raise ConfigError(f"checkpoint: no parameter {path} ({key(path)}), which --model={model} has: shape {shape}")
    if found[path] != shape:
      raise ConfigError(
        f"checkpoint: parameter {path} (state_dict key {key(path)}) has shape {found[path]}, but --model={model} "
        f"expects {shape}"
      )
  extra = [path for path in found if path not in expected]
  if extra:
    raise ConfigError(f"checkpoint: parameter {extra[0]} ({key(extra[0])}) is not part of --model={model}")


def convert_state_dict(state_dict, model: str) -> tuple[dict, dict]:
  """(params, model description) of a timm state_dict named `model`; sizes checked against the name."""
  named = decode_model_name(model)
  check_finite_weights(state_dict)
  params, layers, sizes = vit_params(state_dict, named["num_heads"])
  if sizes["image_size"] is None:
    pos = np.shape(state_dict["pos_embed"])
    raise ConfigError(
      f"checkpoint: pos_embed {list(pos)} holds {pos[1] - 1} patch positions: not a square grid (k x k patches "
      "plus the class token), which VisionTransformer needs"
    )
  found = {**sizes, "depth": len(layers)}
  for key, expected in (("dim", named["dim"]), ("patch_size", named["patch_size"]), ("depth", DEPTH)):
    if found[key] != expected:
      raise ValueError(f"--model={model} means {key} {expected}, but the checkpoint has {found[key]}")
  check_param_shapes(params, expected_param_shapes(named, layers, sizes), model)
  description = {
    **named,
    "num_layers": len(layers),
    "hidden_dim": sizes["hidden_dim"],
    "num_classes": sizes["num_classes"],
    "channels": sizes["channels"],
    "checkpoint_image_size": sizes["image_size"],
    "layers": [layer if isinstance(layer, str) else list(layer) for layer in layers],
    "source": model,
  }
  return params, description


def write_params_checkpoint(params, out_dir: str | Path, description: dict | None = None) -> Path:
  """Step 0 of a `Checkpointer` directory at `out_dir` holding {"params": params} (+ `vit_model.json`)."""
  from primal_jax.training.checkpointing.checkpointer import Checkpointer

  out_dir = Path(out_dir).resolve()
  if out_dir.exists() and any(out_dir.iterdir()):
    raise ValueError(f"OUT_DIR {out_dir} exists and is not empty; choose a new directory")
  arrays = jax.tree.map(jax.numpy.asarray, params)
  with Checkpointer(out_dir, max_to_keep=None, async_save=False) as ckpt:
    ckpt.save(0, {"params": arrays}, force=True)
  if description is not None:
    (out_dir / MODEL_FILE).write_text(json.dumps(description, indent=1))
  return out_dir


def convert_timm_checkpoint(checkpoint: str | Path, out_dir: str | Path, model: str) -> dict:
  """The `timm` command: read, convert, write; returns the model description."""
  params, description = convert_state_dict(load_state_dict(checkpoint), model)
  write_params_checkpoint(params, out_dir, description)
  return description
