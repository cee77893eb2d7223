"""Writes the upstream reference cases of Longformer, YOSO-E and SOFT (tests/data/upstream_<name>.npz).

Needs torch (and, for Longformer, transformers 3.3.1: the version the Nystromformer LRA code names); the
tests read the committed files and need neither. Each case is one attention layer as the authors' LRA /
vision code wraps it: `W_q`, `W_k`, `W_v` (torch Linear [D, D] + bias; heads = contiguous channel blocks),
the attention core, and the output Linear `ff`, run in float32, eval mode, 1 thread, on standard-normal
inputs x [B, N, D] with a padding mask. Stored: the weights under their torch names, `x`, `mask`, `out`
(= ff(core)), `cotangent` G and `grad_x` = d sum(out * G) / dx (through the upstream's own backward),
and `config_json`.

Upstream code (read at these commits; what could not be imported is re-typed below, statement for
statement, and marked so):
* Longformer: mlpen/Nystromformer `LRA/code/attention_longformer.py` (f02d511) and the `Attention` wrapper
  of `LRA/code/attention.py` (9d9d5ec), around transformers 3.3.1's `LongformerSelfAttention` (imported).
  The wrapper class is re-typed (its module imports `transformers.modeling_longformer` under a path that
  only the LRA code's folder provides).
* YOSO-E: mlpen/YOSO `encoders/backbones/efficient_attentions/yoso/yoso_v1/yoso.py` `YOSOEAttention` and
  `kernel.py` `Cumulation`, `normalize` (998cca5); re-typed: `kernel.py` compiles CUDA kernels at import.
  The expectation path is pure PyTorch (no LSH kernel is involved).
* SOFT: fudan-zvg/SOFT `models/softmax_free_transformer.py` (`SoftmaxFreeAttention`,
  `SoftmaxFreeAttentionKernel` ratio > 1 branch, `subtraction_gaussian_kernel_torch`) and
  `SOFT/kernel/inverse.py` (`newton_inv`, `_NewtonInverseKernel`) at d3febc3; re-typed without their
  `.cuda()` calls and CUDA asserts (the module imports the compiled `SOFT._C`). The conv residual
  (`use_conv`) is off. SOFT works on an H x W grid with a learned strided conv for landmarks: case `conv`
  keeps its random init, case `pool` sets it to the averaging kernel (average pooling over r x r blocks).
  Each stores `perm`, the block-major order of the grid positions in which our 1-D blocks of r^2
  consecutive positions are the upstream's r x r blocks.

    /work/venv-torch-b/bin/python tools/upstream_baselines.py [--out_dir tests/data]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

DEFAULT_DIR = Path(__file__).resolve().parents[1] / "tests" / "data"
SEED = 0


def _torch():
  import torch

  torch.manual_seed(SEED)
  torch.set_num_threads(1)
  torch.use_deterministic_algorithms(True)
  return torch


def _split_heads(x, heads):
  b, n, d = x.shape
  return x.reshape(b, n, heads, d // heads).transpose(1, 2)


def _combine_heads(x):
  b, h, n, p = x.shape
  return x.transpose(1, 2).reshape(b, n, h * p)


def _run(layer, x, call, seed):
  """(out, cotangent, grad_x) of `call(layer, x)` in eval mode."""
  torch = _torch()
  layer.eval()
  xt = torch.tensor(x, requires_grad=True)
  out = call(layer, xt)
  g = torch.tensor(np.random.default_rng(seed + 7).standard_normal(out.shape).astype(np.float32))
  (out * g).sum().backward()
  return out.detach().numpy(), g.numpy(), xt.grad.numpy()


def _state(module) -> dict[str, np.ndarray]:
  return {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}


def _inputs(seed, batch, length, dim, pads):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((batch, length, dim)).astype(np.float32)
  mask = np.stack([np.arange(length) < length - k for k in pads]).astype(np.float32)
  return x, mask


# ------------------------------------------------------------------------------------------------- Longformer


def longformer_case(first_token_view: bool, seed: int = SEED) -> dict:
  torch = _torch()
  from torch import nn
  from transformers.modeling_longformer import LongformerConfig, LongformerSelfAttention

  class LongformerAttention(LongformerSelfAttention):  # re-typed: LRA/code/attention_longformer.py (f02d511)
    def __init__(self, config, query, key, value):
      self.window_size = config["window_size"]
      self.first_token_view = config["first_token_view"]
      longformer_config = LongformerConfig()
      longformer_config.num_attention_heads = config["num_head"]
      longformer_config.hidden_size = config["transformer_dim"]
      longformer_config.attention_window = [config["window_size"]]
      super().__init__(longformer_config, 0)
      self.query.weight = query.weight
      self.query_global.weight = query.weight
      self.key.weight = key.weight
      self.key_global.weight = key.weight
      self.value.weight = value.weight
      self.value_global.weight = value.weight
      self.query.bias = query.bias
      self.query_global.bias = query.bias
      self.key.bias = key.bias
      self.key_global.bias = key.bias
      self.value.bias = value.bias
      self.value_global.bias = value.bias

    def forward(self, X, mask):
      mask = mask - 1
      if self.first_token_view:
        mask[:, 0] = 1
      return super().forward(hidden_states=X, attention_mask=mask[:, None, None, :])[0]

  config = dict(num_head=2, transformer_dim=16, head_dim=8, window_size=8, first_token_view=first_token_view)
  dim = config["transformer_dim"]

  class Attention(nn.Module):  # the longformer branch of LRA/code/attention.py's Attention
    def __init__(self):
      super().__init__()
      self.W_q, self.W_k, self.W_v = (nn.Linear(dim, dim) for _ in range(3))
      self.attn = LongformerAttention(config, self.W_q, self.W_k, self.W_v)
      self.ff = nn.Linear(dim, dim)

    def forward(self, X, mask):
      return self.ff(self.attn(X.float(), mask.float()))

  torch.manual_seed(seed)
  layer = Attention()
  x, mask = _inputs(seed, 3, 32, dim, pads=(0, 5, 13))
  mask[2, 9] = 0.0  # an interior padded position too
  out, g, grad_x = _run(layer, x, lambda m, xt: m(xt, torch.tensor(mask)), seed)
  state = {k: v for k, v in _state(layer).items() if k.split(".")[0] in ("W_q", "W_k", "W_v", "ff")}
  return dict(state, x=x, mask=mask, out=out, cotangent=g, grad_x=grad_x, config=config)


# ------------------------------------------------------------------------------------------------- YOSO-E


def yoso_case(seed: int = SEED) -> dict:
  torch = _torch()
  from torch import nn

  def normalize(inp):  # re-typed: yoso_v1/kernel.py
    if type(inp) is list:
      return [nn.functional.normalize(t, p=2, dim=-1) for t in inp]
    return nn.functional.normalize(inp, p=2, dim=-1)

  class Cumulation(torch.autograd.Function):  # re-typed: yoso_v1/kernel.py
    @staticmethod
    def forward(ctx, Q_mask, K_mask, Q, K, V, config):
      hash_code_len = config["hash_code_len"]
      expectation = (1 - torch.acos(torch.matmul(Q, K.transpose(-1, -2))) / math.pi) ** hash_code_len
      expectation = expectation * Q_mask[:, :, None] * K_mask[:, None, :]
      cumulation_V = torch.matmul(expectation, V)
      ctx.save_for_backward(Q_mask, K_mask, expectation, Q, K, V)
      ctx.config = config
      return cumulation_V

    @staticmethod
    def backward(ctx, grad):
      Q_mask, K_mask, expectation, Q, K, V = ctx.saved_tensors
      hash_code_len = ctx.config["hash_code_len"]
      weighted_exp = torch.matmul(grad, V.transpose(-1, -2)) * expectation
      grad_Q = torch.matmul(weighted_exp, (hash_code_len / 2) * K)
      grad_K = torch.matmul(weighted_exp.transpose(-1, -2), (hash_code_len / 2) * Q)
      grad_V = torch.matmul(expectation.transpose(-1, -2), grad)
      return None, None, grad_Q, grad_K, grad_V, None

  class YOSOEAttention(nn.Module):  # re-typed: yoso_v1/yoso.py
    def __init__(self, config):
      super().__init__()
      self.hash_code_len = config["hash_code_len"]
      self.lsh_config = {"hash_code_len": self.hash_code_len}
      self.use_conv = "conv_window" in config
      if self.use_conv:
        self.conv = nn.Conv2d(
          in_channels=config["num_head"], out_channels=config["num_head"],
          kernel_size=(config["conv_window"], 1), padding=(config["conv_window"] // 2, 0),
          bias=False, groups=config["num_head"],
        )  # fmt: skip

    def forward(self, Q, K, V, mask):
      if self.use_conv:
        conv_V = self.conv(V * mask[:, None, :, None])
      mask = mask.int()
      batch_size, num_heads, seq_len, head_dim = Q.size()
      Q = Q.reshape(batch_size * num_heads, seq_len, head_dim)
      K = K.reshape(batch_size * num_heads, seq_len, head_dim)
      V = V.reshape(batch_size * num_heads, seq_len, head_dim)
      mask = mask[:, None, :].repeat(1, num_heads, 1).reshape(batch_size * num_heads, seq_len)
      Q, K = normalize([Q, K])
      X = Cumulation.apply(mask, mask, Q, K, V, self.lsh_config)
      X = normalize(X)
      X = X.reshape(batch_size, num_heads, seq_len, head_dim)
      if self.use_conv:
        X += conv_V
      return X

  config = dict(num_head=2, dim=16, head_dim=8, hash_code_len=8, conv_window=5)
  dim, heads = config["dim"], config["num_head"]

  class Attention(nn.Module):  # encoders/backbones/efficient_attention.py's Attention (yoso-v1-e)
    def __init__(self):
      super().__init__()
      self.W_q, self.W_k, self.W_v = (nn.Linear(dim, dim) for _ in range(3))
      self.attn = YOSOEAttention(config)
      self.ff = nn.Linear(dim, dim)

    def forward(self, X, mask):
      Q, K, V = (_split_heads(w(X), heads) for w in (self.W_q, self.W_k, self.W_v))
      return self.ff(_combine_heads(self.attn(Q.float(), K.float(), V.float(), mask.float())))

  torch.manual_seed(seed)
  layer = Attention()
  x, mask = _inputs(seed, 3, 24, dim, pads=(0, 4, 9))
  mask[2, 3] = 0.0
  out, g, grad_x = _run(layer, x, lambda m, xt: m(xt, torch.tensor(mask)), seed)
  return dict(_state(layer), x=x, mask=mask, out=out, cotangent=g, grad_x=grad_x, config=config)


# ------------------------------------------------------------------------------------------------- SOFT


def soft_case(average: bool, seed: int = SEED) -> dict:
  torch = _torch()
  from torch import nn
  from torch.autograd import Function

  def subtraction_gaussian_kernel_torch(q, k):  # re-typed (no .cuda()): models/softmax_free_transformer.py
    matA_square = q**2.0 @ torch.ones(k.shape[-2:])
    matB_square = torch.ones(q.shape[-2:]) @ k**2.0
    return matA_square + matB_square - 2.0 * (q @ k)

  def newton_inv(mat, iter=20):  # re-typed: SOFT/kernel/inverse.py
    P = mat
    I = torch.eye(mat.size(-1), device=mat.device)  # noqa: E741
    alpha = 0.9 * 2 / torch.max(torch.sum(mat, dim=-1), -1)[0] ** 2
    P = P + 0.01 * I
    V = alpha[..., None, None].broadcast_to(P.shape) * P
    for _ in range(iter):
      V = 2 * V - V @ P @ V
    return V

  class _NewtonInverseKernel(Function):  # re-typed (no CUDA asserts): SOFT/kernel/inverse.py
    @staticmethod
    def forward(ctx, mat, iter=20):
      with torch.no_grad():
        output = newton_inv(mat, iter)
      ctx.save_for_backward(mat, output)
      return output

    @staticmethod
    def backward(ctx, grad_output):
      mat, inverse = ctx.saved_tensors
      grad_mat = -(inverse.transpose(-1, -2) @ grad_output @ inverse.transpose(-1, -2))
      return grad_mat, None

  class SoftmaxFreeAttentionKernel(nn.Module):  # re-typed: the ratio > 1 branch, use_conv off
    def __init__(self, dim, num_heads, ratio, max_iter=20):
      super().__init__()
      self.head_dim = int(dim // num_heads)
      self.num_head = num_heads
      self.ratio = ratio
      self.max_iter = max_iter
      self.kernel_function = subtraction_gaussian_kernel_torch
      self.Qlandmark_op = nn.Conv2d(self.head_dim, self.head_dim, kernel_size=ratio, stride=ratio, bias=False)
      self.Qnorm_act = nn.Sequential(nn.LayerNorm(self.head_dim), nn.GELU())

    def forward(self, Q, V, H, W):
      b, nhead, num_sequence, headdim = Q.size()
      Q = Q / math.sqrt(math.sqrt(headdim))
      Q_landmarks = Q.reshape(b * nhead, H * W, headdim).reshape(b * nhead, H, W, headdim).permute(0, 3, 1, 2)
      Q_landmarks = self.Qlandmark_op(Q_landmarks)
      Q_landmarks = Q_landmarks.flatten(2).transpose(1, 2).reshape(b, nhead, -1, headdim)
      Q_landmarks = self.Qnorm_act(Q_landmarks)
      K_landmarks = Q_landmarks
      kernel_1_ = self.kernel_function(Q, K_landmarks.transpose(-1, -2).contiguous())
      kernel_1_ = torch.exp(-kernel_1_ / 2)
      kernel_2_ = self.kernel_function(Q_landmarks, K_landmarks.transpose(-1, -2).contiguous())
      kernel_2_ = torch.exp(-kernel_2_ / 2)
      kernel_3_ = kernel_1_.transpose(-1, -2)
      inverse = _NewtonInverseKernel.apply(kernel_2_, self.max_iter)
      return torch.matmul(torch.matmul(kernel_1_, inverse), torch.matmul(kernel_3_, V))

  config = dict(dim=16, num_heads=2, ratio=2, max_iter=20, grid=[4, 6])
  dim, heads, r = config["dim"], config["num_heads"], config["ratio"]
  grid_h, grid_w = config["grid"]

  class SoftmaxFreeAttention(nn.Module):  # re-typed: models/softmax_free_transformer.py
    def __init__(self):
      super().__init__()
      self.W_q = nn.Linear(dim, dim)
      self.W_v = nn.Linear(dim, dim)
      self.attn = SoftmaxFreeAttentionKernel(dim, heads, r, config["max_iter"])
      self.ff = nn.Linear(dim, dim)

    def forward(self, X, H, W):
      Q, V = _split_heads(self.W_q(X), heads), _split_heads(self.W_v(X), heads)
      return self.ff(_combine_heads(self.attn(Q, V, H, W)))

  torch.manual_seed(seed)
  layer = SoftmaxFreeAttention()
  g = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    p = dim // heads
    if average:  # the conv is average pooling over r x r blocks
      layer.attn.Qlandmark_op.weight.copy_(torch.eye(p)[:, :, None, None].expand(p, p, r, r) / r**2)
    norm = layer.attn.Qnorm_act[0]
    norm.weight.add_(0.2 * torch.randn(norm.weight.shape, generator=g))
    norm.bias.add_(0.2 * torch.randn(norm.bias.shape, generator=g))
  x, _ = _inputs(seed, 2, grid_h * grid_w, dim, pads=(0, 0))
  out, cot, grad_x = _run(layer, x, lambda m, xt: m(xt, grid_h, grid_w), seed)
  # Block-major order: landmark block (by, bx) row-major, then its r x r positions (ky, kx) row-major.
  perm = np.array(
    [
      (by * r + ky) * grid_w + bx * r + kx
      for by in range(grid_h // r)
      for bx in range(grid_w // r)
      for ky in range(r)
      for kx in range(r)
    ]
  )
  return dict(_state(layer), x=x, out=out, cotangent=cot, grad_x=grad_x, perm=perm, config=config)


# ------------------------------------------------------------------------------------------------- files


CASES = {
  "longformer": lambda: {"global": longformer_case(True), "local": longformer_case(False)},
  "yoso": lambda: {"": yoso_case()},
  "soft": lambda: {"pool": soft_case(True), "conv": soft_case(False)},
}


def write(name: str, out_dir: Path) -> Path:
  import torch

  arrays, configs = {}, {}
  for prefix, case in CASES[name]().items():
    configs[prefix or name] = case.pop("config")
    arrays.update({(f"{prefix}/{k}" if prefix else k): np.asarray(v) for k, v in case.items()})
  versions = {"torch": torch.__version__, "numpy": np.__version__}
  if name == "longformer":
    import transformers

    versions["transformers"] = transformers.__version__
  path = out_dir / f"upstream_{name}.npz"
  np.savez_compressed(path, **arrays, config_json=np.array(json.dumps({"cases": configs, "versions": versions})))
  return path


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out_dir", type=Path, default=DEFAULT_DIR)
  parser.add_argument("--only", default="longformer,yoso,soft")
  args = parser.parse_args()
  for name in args.only.split(","):
    path = write(name.strip(), args.out_dir)
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
  main()
