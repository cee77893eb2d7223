"""eta x KSVD / task loss in the authors' own UEA training (issue 55.2: our PrimalFormer's KSVD term is 140-302
times the task loss at step 1 at the release's eta 0.5 on JapaneseVowels; is the release's the same?).

    python -m experiments.release_ratio --release_dir=/tmp/PrimalAttention --torch_python=/tmp/torch_venv/bin/python \
      --out=experiments/results/release_ratio/japanese_vowels

reads JapaneseVowels' .ts files (fetched from the `aeon` wheel, as the `uea` config does), standardises them
over every time step of the training split as the release's `Normalizer` does (mean and std with ddof 1, the
std plus float64 eps), zero-pads them to the longest series with a padding mask, and runs
`experiments.release_ratio_torch` (the release's model, loss and optimiser, unmodified) once per seed in the
torch interpreter. Writes `ratio.json`: per seed and step the task and KSVD losses and the ratio, with this
process's provenance (commit, argv, host) and the release's commit when `--release_dir` is a git checkout.
Getting the release and torch: docs/benchmarks.md ("Side by side with the PyTorch release").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from experiments.release_ratio_torch import MARKER

_DATASET = "JapaneseVowels"


def release_arrays(train_series, labels) -> dict[str, np.ndarray]:
  """The release's inputs: every series standardised with the training split's per-channel mean and std (ddof 1,
  plus float64 eps, `data_loader.data.Normalizer`), zero-padded at the end, with a True-at-real-steps mask."""
  from primal_jax.tasks.uea.ts_format import pad_batch

  rows = np.concatenate(train_series).astype(np.float64)
  mean, std = rows.mean(axis=0), rows.std(axis=0, ddof=1) + np.finfo(float).eps
  values, mask = pad_batch([((s - mean) / std).astype(np.float32) for s in train_series])
  return {"values": values, "mask": mask, "labels": np.asarray(labels, dtype=np.int64)}


def _release_commit(release_dir: str) -> str | None:
  try:
    out = subprocess.run(["git", "-C", release_dir, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
  except (OSError, subprocess.CalledProcessError):
    return None
  return out.stdout.strip()


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--release_dir", required=True, help="the authors' repository (or its TimeSeries folder)")
  parser.add_argument("--torch_python", required=True, help="an interpreter with torch (and numpy)")
  parser.add_argument("--out", required=True, help="the folder ratio.json goes to (one without a record)")
  parser.add_argument("--seeds", default="0,1,2", help="torch seeds, one run each")
  parser.add_argument("--epochs", type=int, default=20, help="epochs per run (ours: 20)")
  args = parser.parse_args(argv)
  from primal_jax.atomic_files import write_json_atomically
  from primal_jax.provenance import provenance
  from primal_jax.tasks.uea.aeon_wheel import fetch_aeon_dataset
  from primal_jax.tasks.uea.ts_format import read_ts

  out = Path(args.out) / "ratio.json"
  if out.exists():
    parser.error(f"--out: {out} exists; records are never rewritten, name a new folder")
  try:
    seeds = [int(seed) for seed in args.seeds.split(",")]
  except ValueError:
    parser.error(f"--seeds: comma-separated integers, got {args.seeds!r}")
  if args.epochs < 1:
    parser.error(f"--epochs: at least 1, got {args.epochs}")
  origin = provenance(devices=False)  # the tree as the run starts (edits made while it runs are not its code)
  train = read_ts(fetch_aeon_dataset(_DATASET) / f"{_DATASET}_TRAIN.ts")
  arrays = release_arrays(train.series, train.labels)
  runs = []
  with tempfile.TemporaryDirectory() as tmp:
    data = Path(tmp) / "data.npz"
    np.savez(data, num_classes=train.num_classes, **arrays)
    for seed in seeds:
      command = [args.torch_python, "-m", "experiments.release_ratio_torch", f"--release_dir={args.release_dir}"]
      command += [f"--data={data}", f"--seed={seed}", f"--epochs={args.epochs}"]
      env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
      done = subprocess.run(command, capture_output=True, text=True, env=env)
      lines = [line for line in done.stdout.splitlines() if line.startswith(MARKER)]
      if done.returncode or not lines:
        sys.exit(f"the release's run (seed {seed}) failed, exit {done.returncode}:\n{done.stderr[-2000:]}")
      runs.append(json.loads(lines[-1][len(MARKER) :]))
      first = runs[-1]["steps"][0]
      print(f"seed {seed}: step 1 eta x KSVD / task {first['ratio']:.3g}, last {runs[-1]['steps'][-1]['ratio']:.3g}")
  meta = {"provenance": origin, "platform": "cpu", "device_kind": "cpu"}
  meta.update(dataset=_DATASET, epochs=args.epochs, release_commit=_release_commit(args.release_dir))
  out.parent.mkdir(parents=True, exist_ok=True)
  write_json_atomically(out, {"meta": meta, "runs": runs}, indent=1)
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
