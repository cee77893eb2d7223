"""Writes a small timm `VisionTransformer` case (state_dict, images, logits, config) as .npz.

Needs torch and timm (not test dependencies of primal_jax: the test reads the committed file). A random
DeiT-layout model (seeded; timm's own init), its constant-at-init parameters (LayerNorms, zero biases)
perturbed so a swapped or forgotten one shows, run in eval mode on standard-normal images [B, 3, H, W].
The file holds the state_dict under its torch keys (`param_keys`), `images`, `logits` and `config_json`
(the constructor keywords, num_heads and the versions used).

    python tools/timm_vit.py [--out tests/data/timm_vit_small.npz]

regenerates the committed file (torch 2.13.0 CPU, timm 0.4.12 as the release pins; float32, 1 thread).
timm 0.4.12 imports torchvision at module level; where torchvision's C extension cannot load (a CUDA
wheel beside a CPU torch) its two operator schemas are declared first, as the reference harness does
(no torchvision function is called).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "timm_vit_small.npz"
# DeiT's keywords (timm deit_*_patch16_224: qkv_bias, LayerNorm eps 1e-6) at a test-sized scale.
SMALL = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, mlp_ratio=4, num_classes=5)


def import_timm():
  """timm, after declaring torchvision's operator schemas if its C extension cannot load here."""
  import torch

  loads = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True).returncode == 0
  if not loads and not getattr(import_timm, "_declared", False):
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor qdets, Tensor qscores, float iou_threshold) -> Tensor")
    import_timm._declared, import_timm._lib = True, lib  # the library must outlive this call
  import timm

  return timm


def build_model(seed: int = 0, **overrides):
  """A seeded timm VisionTransformer (DeiT keywords) with its constant parameters perturbed, in eval mode."""
  import functools

  import torch

  timm = import_timm()
  from timm.models.vision_transformer import VisionTransformer

  torch.manual_seed(seed)
  kwargs = {**SMALL, **overrides}
  model = VisionTransformer(qkv_bias=True, norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6), **kwargs)
  g = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for p in model.parameters():
      if p.numel() > 1 and bool(torch.all(p == p.reshape(-1)[0])):  # LayerNorm ones/zeros, zeroed biases
        p.add_(0.1 * torch.randn(p.shape, generator=g))
  config = {**kwargs, "qkv_bias": True, "layer_norm_eps": 1e-6, "timm": timm.__version__, "torch": torch.__version__}
  return model.eval(), config


def run_model(model, images: np.ndarray) -> np.ndarray:
  import torch

  with torch.no_grad():
    return model(torch.from_numpy(images)).numpy()


def state_dict_arrays(model) -> dict[str, np.ndarray]:
  return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def write_case(out: Path, *, seed: int = 0, batch: int = 3) -> Path:
  import torch

  torch.set_num_threads(1)
  model, config = build_model(seed)
  images = np.random.default_rng(seed).standard_normal((batch, 3, config["img_size"], config["img_size"]))
  images = images.astype(np.float32)
  sd = state_dict_arrays(model)
  np.savez_compressed(
    out,
    **sd,
    param_keys=np.array(list(sd)),
    images=images,
    logits=run_model(model, images),
    config_json=np.array(json.dumps(config)),
  )
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  path = write_case(args.out, seed=args.seed)
  print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
  main()
