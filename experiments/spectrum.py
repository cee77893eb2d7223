r"""Figure 1: singular value spectra of trained runs' attention matrices, over several trained models per arm.

  python -m experiments.spectrum --workdir=/tmp/jv_eta0 --workdir=/tmp/jv_full --workdir=/tmp/jv_softmax \
    --out=/tmp/spectrum --split=test --num_examples=64

  python -m experiments.spectrum --out=/tmp/spectrum --reference=softmax --reference="eta=0" \
    --workdir=/tmp/sm_s0 --label=softmax --workdir=/tmp/sm_s1 --label=softmax --workdir=/tmp/sm_s2 --label=softmax \
    --workdir=/tmp/e0_s0 --label="eta=0" ... --workdir=/tmp/e05_s2 --label="eta=0.5"

For each run (a workdir written by `experiments.main`: its `config.json` and
latest checkpoint) the first `num_examples` real examples of `split` go through
the model once; every Primal layer's induced kernel (Theorem 3.2) and every
softmax layer's attention matrix is rebuilt per example and head, restricted
to the real positions, and decomposed (`primal_jax.analysis.spectrum`).
Runs sharing a `--label` are one arm (models trained with different seeds):
`experiments.spectrum_arms` summarises each arm per layer (block) as mean +- std
over its models, and pairs every other arm by seed against each `--reference`
(default: the first arm; with one model per arm and no `--reference`, or with
`--nopaired`, nothing is paired). Writes to --out:

  explained_variance.png  Figure 1 a-c: cumulative explained variance per layer, one panel per arm (band: std over
                          its models; over examples for an arm of one model)
  normalized_decay.png    Figure 1 d: sigma_i / sigma_1, one panel per layer, arms overlaid (band as above)
  spectrum.json           per run (label, arm, seed, ...) and layer the curves (mean, std over examples) and
                          statistics; `arms`: the per-arm summary and the paired differences
  singular_values.npz     raw singular values, key "<run index>/<layer path>" -> [examples, heads, K] (computed
                          runs only)

Each computed run's entry is also kept in its own workdir (spectrum_<split>_<num_examples>.json,
`experiments.spectrum_store`; committed with a sweep's run records): a later call reads it where the checkpoint
is gone, as long as it still describes the run (same config, same checkpoint step). `--nostore` turns this off.
It prints tables of the components needed for 90% / 99% of the energy per
run and per arm, and the paired differences (smaller = sharper decay, the
paper's low-rank claim).
"""

from __future__ import annotations

import json
import operator
import sys
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np

from experiments import spectrum_store
from experiments.spectrum_arms import (
  PairingError,
  arm_rows,
  arms_section,
  check_plan,
  comparison_rows,
  curve_over_models,
  group_arms,
  layers_by_block,
)
from experiments.spectrum_store import MissingRunError
from primal_jax.analysis.spectrum import (
  SPECTRUM_COLLECTION,
  LayerSpectrum,
  collect_matrices,
)
from primal_jax.models.config import stack_name
from primal_jax.provenance import provenance


def run_label(config) -> str:
  """The legend label: "softmax", or "<model> eta=<eta>" (what distinguishes the runs of Figure 1)."""
  model = stack_name(config.model.layers)
  if "primal" not in config.model.layers:
    return model
  return f"{model} eta={config.ksvd.get('eta', 0.0):g}"


def _real_examples(batches, num_examples: int):
  """Yields real (weight > 0) rows of the eval batches until `num_examples` were given."""
  given = 0
  for batch in batches:
    keep = np.flatnonzero(np.asarray(batch["weight"]) > 0)[: num_examples - given]
    if keep.size:
      given += keep.size
      yield {k: np.asarray(v)[keep] for k, v in batch.items()}
    if given >= num_examples:
      return


