"""The release's side of `experiments/release_ratio.py`: train the authors' PyTorch UEA PrimalFormer, unmodified, and
log eta x KSVD / task loss at every step (issue 55.2: is the KSVD term as heavy in the release's own runs?).

Runs in an interpreter with torch (and no JAX). It imports `models.Primalformer`, `models.loss` and `optimizers`
from the release's `PrimalAttention_TimeSeries/PrimalFormer/` folder as they are and trains the way its `main.py`
and `running.SupervisedRunner.train_epoch` do for the JapaneseVowels command of `bashes/run_primalformer.sh`:
`primal_cos`, d_model 512, 8 heads, 2 layers, d_ff 2048, dropout 0.1, learnable positions, BatchNorm, gelu,
low_rank (s) 40, rank_multi 5, eta 0.5, RAdam at lr 1e-3, batch 16 (shuffled), the gradient norm clipped at 4,
the loss the mean over the batch of `NoFussCE_KSVD(reduction='none')`.

What differs, and why: the inputs are the arrays `release_ratio.py` writes (the .ts files read by this project's
parser, standardised over every training time step as the release's `Normalizer` does, zero-padded to the
longest series, with the padding mask), since the release's loader needs sktime 0.4.1, which does not install on
this Python; and the seed is ours (`--seed`, where `main.py` fixes 666), to see the spread.

Prints one line `RELEASE_RATIO_JSON {...}`: per step the task (cross-entropy) and KSVD losses, eta and the ratio.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

MARKER = "RELEASE_RATIO_JSON "


def find_model_dir(release_dir: str | Path) -> Path:
  """The release's PrimalFormer time-series folder inside `release_dir` (the repository root, its
  PrimalAttention_TimeSeries folder, or the PrimalFormer folder itself)."""
  root = Path(release_dir)
  for candidate in (root, root / "PrimalFormer", root / "PrimalAttention_TimeSeries" / "PrimalFormer"):
    if (candidate / "models" / "Primalformer.py").is_file() and (candidate / "optimizers.py").is_file():
      return candidate
  raise SystemExit(f"--release_dir: no PrimalAttention_TimeSeries/PrimalFormer/models/Primalformer.py under {root}")


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--release_dir", required=True)
  parser.add_argument("--data", required=True, help="the .npz release_ratio.py wrote")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--epochs", type=int, default=20)
  parser.add_argument("--eta", type=float, default=0.5)
  parser.add_argument("--low_rank", type=int, default=40)
  parser.add_argument("--rank_multi", type=int, default=5)
  parser.add_argument("--batch_size", type=int, default=16)
  parser.add_argument("--threads", type=int, default=1)
  args = parser.parse_args(argv)

  import numpy as np
  import torch

  sys.path.insert(0, str(find_model_dir(args.release_dir)))
  from models.loss import NoFussCE_KSVD  # the release's modules, as they are
  from models.Primalformer import PrimalformerClassiregressor
  from optimizers import RAdam

  torch.set_num_threads(args.threads)
  torch.manual_seed(args.seed)
  data = np.load(args.data)
  values, mask, labels = (torch.from_numpy(data[k]) for k in ("values", "mask", "labels"))
  num_classes = int(data["num_classes"])
  model = PrimalformerClassiregressor(
    "primal_cos",
    values.shape[-1],
    values.shape[1],
    512,
    8,
    2,
    2048,
    num_classes=num_classes,
    dropout=0.1,
    pos_encoding="learnable",
    activation="gelu",
    norm="BatchNorm",
    freeze=False,
    low_rank=args.low_rank,
    rank_multi=args.rank_multi,
    nb_features=64,
  )
  optimizer = RAdam(model.parameters(), lr=1e-3, weight_decay=0)
  loss_module = NoFussCE_KSVD(reduction="none")
  generator = torch.Generator().manual_seed(args.seed)
  steps = []
  model.train()
  for _ in range(args.epochs):
    order = torch.randperm(len(labels), generator=generator)
    for start in range(0, len(labels), args.batch_size):
      batch = order[start : start + args.batch_size]
      predictions, score_list, lambda_list = model(values[batch], mask[batch])
      loss, loss_ce, loss_ksvd = loss_module(lambda_list, predictions, labels[batch], args.eta, score_list)
      optimizer.zero_grad()
      loss.mean().backward()
      torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=4.0)
      optimizer.step()
      task, ksvd = float(loss_ce.mean()), float(loss_ksvd.mean())
      if not (math.isfinite(task) and math.isfinite(ksvd)):
        raise SystemExit(f"step {len(steps) + 1}: a non-finite loss (task {task}, KSVD {ksvd})")
      steps.append({"task_loss": task, "ksvd_loss": ksvd, "eta": args.eta, "ratio": args.eta * ksvd / task})
  result = {"seed": args.seed, "torch": torch.__version__, "threads": args.threads, "steps": steps}
  print(MARKER + json.dumps(result), flush=True)
  return result


if __name__ == "__main__":
  main()
