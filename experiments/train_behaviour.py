"""Train (or resume) a SAC behaviour policy for the embedded D4RL-style datasets, then export the committed actors.

  mkdir -p /work/behaviour/hopper && nice -n 19 nohup python -m experiments.train_behaviour --env=hopper \
    --total_steps=300000 --snapshot_every=5000 --workdir=/work/behaviour/hopper \
    >> /work/behaviour/hopper/train.log 2>&1 &

Run the same command again to resume: the workdir holds a checkpoint every `--checkpoint_every` env steps
(SAC state, replay buffer, RNGs) and the resumed run is the uninterrupted one. `--total_steps` may be raised.

  python -m experiments.train_behaviour --env=hopper --workdir=/work/behaviour/hopper --export

picks, from the actor snapshots evaluated along the run, `medium` (stochastic-policy normalised score closest
to 40 among the first snapshots inside D4RL's medium band 30-50), `expert` (the best) and the medium-replay
snapshots (evenly spaced from step 0 up to `medium`), re-evaluates medium and expert on 5 episodes, writes them with
`policies.json` under `primal_jax/tasks/offline_rl/policies/<env>/` (package data: the wheel ships them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import sys
from pathlib import Path

# = primal_jax.tasks.offline_rl.datasets.POLICY_ROOT
POLICIES = Path(__file__).resolve().parents[1] / "primal_jax" / "tasks" / "offline_rl" / "policies"
EXPORT_EPISODES = 5
MAX_REPLAY = 8


def parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--env", default="hopper", choices=["hopper", "halfcheetah", "walker2d"])
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--total_steps", type=int, default=200_000)
  p.add_argument("--start_steps", type=int, default=5_000)
  p.add_argument("--update_after", type=int, default=1_000)
  p.add_argument("--update_every", type=int, default=50)
  p.add_argument("--checkpoint_every", type=int, default=10_000)
  p.add_argument("--snapshot_every", type=int, default=10_000)
  p.add_argument("--eval_episodes", type=int, default=3)
  p.add_argument("--batch_size", type=int, default=256)
  p.add_argument("--critic_hidden", default="128,128", help="critic MLP widths (SAC's own: 256,256, ~3x slower)")
  p.add_argument("--workdir", required=True)
  p.add_argument("--max_chunks", type=int, default=0, help="stop after this many chunks (0: run to total_steps)")
  p.add_argument("--threads", type=int, default=1, help="1: single-threaded XLA (leaves the other core to others)")
  p.add_argument("--export", action="store_true", help="export the committed policies from a workdir, no training")
  p.add_argument("--out", default=str(POLICIES), help="export root (a subfolder per env)")
  return p.parse_args(argv)


def _config(args):
  from primal_jax.tasks.offline_rl.behaviour import TrainConfig

  keys = ["env", "seed", "total_steps", "start_steps", "update_after", "update_every", "checkpoint_every"]
  keys += ["snapshot_every", "eval_episodes", "batch_size"]
  critic_hidden = tuple(int(h) for h in args.critic_hidden.split(","))
  return TrainConfig(**{k: getattr(args, k) for k in keys}, critic_hidden=critic_hidden)


def _evals(workdir: Path) -> dict[int, dict]:
  """Last eval record per step from log.jsonl, only for snapshots that exist."""
  out = {}
  for line in (workdir / "log.jsonl").read_text().splitlines():
    rec = json.loads(line)
    if rec.get("kind") == "eval" and (workdir / "snapshots" / f"actor_{rec['step']:07d}.npz").exists():
      out[rec["step"]] = rec
  return dict(sorted(out.items()))


def _sha256(path: Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def export(args, train_command: str):
  from primal_jax.tasks.offline_rl import policy as pol

  workdir, out = Path(args.workdir), Path(args.out) / args.env
  evals = _evals(workdir)
  if not evals:
    raise SystemExit(f"no evaluated snapshots in {workdir}")
  snap = lambda s: workdir / "snapshots" / f"actor_{s:07d}.npz"  # noqa: E731

  def full_eval(step):
    p = pol.load_policy(snap(step))
    det = pol.evaluate(p, args.env, EXPORT_EPISODES, seed=20_000)
    sto = pol.evaluate(p, args.env, EXPORT_EPISODES, seed=20_000, stochastic=True)
    mean = lambda r: float(sum(r) / len(r))  # noqa: E731
    return {
      "return_det": mean(det),
      "score_det": float(pol.normalized_score(args.env, mean(det))),
      "return_sto": mean(sto),
      "score_sto": float(pol.normalized_score(args.env, mean(sto))),
    }

  # medium: the first 5 snapshots inside the band 30-50 by the cheap run-time evaluation (else the 3 nearest to
  # 40), re-scored on EXPORT_EPISODES episodes; the one closest to 40 wins. Earliest first: stable as training goes on.
  band = [s for s in evals if 30.0 <= evals[s]["score_sto"] <= 50.0][:5]
  near = band or sorted(evals, key=lambda s: abs(evals[s]["score_sto"] - 40.0))[:3]
  scored = {s: full_eval(s) for s in near}
  medium = min(scored, key=lambda s: abs(scored[s]["score_sto"] - 40.0))
  top = sorted(evals, key=lambda s: -evals[s]["score_sto"])[:2]
  scored.update({s: full_eval(s) for s in top if s not in scored})
  expert = max(top, key=lambda s: scored[s]["score_sto"])
  upto = [s for s in evals if s <= medium]
  n = min(MAX_REPLAY, len(upto))
  idx = sorted({round(i * (len(upto) - 1) / max(n - 1, 1)) for i in range(n)})  # evenly spaced, both ends
  replay = [upto[i] for i in idx]
  out.mkdir(parents=True, exist_ok=True)
  for old in out.glob("*.npz"):
    old.unlink()
  record = {
    "env": args.env,
    "env_id": pol.ENV_IDS[args.env],
    "train_command": train_command,
    "resume_command": f"nice -n 19 nohup {train_command} >> {args.workdir}/train.log 2>&1 &",
    "export_command": f"python -m experiments.train_behaviour --env={args.env} --workdir={args.workdir} --export",
    "trained_steps": max(evals),
    "evaluation": f"medium, expert: {EXPORT_EPISODES} episodes, env seeds 20000.. (replay: the run-time evaluation);"
    " det = tanh(mean), sto = sampled",
    "policies": {},
    "run_evaluations": [[s, round(e["score_det"], 1), round(e["score_sto"], 1)] for s, e in evals.items()],
    "run_evaluations_columns": ["step", "score_det", "score_sto"],
  }
  roles = [("medium", medium), ("expert", expert)] + [(f"replay_{s:07d}", s) for s in replay]
  for role, step in roles:
    # Replay snapshots keep their run-time evaluation (eval_episodes episodes): they are many and only ordered.
    scores = scored.get(step) or {k: evals[step][k] for k in ("return_det", "score_det", "return_sto", "score_sto")}
    p = pol.load_policy(snap(step))
    meta = {**p.meta, "role": role}
    path = pol.save_policy(out / f"{role}.npz", {k: v for k, v in _arrays(snap(step)).items()}, meta)
    record["policies"][role] = {"file": path.name, "step": step, "sha256": _sha256(path), **scores}
    print(role, step, json.dumps(scores))
  (out / "policies.json").write_text(json.dumps(record, indent=1) + "\n")
  return record


def _arrays(path: Path):
  import numpy as np

  with np.load(path) as z:
    return {k: z[k] for k in z.files if k != "meta"}


def main(argv=None):
  args = parse(argv)
  if args.threads > 0:  # must precede the first jax import
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen={'true' if args.threads > 1 else 'false'}"
  argv = sys.argv[1:] if argv is None else argv
  command = "python -m experiments.train_behaviour " + " ".join(shlex.quote(a) for a in argv if a != "--export")
  if args.export:
    export(args, (Path(args.workdir) / "command.txt").read_text().strip())
    return
  from primal_jax.tasks.offline_rl.behaviour import Trainer

  Path(args.workdir).mkdir(parents=True, exist_ok=True)
  (Path(args.workdir) / "command.txt").write_text(command + "\n")
  trainer = Trainer(_config(args), args.workdir, log=lambda s: print(s, flush=True))
  if args.max_chunks:
    for _ in range(args.max_chunks):
      if trainer.step < trainer.cfg.total_steps:
        trainer.run_chunk()
  else:
    trainer.run()


if __name__ == "__main__":
  main()
