"""Generate (or verify from the cache) the embedded D4RL-style datasets and record their summaries.

  python -m experiments.make_d4rl_dataset --env=hopper --level=all --size=100000

writes `<cache>/d4rl/<env>-<level>-v4-n<size>-s<seed>.hdf5` (D4RL layout, sha256 in the `.json` beside it) by
rolling out the committed behaviour policies (`primal_jax/tasks/offline_rl/policies/<env>/`), and with `--record`
adds each summary (transitions, episodes, mean return, normalised score, sha256, wall time) to
`experiments/results/d4rl/datasets.json`. A size below 1 or a policy directory without the level's actors ends
in one line on stderr and exit status 2, before anything is written.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "experiments" / "results" / "d4rl" / "datasets.json"


def main(argv=None):
  from primal_jax.tasks.offline_rl import datasets as ds

  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--env", default="hopper", choices=["hopper", "halfcheetah", "walker2d"])
  p.add_argument("--level", default="all", choices=["all", *ds.LEVELS])
  p.add_argument("--size", type=int, default=ds.DEFAULT_SIZE, help="transitions per level (medium-expert: 2x)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--cache_dir", default=None, help="default: $PRIMAL_JAX_DATA or ~/.cache/primal_jax")
  p.add_argument("--policy_dir", default=None, help="default: the committed primal_jax/tasks/offline_rl/policies/<env>")
  p.add_argument(
    "--record", action="store_true", help=f"add the summaries to {RESULTS.relative_to(RESULTS.parents[3])}"
  )
  args = p.parse_args(argv)
  levels = ds.LEVELS if args.level == "all" else (args.level,)
  try:
    if args.size < 1:
      raise ValueError(f"--size must be an integer >= 1 (transitions per level), got {args.size}")
    for level in levels:  # every level's actors exist before the first rollout
      ds.policy_files(args.env, level, args.policy_dir)
  except (ValueError, FileNotFoundError) as err:
    where = f"--policy_dir {args.policy_dir}: " if isinstance(err, FileNotFoundError) and args.policy_dir else ""
    sys.stderr.write(f"error: {where}{err}\n")
    sys.exit(2)
  record = json.loads(RESULTS.read_text()) if args.record and RESULTS.exists() else {}
  for level in levels:
    t0 = time.time()
    _, info = ds.load(args.env, level, args.size, args.seed, cache_dir=args.cache_dir, policy_dir=args.policy_dir)
    info = {k: v for k, v in info.items() if k != "policies"}
    info["seconds"] = round(time.time() - t0, 1)  # ~0 when read from the cache
    print(json.dumps(info), flush=True)
    if args.record:
      info["command"] = f"python -m experiments.make_d4rl_dataset --env={args.env} --level={level} --size={args.size}"
      info["command"] += f" --seed={args.seed}"
      record[f"{args.env}-{level}-v4-n{args.size}-s{args.seed}"] = info
      RESULTS.parent.mkdir(parents=True, exist_ok=True)
      RESULTS.write_text(json.dumps(dict(sorted(record.items())), indent=1) + "\n")


if __name__ == "__main__":
  main()
