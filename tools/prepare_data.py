"""Prepare the data caches that sweeps read, ahead of them: `python tools/prepare_data.py listops hopper`.

Names: listops, image, pathfinder (the `lra` config's `short` data), hopper (the `d4rl` config's Hopper medium,
regenerated from the committed policy), uea (JapaneseVowels and BasicMotions as TFDS files: shards that prepare
one TFDS dataset at the same time collide in tfds's final rename); none: all five. Everything goes under
`$PRIMAL_JAX_DATA` (default `~/.cache/primal_jax`), where the training binary finds it. Used by
`tools/device_sweep.sh`: a lent accelerator has no network, so a cache is carried there or generated there
(ListOps: 54 MB, no smaller compressed).
"""

from __future__ import annotations

import sys
import time

NAMES = ("listops", "image", "pathfinder", "hopper", "uea")


def configs(name: str) -> list:
  if name == "uea":
    from primal_jax.tasks.uea import config as uea

    return [uea.get_config(f"dataset={dataset}") for dataset in ("JapaneseVowels", "BasicMotions")]
  return [config(name)]


def config(name: str):
  if name == "hopper":
    from primal_jax.tasks.offline_rl import config as rl

    return rl.get_config("model=primal_dt,short,wide")
  from primal_jax.tasks.lra import config as lra

  return lra.get_config(f"task={name},model=primalformer,short")


def main(names: list[str]) -> int:
  from primal_jax.data.registry import get_input_pipeline

  unknown = [name for name in names if name not in NAMES]
  if unknown:
    print(f"prepare_data: unknown name(s) {', '.join(unknown)}; accepted: {', '.join(NAMES)}", file=sys.stderr)
    return 2
  for name in names or NAMES:
    start = time.perf_counter()
    for each in configs(name):
      get_input_pipeline(each.data)
    print(f"{name} ready in {time.perf_counter() - start:.1f} s", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
