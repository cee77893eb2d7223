r"""Byte-level language modelling on the embedded Wikipedia text (gensim's enwiki extract): Transformer vs
Primal.+Trans. vs PrimalFormer, the `short` config of the `lm` config (primal_jax/tasks/lm/config.py).

  python -m experiments.sweep --sweep=experiments/sweeps/lm.py --workdir=$PWD/experiments/results/lm/sweep

Tables (`--only=` picks some):
  enwiki: softmax, primal_plus (last layer causal Primal, eta 0.1) and primalformer (every layer Primal),
    `seeds` seeds each.
  eta0: primal_plus and primalformer without the KSVD loss (eta = 0), `seeds` seeds each.
  eta: primal_plus and primalformer at eta 0, the release's 0.1, and the eta where eta x KSVD / task loss is about
    0.1 at step 1 (6e5 and 1e3), `seeds` seeds each, every row paired with eta 0 of its model (lower is better).
    At the release's eta the ratio is 1.5e-8 (primal_plus) and 8.7e-6 (primalformer) at step 1, where it is
    linear in eta: 2-step runs at seed 0, experiments/results/lm/eta_calibration/<model>/summary.json. The
    eta 0 and 0.1 rows are the eta0 and enwiki tables' runs (the same configs, trained once).
The runs go seed by seed (all five settings of seed 0 first), so a partial sweep already compares them.
Protocol "own_validation": validation bits per byte (every 500 steps) selects, test is evaluated once on
that state, over the whole split in contiguous 128-byte windows. The paper's column is the release README's
WikiText-103 test perplexity (word level, 6 layers; Transformer 33.0, Primal.+Trans. 31.0), not comparable
in level: direction only.

Arguments (`--sweep=experiments/sweeps/lm.py:seeds=3`): seeds (3); smoke: seconds-long runs (tests).
"""

from __future__ import annotations

from experiments.engine.spec import Cell, Run, Sweep
from primal_jax.tasks.common import parse_config_arg

CONFIG = "lm"  # the packaged config (primal_jax/tasks/lm/config.py), by name
MODELS = (
  ("Trans. (softmax)", "softmax", 33.0),
  ("Primal.+Trans.", "primal_plus", 31.0),
  ("PrimalFormer", "primalformer", None),
)
TITLES = {
  "enwiki": "Embedded Wikipedia text, byte level: test bits per byte",
  "eta0": "Embedded Wikipedia text, byte level: Primal layers without the KSVD loss",
  "eta": "Embedded Wikipedia text, byte level: the KSVD weight eta, each row against eta = 0 of its model",
}
# The eta table: model= -> the eta whose step-1 ratio eta x KSVD / task is about 0.1 (the release's is 0.1).
ETA_CALIBRATED = {"primal_plus": 6e5, "primalformer": 1e3}
RELEASE_ETA = 0.1
# A paired difference whose 95% interval contains zero and lies within +-0.01 bits per byte reads "level": under
# the seed std of every row of the enwiki table (0.003-0.026, docs/results.md).
LEVEL_MARGIN = 0.01


def get_sweep(arg: str | None = None) -> Sweep:
  args = parse_config_arg(arg, {"seeds": 3, "smoke": False})
  size = "smoke" if args["smoke"] else "short"
  common = {"checkpoint_on_eval": True}

  def run(table, label, model, seed, paper, eta=None):
    labels = (("model", label),) + ((("eta", str(eta)),) if eta is not None else ())
    arg = f"model={model},{size}" + (f",eta={eta}" if eta is not None else "")
    return Run(f"{CONFIG}:{arg}", Cell(table, labels, paper), seed, "own_validation", common)

  runs = []
  for seed in range(args["seeds"]):  # seed by seed: a partial sweep already compares every model
    runs += [run("enwiki", label, model, seed, paper) for label, model, paper in MODELS]
    runs += [run("eta0", label, model, seed, None, eta=0.0) for label, model, _ in MODELS[1:]]
  for seed in range(args["seeds"]):  # after the runs above: its eta 0 and release rows are theirs
    for label, model, _ in MODELS[1:]:
      for eta in (0.0, RELEASE_ETA, ETA_CALIBRATED[model]):
        name = "0" if eta == 0 else f"{eta:g}" + (" (release)" if eta == RELEASE_ETA else "")
        arg = f"model={model},{size}" + (f",eta={eta}" if eta != RELEASE_ETA else "")
        runs.append(
          Run(f"{CONFIG}:{arg}", Cell("eta", (("model", label), ("eta", name))), seed, "own_validation", common)
        )
  notes = (
    f"{size} runs; see experiments/sweeps/lm.py. Values: test bits per byte (lower is better) at the best "
    "validation state; the paper column is the release's WikiText-103 test perplexity (direction only)."
  )
  baselines = {"enwiki": ("model", MODELS[0][0]), "eta": ("eta", "0")}
  return Sweep(
    tuple(runs),
    titles=TITLES,
    notes=notes,
    value_name="Test bits per byte",
    digits=3,
    baselines=baselines,
    higher_is_better=False,
    level_margin=LEVEL_MARGIN,
  )
