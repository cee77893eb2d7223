"""`python -m primal_jax.tasks.lra.pathfinder OUT_DIR`: sample PNGs of every level and the drawing speed."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from primal_jax.tasks.lra.pathfinder.generate import generate_pathfinder
from primal_jax.tasks.lra.pathfinder.geometry import LEVEL_DIRECTORIES, LEVELS
from primal_jax.tasks.lra.pathfinder.samples import write_level_samples


def main(argv: Sequence[str] | None = None) -> None:
  """`python -m primal_jax.tasks.lra.pathfinder OUT_DIR`: sample PNGs of every level and the drawing speed."""
  parser = argparse.ArgumentParser(description=main.__doc__)
  parser.add_argument("out_dir", type=Path)
  parser.add_argument("--num", type=int, default=32, help="samples per level in the PNGs")
  parser.add_argument("--speed", type=int, default=2048, help="images per level to time (0: skip)")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  for level, path in write_level_samples(args.out_dir, num_per_level=args.num, seed=args.seed).items():
    print(f"{level}: {path}")
  for level, length in LEVELS.items():
    if args.speed:
      begin = time.perf_counter()
      generate_pathfinder(args.speed, seed=args.seed, contour_length=length)
      elapsed = time.perf_counter() - begin
      print(f"{level} ({LEVEL_DIRECTORIES[level]}): {args.speed / elapsed:.0f} images/s")


if __name__ == "__main__":
  main()
