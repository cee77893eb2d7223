"""Run one LRA task on its `short` schedule and record the result in experiments/results/lra_short/.

  nice -n 10 python -m experiments.lra_short --task=image --model=primalformer \
    --workdir=/tmp/image_short

runs, as a child process and timed,

  python -m experiments.main --config=lra:task=image,model=primalformer,short \
    --workdir=/tmp/image_short

then writes `experiments/results/lra_short/image_primalformer.json`: the command, the wall time, the steps,
the final, best and test-at-best-validation accuracies, every evaluation, the schedule and data sizes from
the run's config.json, and the machine (CPU count, load average, which tells whether other jobs shared it).
Extra arguments after `--` are passed on to the binary (`-- --config.total_steps=400`) and recorded.
The workdir must be new or empty: a resumed run's wall time would not be the run's.
`--collect_only` writes the JSON of a finished workdir (wall time then comes from metrics.jsonl); the workdir's
config must be the one the recorded command trains (the same task, model, `short` and extra arguments), or
it is refused, naming the keys that differ. A record is never replaced silently: an existing `--out` file is
refused (before any training) unless `--overwrite`; collecting the same record again leaves it as it is.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from experiments.engine.records import existing_record_error, read_jsonl, write_record
from experiments.engine.spec import MAIN_MODULE, main_flags
from primal_jax.atomic_files import read_json
from primal_jax.cli.config_lookup import load_config
from primal_jax.errors import ConfigError
from primal_jax.models.config import stack_name
from primal_jax.training.guards.run_config import differences, flatten, run_config

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results" / "lra_short"


def train_command(task: str, model: str, workdir: str | Path, extra: list[str] | tuple[str, ...] = ()) -> list[str]:
  """argv of the training run (python -m experiments.main with the packaged `lra` config, by name)."""
  return [sys.executable, "-m", MAIN_MODULE, *main_flags(f"lra:task={task},model={model},short", workdir, extra=extra)]


def train_config(task: str, model: str, extra: list[str] | tuple[str, ...] = ()):
  """The config `train_command` trains: the `lra` config's `short` variant with the `--config.*` flags of `extra`
  applied as the binary applies them (ml_collections' config flags)."""
  from absl import flags
  from ml_collections import config_flags

  values, config = flags.FlagValues(), load_config(f"lra:task={task},model={model},short")
  argv = ["lra_short", *(arg for arg in extra if arg.startswith("--config."))]
  try:  # the override flags are defined from the arguments that name them (sys_argv)
    config_flags.DEFINE_config_dict("config", config, flag_values=values, sys_argv=argv)
    values(argv)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as err:
    raise ConfigError(f"extra arguments {argv[1:]}: {err}") from None
  return values["config"].value


def check_workdir_config(workdir: str | Path, task: str, model: str, extra=(), command: str = "") -> None:
  """Refuses a workdir whose run is not the config `train_command(task, model, workdir, extra)` trains: the
  record would name a command that never ran."""
  saved = run_config(workdir)  # config.json with the changes accepted on resume; a damaged file is named
  if saved is None:
    raise ConfigError(f"--workdir {workdir} holds no config.json: not a run of experiments.main")
  expected = flatten(json.loads(json.dumps(train_config(task, model, extra).to_dict())))  # tuples as lists
  changed = differences(saved, expected)
  if changed:
    shown = "; ".join(
      f"{k}: {_brief(v['old'])} in the workdir, {_brief(v['new'])} in the command" for k, v in changed.items()
    )
    raise ConfigError(
      f"--workdir {workdir} is a run of another config than `{command or 'the recorded command'}` "
      f"({len(changed)} key(s) differ: {shown}); collect it with the task, model and extra arguments it was "
      "trained with"
    )


def _brief(value) -> str:
  text = repr(value)
  return text if len(text) <= 40 else text[:37] + "..."


def _same_record(path: Path, record: dict) -> bool:
  """Whether `path` holds `record` but for where and when it was collected (`machine`)."""
  old = read_json(path, "a recorded result")
  strip = lambda r: {k: v for k, v in r.items() if k != "machine"} if isinstance(r, dict) else r  # noqa: E731
  return strip(old) == strip(json.loads(json.dumps(record)))


def collect(
  workdir: str | Path, *, command: str, wall_s: float | None = None, cpu_s: float | None = None
) -> dict[str, Any]:
  """The record of a finished run in `workdir` (summary.json, eval_history.json, config.json, metrics.jsonl).

  `wall_s`: the whole command's wall time (start-up, data and every evaluation included); None takes the
  span of the logged train/eval rows instead, marked as such. `cpu_s`: the command's user + system CPU
  time (on a shared machine, wall_s depends on the other jobs; cpu_s much less so).
  """
  workdir = Path(workdir)
  summary_path = workdir / "summary.json"
  if not summary_path.exists():
    raise FileNotFoundError(f"{summary_path} does not exist: the run did not finish")
  summary = json.loads(summary_path.read_text())
  config = json.loads((workdir / "config.json").read_text())
  history_path = workdir / "eval_history.json"
  history = json.loads(history_path.read_text()) if history_path.exists() else []
  rows = read_jsonl(workdir / "metrics.jsonl")
  train = [r for r in rows if r.get("prefix") == "train"]
  wall_kind = "command"
  if wall_s is None and rows:
    wall_s, wall_kind = rows[-1]["wall_time"] - rows[0]["wall_time"], "logged rows (first to last)"

  def accuracy(entry: dict | None) -> dict | None:
    return {"step": entry["step"], "accuracy": entry["accuracy"]} if entry else None

  final = summary.get("final", {})
  opt, data = config["optimizer"], config["data"]
  return {
    "command": command,
    "task": data["task"],
    "model": stack_name(config["model"]["layers"]),
    "steps": summary.get("steps"),
    "wall_s": None if wall_s is None else round(wall_s, 1),
    "wall_s_measures": wall_kind,
    "cpu_s": None if cpu_s is None else round(cpu_s, 1),
    "num_params": summary.get("num_params"),
    "final": {k: v for k, v in final.items() if k == "step" or k.endswith("/accuracy")},
    "best_validation": accuracy(summary.get("best_validation")),
    "best_test": accuracy(summary.get("best_test")),
    "test_at_best_validation": accuracy(summary.get("test_at_best_validation")),
    "evaluations": [{k: v for k, v in h.items() if k == "step" or k.endswith(("/accuracy", "/loss"))} for h in history],
    "train_loss": [{"step": r["step"], "loss": r["scalars"]["task_loss"]} for r in train],
    "schedule": {
      "batch_size": data["batch_size"],
      "total_steps": config["total_steps"],
      "optimizer": opt["name"],
      "learning_rate": opt["learning_rate"],
      "warmup_steps": opt["warmup_steps"],
      "schedule": opt["schedule"],
      "eval_every_steps": config["eval_every_steps"],
    },
    "data": {k: v for k, v in data.items() if k not in ("task", "batch_size")},
    "model_config": {
      "layers": list(config["model"]["layers"]),
      **{k: config["model"][k] for k in ("dim", "hidden_dim", "num_heads")},
      "low_rank": config["model"]["attention"]["primal"]["low_rank"],
    },
    "eta": config["ksvd"]["eta"],
  }


def machine() -> dict[str, Any]:
  """Where the run ran: CPU count and load average (other jobs on the machine show there), Python, date."""
  import jax

  return {
    "cpus": os.cpu_count(),
    "nice": os.nice(0),
    "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
    "platform": platform.platform(),
    "python": platform.python_version(),
    "jax": jax.__version__,
    "backend": jax.default_backend(),
    "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
  }


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--task", required=True)
  parser.add_argument("--model", default="primalformer")
  parser.add_argument("--workdir", required=True, type=Path)
  parser.add_argument("--out", type=Path, default=None, help="default: results/lra_short/<task>_<model>.json")
  parser.add_argument("--collect_only", action="store_true", help="only write the JSON of a finished workdir")
  parser.add_argument("--overwrite", action="store_true", help="replace an existing --out record")
  parser.add_argument("extra", nargs="*", help="after --: more flags for experiments.main")
  args = parser.parse_args(argv)
  cmd = train_command(args.task, args.model, args.workdir, args.extra)
  shown = shlex.join(["python", *cmd[1:]])
  out = args.out or RESULTS / f"{args.task}_{args.model}.json"
  wall_s = cpu_s = None
  if args.collect_only:
    try:
      check_workdir_config(args.workdir, args.task, args.model, args.extra, shown)
    except (ConfigError, ValueError) as err:  # a damaged config.json is a DamagedFileError naming it
      parser.error(str(err))
  else:
    if refused := existing_record_error(out, args.overwrite):
      parser.error(refused)
    if args.workdir.exists() and any(args.workdir.iterdir()):
      parser.error(f"--workdir {args.workdir} is not empty; use a new one (or --collect_only)")
    load_before = [round(x, 2) for x in os.getloadavg()]
    start, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=ROOT, check=False)
    wall_s = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    if proc.returncode != 0:
      print(f"{shown} exited with {proc.returncode}; nothing recorded", file=sys.stderr)
      return proc.returncode
  try:
    record = collect(args.workdir, command=shown, wall_s=wall_s, cpu_s=cpu_s)
  except FileNotFoundError as err:
    parser.error(str(err))
  if out.exists() and not args.overwrite:
    if _same_record(out, record):
      print(f"{out} already holds this record; left as it is")
      return 0
    parser.error(f"--out {out} holds another record; pass --overwrite to replace it, or another --out")
  record["machine"] = machine()
  if not args.collect_only:
    record["machine"]["load_average_before"] = load_before
  write_record(out, record)
  best = record["test_at_best_validation"] or record["best_test"]
  print(f"wrote {out}: test accuracy at the best validation {best}, {record['steps']} steps, {record['wall_s']} s")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