def compute_spectra(experiment, state, split: str, num_examples: int, chunk_size: int = 16) -> list[LayerSpectrum]:
  """Per-layer spectra of `state` on the first `num_examples` real examples of `split`.

  Chunks are padded to `chunk_size` rows (repeating the last row, then
  dropped) so the forward pass compiles once.
  """
  built = experiment.built
  mask_keys = [k for k in built.input_keys if k.startswith("mask")]
  variables = {"params": state.params, **state.model_state}

  @jax.jit
  def forward(variables, inputs):
    # Every Primal/softmax layer sows its own matrix when this collection is mutable.
    _, sown = built.module.apply(variables, *inputs, deterministic=True, mutable=[SPECTRUM_COLLECTION])
    return sown[SPECTRUM_COLLECTION]

  chunk_size = min(chunk_size, num_examples)
  parts: dict[str, list[LayerSpectrum]] = {}
  for batch in _real_examples(experiment.pipeline.eval_batches(split), num_examples):
    for start in range(0, len(batch["weight"]), chunk_size):
      rows = {k: v[start : start + chunk_size] for k, v in batch.items()}
      size = len(rows["weight"])
      pad = np.minimum(np.arange(chunk_size), size - 1)
      inputs = [rows[k][pad] for k in built.input_keys]
      sown = jax.device_get(forward(variables, inputs))
      sown = jax.tree.map(operator.itemgetter(slice(0, size)), sown)  # drop the padding rows
      valid = [rows[k].astype(bool) for k in mask_keys] or None
      for layer in collect_matrices(sown, valid if valid is None or len(valid) > 1 else valid[0]):
        parts.setdefault(layer.name, []).append(LayerSpectrum.from_matrices(layer))
  if not parts:
    raise ValueError(f"no Primal or softmax attention layer (or no example in split {split!r}) to analyse")
  return [LayerSpectrum.concatenate(p) for p in parts.values()]


def computed_run(config, workdir, split: str, num_examples: int, chunk_size: int, step: int | None = None):
  """(entry, spectra) of the run in `workdir` from its checkpoint (`step`, default the latest): the entry of
  spectrum.json's runs without what one analysis gives it (label, arm, workdir, source)."""
  from primal_jax.training.experiment import load_state

  experiment, state = load_state(config, workdir, step=step)
  spectra = compute_spectra(experiment, state, split, num_examples, chunk_size)
  entry = {
    "seed": int(config.seed),
    "step": int(jax.device_get(state.step)),
    "family": stack_name(config.model.layers),
    "eta": float(config.ksvd.get("eta", 0.0)),
    "layers": [s.summary() for s in spectra],
  }
  return entry, spectra


def store_run_spectrum(workdir, *, split: str = "test", num_examples: int = 64, chunk_size: int = 16) -> str:
  """Computes the spectrum of the run in `workdir` and keeps it there (`experiments.spectrum_store`), unless a
  stored one still describes the run; returns what it did, in one line. A sweep's `after_run` for Figure 1's
  arms: the spectrum is taken while the checkpoint is there and committed with the run's record."""
  from primal_jax.training.experiment import load_run_config

  path = spectrum_store.store_path(workdir, split, num_examples)
  if spectrum_store.load_stored(workdir, split, num_examples) is not None:
    return f"spectrum already stored in {path}"
  config = load_run_config(workdir)
  entry, spectra = computed_run(config, workdir, split, num_examples, chunk_size)
  spectrum_store.save(workdir, split, num_examples, entry, default_label=run_label(config))
  k90 = ", ".join(f"{s['stats']['components_90']['mean']:.2f}" for s in entry["layers"])
  return f"spectrum of {num_examples} {split} examples at step {entry['step']} in {path} (k90 per layer: {k90})"


def _x_limit(curves: Sequence[np.ndarray], done) -> float:
  """Right edge of a panel: just past the last component index where any curve is still changing
  (saturated tails would otherwise squeeze the informative first components into the left edge)."""
  last = max(int(np.argmax(done(c))) + 1 if np.any(done(c)) else c.size for c in curves)
  return min(max(last + 2, 5), max(c.size for c in curves)) + 0.5


