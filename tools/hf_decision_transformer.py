"""Writes a small Hugging Face `DecisionTransformerModel` case (weights, inputs, outputs, config) as .npz.

Needs torch and transformers (not test dependencies of primal_jax: the test reads the committed file).
A random model (seeded), constant-at-init parameters (LayerNorms, zero biases, `wpe`) perturbed so a
swapped or forgotten one shows, run in eval mode on a batch with left and right padding. The file
holds the state_dict under its torch keys (`param_keys`), the inputs, `state_preds`, `action_preds`,
`return_preds` and `config_json` (the model's config plus n_head and the versions used).

    python tools/hf_decision_transformer.py [--out tests/data/hf_dt_small.npz]

regenerates the committed file (torch 2.13.0 CPU, transformers 4.57.6; float32, 1 thread).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "hf_dt_small.npz"


def write_case(
  out: Path,
  *,
  seed: int = 0,
  state_dim: int = 5,
  act_dim: int = 3,
  hidden_size: int = 16,
  n_layer: int = 2,
  n_head: int = 2,
  k: int = 6,
  batch: int = 3,
  max_ep_len: int = 64,
  n_positions: int | None = None,
  activation_function: str = "relu",
) -> Path:
  """Builds, runs and saves one case; returns `out`. Sample 1 is left-padded, sample 2 right-padded.

  `n_positions` (rows of `wpe`, also the size of GPT-2's causal-mask buffer) defaults to the 3K tokens.
  """
  import torch
  import transformers

  torch.manual_seed(seed)
  torch.set_num_threads(1)
  config = transformers.DecisionTransformerConfig(
    state_dim=state_dim,
    act_dim=act_dim,
    hidden_size=hidden_size,
    max_ep_len=max_ep_len,
    n_layer=n_layer,
    n_head=n_head,
    n_positions=3 * k if n_positions is None else n_positions,
    activation_function=activation_function,
    attn_implementation="eager",
  )
  model = transformers.DecisionTransformerModel(config).eval()
  g = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for key, p in model.state_dict().items():
      if key.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight", "embed_ln.weight", "bias")) or "wpe" in key:
        p += 0.1 * torch.randn(p.shape, generator=g)
  mask = torch.ones(batch, k, dtype=torch.long)
  mask[1 % batch, : k // 2] = 0  # left padding (the original DT's get_batch)
  mask[2 % batch, k - 2 :] = 0  # right padding
  real = mask[..., None] > 0
  inputs = {
    "states": torch.where(real, torch.randn(batch, k, state_dim), torch.zeros(())),
    "actions": torch.where(real, torch.rand(batch, k, act_dim) * 2 - 1, torch.full((), -10.0)),
    "returns_to_go": torch.where(real, torch.rand(batch, k, 1) * 3, torch.zeros(())),
    "timesteps": torch.where(mask > 0, torch.randint(0, max_ep_len - k, (batch, 1)) + torch.arange(k), 0),
    "attention_mask": mask,
  }
  with torch.no_grad():
    state_preds, action_preds, return_preds = model(
      states=inputs["states"],
      actions=inputs["actions"],
      rewards=torch.zeros(batch, k, 1),
      returns_to_go=inputs["returns_to_go"],
      timesteps=inputs["timesteps"],
      attention_mask=inputs["attention_mask"],
      return_dict=False,
    )
  sd = {k_: v.numpy() for k_, v in model.state_dict().items() if v.dtype.is_floating_point}
  meta = dict(config.to_dict(), n_head=n_head, torch=torch.__version__, transformers=transformers.__version__)
  out = Path(out)
  out.parent.mkdir(parents=True, exist_ok=True)
  np.savez_compressed(
    out,
    **sd,
    **{k_: v.numpy() for k_, v in inputs.items()},
    state_preds=state_preds.numpy(),
    action_preds=action_preds.numpy(),
    return_preds=return_preds.numpy(),
    param_keys=np.array(list(sd)),
    config_json=np.array(json.dumps(meta, default=str)),
  )
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output .npz (default: %(default)s)")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  path = write_case(args.out, seed=args.seed)
  print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
  main()
