r"""Uncertainty sweep (issue 56) on Fashion-MNIST (embedded): KEP-SVGP against softmax ViTs and Primal.+ViT.

  python -m experiments.sweep --sweep=experiments/sweeps/uncertainty.py \
    --workdir=$PWD/experiments/results/uncertainty/sweep

Tables:
  models: the four trained models of primal_jax/tasks/uncertainty/config.py (the reduced default: 3 blocks, width
    32, 400 steps), `seeds` seeds each: softmax, Primal.+ViT, KEP-SVGP (paper form), KEP-SVGP (release form).
    Right after each run trains, its uncertainty evaluation (`evaluate_run`, `EVAL`) is written beside its record
    as runs/<key>/uncertainty.json (and that of any finished run of this table still without one: a run finished
    by an earlier, interrupted sweep): softmax runs give MSP, temperature scaling and MC dropout, Primal.+ViT MSP,
    KEP-SVGP runs the posterior predictive (mean probabilities of `EVAL.samples` draws) and the authors' mean-logit
    prediction.
  ensemble_members: the extra softmax models of the deep ensembles, seeds `seeds`, ..., `members * seeds - 1`. The
    ensemble of seed i is the softmax models of seeds i, i + seeds, ..., i + (members - 1) * seeds: seed i's own
    softmax model (the baseline it is paired with) and members - 1 models no other ensemble uses, so the ensembles
    of different seeds are disjoint and the pairing by seed is as honest as for the other methods. Its evaluation
    is written to runs/<key of seed i's softmax run>/ensemble.json once all its members have trained.
The runs are listed seed by seed (a seed's four models, then its extra ensemble members), so a sweep cut short
leaves whole seeds.
Protocol "own_validation": the config's 10% tail of train is the validation split (evaluated once, at the end;
temperature scaling is fitted on it), the test split is evaluated once on the final state.
The docs tables (docs/uncertainty.md) are generated from the committed records by `python -m
experiments.docs_tables` (experiments/tables/uncertainty.py).

Arguments (`--sweep=experiments/sweeps/uncertainty.py:seeds=3,members=2`): seeds (3); members: models per deep
ensemble (2, for the machine's time: see EVAL); smoke: seconds-long runs and a tiny evaluation (tests).
"""

from __future__ import annotations

import functools
from pathlib import Path

from experiments.engine.records import RESULT_FILE
from experiments.engine.spec import Cell, Run, Sweep
from primal_jax.atomic_files import read_json
from primal_jax.tasks.common import parse_config_arg

CONFIG = "uncertainty"  # the packaged config (primal_jax/tasks/uncertainty/config.py), by name
MODELS = (
  ("softmax", "softmax"),
  ("Primal.+ViT", "primal_plus"),
  ("KEP-SVGP (paper form)", "kep_paper"),
  ("KEP-SVGP (release form)", "kep_release"),
)
TITLES = {
  "models": "Fashion-MNIST (embedded data, reduced size): the uncertainty benchmark's models",
  "ensemble_members": "Fashion-MNIST: the deep ensembles' extra softmax members",
}
# The evaluation of the default sweep, cut to what a 2-core machine shared with other jobs evaluates in the time
# (forwards ran at ~200 images/s there): 3 MC-dropout forwards / posterior draws (the authors use 10), the first
# 2,000 test images (failure prediction, calibration and the in-distribution side of OOD), the first 200 of them
# under each of the 25 corruptions x severities (1,000 per severity over the five kinds), the first 1,000
# validation images for the temperature, and the 1,797 OOD digits.
EVAL = dict(samples=3, corruption_examples=200, test_examples=2000, validation_examples=1000)
SMOKE_EVAL = dict(samples=2, corruption_examples=20, test_examples=200, validation_examples=200)


def ensemble_seeds(seed: int, seeds: int, members: int) -> list[int]:
  """The seeds of seed `seed`'s ensemble: its own softmax model and members - 1 extra ones (module doc)."""
  return [seed + seeds * j for j in range(members)]