def arm_curves(runs: Sequence[dict], key: str, pad: float) -> dict[str, dict[str, dict]]:
  """arm -> block -> {"kind", "n", "mean", "std"} of the curve `key` ("explained_variance" / "normalized_decay"):
  with several models the mean and std over the models' mean curves, with one its mean and std over examples."""
  out: dict[str, dict[str, dict]] = {}
  for arm, members in group_arms(runs).items():
    blocks: dict[str, list[dict]] = {}
    for run in members:
      for block, layer in layers_by_block(run).items():
        blocks.setdefault(block, []).append(layer)
    out[arm] = {}
    for block, layers in blocks.items():
      if len(layers) == 1:
        mean, std = (np.asarray(layers[0][key][part]) for part in ("mean", "std"))
      else:
        mean, std = curve_over_models([layer[key]["mean"] for layer in layers], pad)
      out[arm][block] = {"kind": layers[0]["kind"], "n": len(layers), "mean": mean, "std": std}
  return out


def _band(ax, mean: np.ndarray, std: np.ndarray, label: str, alpha: float) -> None:
  k = np.arange(1, mean.size + 1)
  (line,) = ax.plot(k, mean, label=label)
  ax.fill_between(k, np.clip(mean - std, 0, 1), np.clip(mean + std, 0, 1), color=line.get_color(), alpha=alpha)


def _models(n: int) -> str:
  return "1 model, band: std over examples" if n == 1 else f"{n} models, band: std over models"


