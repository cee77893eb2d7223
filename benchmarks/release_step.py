"""The release's side of `benchmarks/vs_release.py`: time the authors' PyTorch LRA training step, unmodified.

Runs in an interpreter with torch (and no JAX): `benchmarks/vs_release.py --torch_python=...` starts it, one
process per configuration. It imports `model_wrapper.ModelForSC` and `lra_config` from the release's
`PrimalAttention_LRA/PrimalFormer/` folder as they are, builds the ListOps model the way
`run_tasks_time_memory.py` does (its config, `max_seq_len` rounded up to a power of 2, `primal_cos` with
low_rank / eta / rank_multi / trace_no_x), and runs its training step: zero_grad, forward, the mean loss's
backward, AdamW (betas 0.9/0.999, eps 1e-6, weight decay 0) and the OneCycleLR step.

What differs from the release's script, and why: `mixed_precision` is False (its autocast and GradScaler
are CUDA-only; on a CPU they are disabled anyway, so the step runs in float32 as ours does), the model stays
on the CPU (no `.cuda()`, no DataParallel), and the batch is synthetic (full-length random tokens, all
positions unmasked, the same shape and vocabulary as ours), so no data loading is timed on either side.

Prints one line `RELEASE_STEP_JSON {...}`: per-step seconds and other processes' load, peak RSS, the
losses, torch's thread settings and a torch matmul peak measured in the same process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from benchmarks.harness import process

MARKER = "RELEASE_STEP_JSON "
# Our model names -> the release's attn_type.
ATTN_TYPES = {"primalformer": "primal_cos", "softmax": "softmax"}


def find_model_dir(release_dir: str | Path) -> Path:
  """The release's PrimalFormer LRA folder inside `release_dir` (the repository root, PrimalAttention_LRA, or it)."""
  root = Path(release_dir)
  for candidate in (root, root / "PrimalFormer", root / "PrimalAttention_LRA" / "PrimalFormer"):
    if (candidate / "model_wrapper.py").is_file() and (candidate / "lra_config.py").is_file():
      return candidate
  raise FileNotFoundError(
    f"no PrimalFormer/model_wrapper.py under {root}: extract the release, e.g. git --git-dir=<mirror> archive "
    "HEAD PrimalAttention_LRA | tar -x -C <dir>, and pass that <dir>"
  )


def release_config(lra_config, model: str, seq_len: int, args) -> dict:
  """The ListOps model config as run_tasks_time_memory.py assembles it (CPU: mixed precision off)."""
  attn_type = ATTN_TYPES[model]
  config = dict(lra_config.config[args.task]["model"])
  config.update(lra_config.config[args.task]["extra_attn_config"][attn_type])
  config["mixed_precision"] = False
  config["attn_type"] = attn_type
  config["max_seq_len"] = 1 << (seq_len - 1).bit_length()
  if attn_type.startswith("primal"):
    config.update(low_rank=args.low_rank, eta=args.eta, rank_multi=args.rank_multi, trace_no_x=True)
  return config


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--release_dir", required=True)
  parser.add_argument("--model", choices=tuple(ATTN_TYPES), required=True)
  parser.add_argument("--seq_len", type=int, required=True)
  parser.add_argument("--task", default="listops")
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--warmup_steps", type=int, default=3)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--low_rank", type=int, default=20)
  parser.add_argument("--eta", type=float, default=0.1)
  parser.add_argument("--rank_multi", type=int, default=10)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--peak_size", type=int, default=2048, help="matmul peak size (0: skip)")
  return parser.parse_args(argv)


def matmul_peak(torch, size: int, repeats: int = 5) -> dict | None:
  """Median FLOP/s of a float32 [size, size] @ [size, size] in this process (torch's own threads)."""
  if size <= 0:
    return None
  a, b = torch.randn(size, size), torch.randn(size, size)
  torch.matmul(a, b)
  samples = []
  for _ in range(repeats):
    start = time.perf_counter()
    torch.matmul(a, b)
    samples.append(time.perf_counter() - start)
  return {"size": size, "flops_per_s": 2.0 * size**3 / statistics.median(samples), "seconds": samples}


def main(argv=None) -> dict:
  args = parse_args(argv)
  cores = process.pin_threads(args.threads)
  import torch

  torch.set_num_threads(args.threads)
  torch.set_num_interop_threads(1)  # the step is one graph of ops run in order; intra-op threads do the work
  torch.manual_seed(args.seed)
  model_dir = find_model_dir(args.release_dir)
  sys.path.insert(0, str(model_dir))
  import lra_config  # noqa: E402  (the release's own modules, from --release_dir)
  import model_wrapper  # noqa: E402

  config = release_config(lra_config, args.model, args.seq_len, args)
  model = model_wrapper.ModelForSC(config)
  model.train()
  training = lra_config.config[args.task]["training"]
  optimizer = torch.optim.AdamW(
    model.parameters(), lr=training["learning_rate"], betas=(0.9, 0.999), eps=1e-6,
    weight_decay=training["weight_decay"],
  )  # fmt: skip
  total = max(training["num_train_steps"], args.warmup_steps + args.steps + 1)
  schedule = torch.optim.lr_scheduler.OneCycleLR(
    optimizer, max_lr=training["learning_rate"], pct_start=training["warmup"] / training["num_train_steps"],
    anneal_strategy=training["lr_decay"], total_steps=total,
  )  # fmt: skip
  generator = torch.Generator().manual_seed(args.seed)
  batch = {
    "input_ids_0": torch.randint(1, config["vocab_size"], (args.batch_size, args.seq_len), generator=generator),
    "mask_0": torch.ones(args.batch_size, args.seq_len),
    "label": torch.randint(0, config["num_classes"], (args.batch_size,), generator=generator),
  }
  losses = []

  def step():
    optimizer.zero_grad()
    loss = model(**batch)["loss"].mean()
    loss.backward()
    optimizer.step()
    schedule.step()
    losses.append(float(loss.detach()))

  for _ in range(args.warmup_steps):
    step()
  samples = [process.timed_with_load(step) for _ in range(args.steps)]
  out = {
    "side": "release",
    "model": args.model,
    "seq_len": args.seq_len,
    "batch_size": args.batch_size,
    "attn_type": config["attn_type"],
    "num_params": sum(p.numel() for p in model.parameters()),
    "steps": samples,
    "losses": losses,
    "peak_rss_bytes": process.peak_rss_bytes(),
    "allocator": process.mapped_allocator(),
    "threads": {
      "cores": cores,
      "torch_num_threads": torch.get_num_threads(),
      "torch_num_interop_threads": torch.get_num_interop_threads(),
      "process_threads": process.thread_count(),
    },
    "matmul_peak": matmul_peak(torch, args.peak_size),
    "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
  }
  print(MARKER + json.dumps(out), flush=True)
  return out


if __name__ == "__main__":
  main()