def evaluate_after_run(run_dir, *, settings: dict, seeds: int, members: int) -> str:
  """`Sweep.after_run` of the models table: the run's uncertainty.json, then any ensemble now complete."""
  from primal_jax.tasks.uncertainty.evaluation import RECORD, EvalSettings, evaluate_run, write_record

  lines = []
  for result in sorted(Path(run_dir).parent.glob(f"*/{RESULT_FILE}")):  # this run and any left unevaluated
    path = result.parent / RECORD
    if path.exists() or not any(r["cell"]["table"] == "models" for r in read_json(result, "a run record")["runs"]):
      continue
    record = evaluate_run(result.parent, EvalSettings(**settings))
    write_record(path, record)
    first = next(iter(record["methods"].values()))["test"]
    lines.append(f"{record['kind']}: {', '.join(record['methods'])} evaluated (test acc {first['acc']:.4f}) in {path}")
  lines += ensembles_after_run(run_dir, settings=settings, seeds=seeds, members=members)
  return "; ".join(lines) or "nothing left to evaluate"


def _softmax_runs(sweep_dir: Path) -> dict[int, Path]:
  """seed -> finished softmax run directory of the sweep."""
  from primal_jax.tasks.uncertainty.evaluation import model_kind
  from primal_jax.training.experiment import load_run_config

  found = {}
  for result in sorted(sweep_dir.glob(f"runs/*/{RESULT_FILE}")):
    config = load_run_config(result.parent)
    if model_kind(config) == "softmax":
      found[int(config.seed)] = result.parent
  return found


def ensembles_after_run(run_dir, *, settings: dict, seeds: int, members: int) -> list[str]:
  """Evaluates every ensemble whose members have all trained and that has no ensemble.json yet; lines saying so."""
  from primal_jax.tasks.uncertainty.evaluation import ENSEMBLE_RECORD, EvalSettings, evaluate_ensemble, write_record

  runs, lines = _softmax_runs(Path(run_dir).parent.parent), []
  for seed in range(seeds):
    wanted = ensemble_seeds(seed, seeds, members)
    if not all(s in runs for s in wanted) or (runs[seed] / ENSEMBLE_RECORD).exists():
      continue
    record = evaluate_ensemble([runs[s] for s in wanted], EvalSettings(**settings))
    path = write_record(runs[seed] / ENSEMBLE_RECORD, record)
    lines.append(f"ensemble of seeds {wanted}: test acc {record['methods']['ensemble']['test']['acc']:.4f} in {path}")
  return lines


def get_sweep(arg: str | None = None) -> Sweep:
  args = parse_config_arg(arg, {"seeds": 3, "members": 2, "smoke": False})
  seeds, members = args["seeds"], args["members"]
  size = ",smoke" if args["smoke"] else ""
  runs = []
  for seed in range(seeds):  # seed by seed: a sweep cut short leaves whole seeds
    runs += [
      Run(f"{CONFIG}:model={model}{size}", Cell("models", (("model", label),)), seed, "own_validation")
      for label, model in MODELS
    ]
    runs += [
      Run(f"{CONFIG}:model=softmax{size}", Cell("ensemble_members", (("model", "softmax"),)), extra, "own_validation")
      for extra in ensemble_seeds(seed, seeds, members)[1:]
    ]
  hooks = dict(settings=SMOKE_EVAL if args["smoke"] else EVAL, seeds=seeds, members=members)
  after_run = {
    "models": functools.partial(evaluate_after_run, **hooks),
    "ensemble_members": lambda run_dir: "; ".join(ensembles_after_run(run_dir, **hooks)) or "no ensemble complete yet",
  }
  notes = (
    f"{'smoke' if args['smoke'] else 'reduced-size'} runs; see experiments/sweeps/uncertainty.py. Values: top-1 test "
    "accuracy (%), 10,000 test images; the uncertainty metrics are in docs/uncertainty.md."
  )
  return Sweep(tuple(runs), titles=TITLES, notes=notes, baselines={"models": ("model", "softmax")}, after_run=after_run)