def plot_explained_variance(runs: Sequence[dict], path: Path) -> None:
  """Figure 1 a-c: one panel per arm, one curve per layer (block): mean +- std over the arm's models (over the
  examples where the arm has one model)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  arms = arm_curves(runs, "explained_variance", pad=1.0)
  fig, axes = plt.subplots(1, len(arms), figsize=(4.2 * len(arms), 3.4), squeeze=False, sharey=True)
  for ax, (arm, blocks) in zip(axes[0], arms.items(), strict=True):
    for block, curve in blocks.items():
      _band(ax, curve["mean"], curve["std"], f"{block} ({curve['kind']})", alpha=0.2)
    n = max(curve["n"] for curve in blocks.values())
    ax.set_title(f"{arm}\n({_models(n)})", fontsize=9)
    ax.set_xlabel("number of components")
    ax.set_xlim(0.5, _x_limit([curve["mean"] for curve in blocks.values()], lambda c: c >= 0.9999))
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
  axes[0, 0].set_ylabel("cumulative explained variance")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_normalized_decay(runs: Sequence[dict], path: Path) -> None:
  """Figure 1 d: one panel per layer (block), one curve per arm (mean +- std over its models, as above)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  arms = arm_curves(runs, "normalized_decay", pad=0.0)
  blocks = list(dict.fromkeys(block for curves in arms.values() for block in curves))
  fig, axes = plt.subplots(1, len(blocks), figsize=(4.2 * len(blocks), 3.4), squeeze=False, sharey=True)
  for ax, block in zip(axes[0], blocks, strict=True):
    curves = []
    for arm, by_block in arms.items():
      if (curve := by_block.get(block)) is not None:
        _band(ax, curve["mean"], curve["std"], f"{arm} ({curve['kind']}, n={curve['n']})", alpha=0.15)
        curves.append(curve["mean"])
    ax.set_title(block, fontsize=10)
    ax.set_xlabel("singular value index i")
    ax.set_xlim(0.5, _x_limit(curves, lambda c: c <= 0.005))
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
  axes[0, 0].set_ylabel(r"$\sigma_i / \sigma_1$")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def analyze(
  workdirs: Sequence[str],
  out: str | Path,
  *,
  split: str = "test",
  num_examples: int = 64,
  chunk_size: int = 16,
  labels: Sequence[str] = (),
  data_dir: str | None = None,
  step: int | None = None,
  references: Sequence[str] | None = (),
  store: bool = True,
  print_fn=print,
) -> dict:
  """Spectra of every run in `workdirs`; writes the figures, JSON and NPZ to `out`; returns the JSON dict.

  Runs sharing a label form an arm (`experiments.spectrum_arms`); with `references` (empty: the first arm; None: no
  pairing; empty with one model per arm: none either) every other arm is paired by seed against each of them.
  What cannot be paired as asked (an arm of one model beside arms of several, seeds that differ) refuses
  (`PairingError`) before any spectrum is computed. With `store` each computed run's spectrum is kept in its
  workdir (that of its latest checkpoint: none with `step`) and a stored one that still describes the run is read
  instead of its checkpoint (`experiments.spectrum_store`; its run entry says "source": "stored";
  singular_values.npz holds only the computed runs); a run with neither refuses (`MissingRunError`), before
  anything is computed.
  """
  from primal_jax.training.experiment import load_run_config
  from primal_jax.training.metrics import summary_table

  if labels and len(labels) != len(workdirs):
    raise ValueError(f"{len(labels)} labels for {len(workdirs)} workdirs")
  if num_examples <= 0 or chunk_size <= 0:
    raise ValueError(f"num_examples and chunk_size must be > 0, got {num_examples}, {chunk_size}")
  stored = [spectrum_store.load_stored(w, split, num_examples, step) if store else None for w in workdirs]
  for workdir, kept in zip(workdirs, stored, strict=True):
    if kept is None and not (Path(workdir) / "config.json").exists():
      at = "" if step is None else f" at step {step}"
      raise MissingRunError(
        f"--workdir={workdir}: no config.json (a trained run) and no stored spectrum of split {split!r}, "
        f"{num_examples} examples{at} ({spectrum_store.store_path(workdir, split, num_examples).name})"
      )
  configs = [load_run_config(w, data_dir) if kept is None else None for w, kept in zip(workdirs, stored, strict=True)]
  arm_labels = list(labels) or [
    kept["default_label"] if config is None else run_label(config) for config, kept in zip(configs, stored, strict=True)
  ]
  seeds: dict[str, list] = {arm: [] for arm in arm_labels}
  for arm, config, kept in zip(arm_labels, configs, stored, strict=True):
    seeds[arm].append(int(kept["seed"] if config is None else config.seed))
  if references == () and all(len(found) == 1 for found in seeds.values()):
    references = None  # one model per arm and no --reference asked for: nothing to pair (Figure 1 on single runs)
  if references is not None:
    check_plan(seeds, references)
  out = Path(out)
  out.mkdir(parents=True, exist_ok=True)
  runs, arrays = [], {}
  for i, (workdir, config, kept, label) in enumerate(zip(workdirs, configs, stored, arm_labels, strict=True)):
    if kept is not None:
      entry = {k: v for k, v in kept.items() if k not in ("default_label", "config_hash")}
      runs.append({"label": label, "arm": label, **entry, "workdir": str(workdir), "source": "stored"})
      name = spectrum_store.store_path(workdir, split, num_examples).name
      print_fn(f"{label}: {workdir} step {entry['step']}, stored spectrum ({name})")
      continue
    entry, spectra = computed_run(config, workdir, split, num_examples, chunk_size, step)
    runs.append({"label": label, "arm": label, **entry, "workdir": str(workdir), "source": "computed"})
    arrays.update({f"{i}/{s.name}": s.singular_values for s in spectra})
    if store and step is None:  # only the latest checkpoint's: a run without checkpoints then shows its last state
      spectrum_store.save(workdir, split, num_examples, entry, default_label=run_label(config))
    print_fn(f"{label}: {workdir} step {entry['step']}, {spectra[0].singular_values.shape[0]} {split} examples")
  result = {"split": split, "num_examples": num_examples, "runs": runs, "arms": arms_section(runs, references)}
  result["provenance"] = provenance()  # commit, argv, date, devices and library versions of this analysis
  (out / "spectrum.json").write_text(json.dumps(result, indent=1))
  np.savez_compressed(out / "singular_values.npz", **arrays)
  plot_explained_variance(runs, out / "explained_variance.png")
  plot_normalized_decay(runs, out / "normalized_decay.png")
  columns = ["run", "layer", "kind", "k90", "k99", "decay_area", "stable_rank", "length"]
  print_fn(summary_table(comparison_rows(runs), columns))
  print_fn(summary_table(arm_rows(result["arms"]), ["arm", "layer", "kind", "n", "seeds", "k90", "k99"]))
  if result["arms"]["paired"]:
    paired_columns = ["arm", "reference", "layer", "stat", "n", "mean", "low", "high", "verdict"]
    print_fn(summary_table(result["arms"]["paired"], paired_columns))
  return result


def main(argv: Sequence[str] | None = None) -> None:
  """Parses the flags (on a private FlagValues, so main can run more than once in a process) and runs `analyze`."""
  from absl import flags

  fv = flags.FlagValues()
  on = {"flag_values": fv}
  flags.DEFINE_multi_string("workdir", None, "Run directory (config.json, checkpoints/); repeat to compare.", **on)
  flags.DEFINE_string("out", None, "Output directory: PNGs, spectrum.json, singular_values.npz.", **on)
  flags.DEFINE_string("split", "test", "Evaluation split to take the examples from.", **on)
  flags.DEFINE_integer("num_examples", 64, "Number of real examples (the first of the split).", **on)
  flags.DEFINE_integer("chunk_size", 16, "Examples per forward pass (bounds the B x H x N x N memory).", **on)
  flags.DEFINE_multi_string("label", [], "Legend label per --workdir (default: family and eta).", **on)
  flags.DEFINE_string("data_dir", None, "Override config.data.data_dir (e.g. data prepared elsewhere).", **on)
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).", **on)
  flags.DEFINE_multi_string(
    "reference",
    [],
    "Arm (label) every other arm is paired against by seed; repeat for several (default: the first).",
    **on,
  )
  flags.DEFINE_boolean(
    "paired",
    True,
    "Pair the arms by seed (each needs >= 2 models, the same seeds; with one model per arm and no --reference "
    "nothing is paired); --nopaired: never pair.",
    **on,
  )
  flags.DEFINE_boolean(
    "store",
    True,
    "Keep each computed run's spectrum in its workdir (spectrum_<split>_<num_examples>.json) and read a stored one "
    "that still matches the run instead of its checkpoint; --nostore: always compute, write nothing there.",
    **on,
  )
  flags.mark_flags_as_required(["workdir", "out"], flag_values=fv)
  argv = list(sys.argv if argv is None else argv)
  try:
    rest = fv(argv)
  except flags.Error as err:
    sys.stderr.write(f"FATAL Flags parsing error: {err}\nPass --helpshort to see help on flags.\n")
    sys.exit(2)
  if len(rest) > 1:
    sys.stderr.write(f"FATAL unexpected positional arguments: {rest[1:]}\n")
    sys.exit(2)
  if fv.reference and not fv.paired:
    sys.stderr.write("FATAL --reference asks for pairing: drop --nopaired\n")
    sys.exit(2)
  try:
    _analyze_from_flags(fv)
  except (PairingError, MissingRunError) as err:  # what cannot be analysed as asked: one line naming the argument
    sys.stderr.write(f"FATAL {err}\n")
    sys.exit(2)


def _analyze_from_flags(fv) -> None:
  analyze(
    fv.workdir,
    fv.out,
    split=fv.split,
    num_examples=fv.num_examples,
    chunk_size=fv.chunk_size,
    labels=fv.label,
    data_dir=fv.data_dir,
    step=fv.step,
    references=fv.reference if fv.paired else None,
    store=fv.store,
  )


if __name__ == "__main__":
  main()
