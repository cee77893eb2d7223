"""Figure 1 over several trained models per arm: per-layer mean ± std over models and paired differences by seed.

An arm is the runs of `experiments.spectrum` that share a label (e.g. three `--workdir`s labelled "softmax", trained
with seeds 0, 1, 2). A model's value of a statistic in a layer is its mean over examples (`components_90`,
`components_99` of `LayerSpectrum.summary`); layers are matched by block ("encoder/block_1/attention" -> "block_1").
Per arm and layer: the number of models, the mean and sample std (ddof=1, None below 2 models) of the models' values,
and their seeds. Against a reference arm, each other arm's values are paired by seed
(`experiments.engine.stats.paired_difference`: arm - reference, Student-t 95% interval, verdict "lower" = fewer
components than the reference). Pairing refuses (ValueError, one line naming the argument) an arm with fewer than 2
models, a run without a seed, a seed twice in an arm, or seeds that differ from the reference's, rather than give NaN.

Pure functions on the run dicts of spectrum.json (no JAX): `experiments.spectrum` calls them, tests feed them
hand-made runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from experiments.engine.stats import paired_difference

STATS = ("components_90", "components_99")  # the statistics summarised and paired
CONFIDENCE = 0.95


class PairingError(ValueError):
  """Arms that cannot be summarised or paired as asked; its message is one line naming the argument to change."""


def block_of(name: str) -> str:
  """The block of a layer path ("encoder/block_1/attention" -> "block_1"); the path itself if it names none."""
  parts = [p for p in name.split("/") if p.startswith("block_")]
  return parts[-1] if parts else name


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
  """Mean and sample standard deviation (ddof=1) of `values`; std None below 2 values (never NaN)."""
  x = np.asarray(values, dtype=np.float64)
  if x.size == 0:
    raise ValueError("mean_std of no values")
  return float(x.mean()), (float(x.std(ddof=1)) if x.size > 1 else None)


def layers_by_block(run: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
  """block -> layer of a run; where two of its layers share a block (self- and cross-attention, say) those two keep
  their full paths, so nothing is merged."""
  blocks = [block_of(layer["name"]) for layer in run["layers"]]
  return {
    block if blocks.count(block) == 1 else layer["name"]: layer
    for block, layer in zip(blocks, run["layers"], strict=True)
  }


def group_arms(runs: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
  """arm -> its runs, arms in the order they first appear (a run's arm is its `arm`, else its `label`)."""
  arms: dict[str, list[Mapping[str, Any]]] = {}
  for run in runs:
    arms.setdefault(run.get("arm", run["label"]), []).append(run)
  return arms


def summarize_arms(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
  """arm -> block -> {"kind", "n", "seeds", and per statistic {"mean", "std", "values"}} over the arm's models.

  `seeds[i]` is the seed of the model whose value is `values[i]` (None where a run recorded none). A block's
  models must agree on its kind (softmax / primal): a mislabelled run refuses rather than mixing them.
  """
  out: dict[str, dict[str, dict[str, Any]]] = {}
  for arm, members in group_arms(runs).items():
    per_block: dict[str, list[tuple[Any, Mapping[str, Any]]]] = {}
    for run in members:
      for block, layer in layers_by_block(run).items():
        per_block.setdefault(block, []).append((run.get("seed"), layer))
    out[arm] = {}
    for block, entries in per_block.items():
      kinds = sorted({layer["kind"] for _, layer in entries})
      if len(kinds) > 1:
        raise PairingError(
          f"--label={arm}: its models differ in {block}'s kind ({', '.join(kinds)}); one arm, one model"
        )
      summary: dict[str, Any] = {"kind": kinds[0], "n": len(entries), "seeds": [seed for seed, _ in entries]}
      for stat in STATS:
        values = [float(layer["stats"][stat]["mean"]) for _, layer in entries]
        mean, std = mean_std(values)
        summary[stat] = {"mean": mean, "std": std, "values": values}
      out[arm][block] = summary
  return out


def _by_seed(summary: Mapping[str, Any], stat: str) -> dict[int, float]:
  """seed -> value of one arm's block (its seeds checked by `check_seeds`)."""
  return {int(seed): value for seed, value in zip(summary["seeds"], summary[stat]["values"], strict=True)}


def check_seeds(seeds: Mapping[str, Sequence[int | None]], reference: str, where: str = "") -> None:
  """Refuses (ValueError, one line naming the argument) arms (arm -> its models' seeds) that cannot be paired by seed
  against `reference`: an unknown reference, an arm with fewer than 2 models, a missing or repeated seed, or seeds
  that are not the reference's. `where` (" in block_1") places the message."""
  if reference not in seeds:
    raise PairingError(f"--reference={reference}: no such arm (arms: {', '.join(seeds)})")
  for arm, mine in seeds.items():
    if len(mine) < 2:
      raise PairingError(
        f"--label={arm}: {len(mine)} model(s){where}; paired differences need at least 2 per arm "
        "(add --workdir/--label pairs, or pass --nopaired)"
      )
    if any(seed is None for seed in mine):
      raise PairingError(f"--label={arm}: a run records no seed{where}; paired differences pair by seed")
    if len(set(mine)) < len(mine):
      raise PairingError(f"--label={arm}: a seed twice{where} ({sorted(mine)}); pairing needs each seed once per arm")
  for arm, mine in seeds.items():
    if sorted(mine) != sorted(seeds[reference]):
      raise PairingError(
        f"--reference={reference}: arm {arm!r} has seeds {sorted(mine)}{where}, the reference "
        f"{sorted(seeds[reference])}; paired differences need the same seeds"
      )


def check_plan(seeds: Mapping[str, Sequence[int | None]], references: Sequence[str]) -> None:
  """Before any spectrum is computed: the arms (arm -> its models' seeds, from their configs) can be paired against
  `references` (empty: the first arm). An unknown reference always refuses; a single arm has nothing to pair."""
  for reference in references or list(seeds)[:1]:
    if reference not in seeds:
      raise PairingError(f"--reference={reference}: no such arm (arms: {', '.join(seeds)})")
    if len(seeds) > 1:
      check_seeds(seeds, reference)


def check_pairable(arms: Mapping[str, Mapping[str, Mapping[str, Any]]], reference: str) -> None:
  """`check_seeds` per block of the reference, over the arms that have that block."""
  if reference not in arms:
    raise PairingError(f"--reference={reference}: no such arm (arms: {', '.join(arms)})")
  for block in arms[reference]:
    seeds = {arm: blocks[block]["seeds"] for arm, blocks in arms.items() if block in blocks}
    check_seeds(seeds, reference, f" in {block}")


def paired_differences(
  arms: Mapping[str, Mapping[str, Mapping[str, Any]]], references: Sequence[str]
) -> list[dict[str, Any]]:
  """Every arm against every reference (arm - reference, paired by seed), per block both have and statistic.

  A pair already compared the other way round (both are references) is left out. Each entry: "arm", "reference",
  "layer", "stat", and `Paired`'s n, mean, std, low, high (the 95% interval) and verdict.
  """
  out, done = [], set()
  for reference in references:
    check_pairable(arms, reference)
    for arm, blocks in arms.items():
      if arm == reference or (reference, arm) in done:
        continue
      done.add((arm, reference))
      for block, summary in blocks.items():
        if block not in arms[reference]:
          continue
        for stat in STATS:
          p = paired_difference(
            _by_seed(summary, stat),
            _by_seed(arms[reference][block], stat),
            confidence=CONFIDENCE,
          )
          entry = {"arm": arm, "reference": reference, "layer": block, "stat": stat}
          out.append(entry | {k: getattr(p, k) for k in ("n", "mean", "std", "low", "high", "verdict")})
  return out


def arms_section(runs: Sequence[Mapping[str, Any]], references: Sequence[str] | None) -> dict[str, Any]:
  """The `arms` section of spectrum.json: the per-arm summary, and with `references` (None: no pairing; empty:
  the first arm) the paired differences. A single arm has nothing to pair with (an empty list)."""
  arms = summarize_arms(runs)
  section: dict[str, Any] = {"summary": arms, "confidence": CONFIDENCE, "references": None, "paired": None}
  if references is None:
    return section
  references = list(references) or [next(iter(arms))]
  if len(arms) < 2:  # nothing to pair with; an unknown name still refuses
    check_plan(dict.fromkeys(arms, ()), references)
    section.update(references=references, paired=[])
    return section
  section.update(references=references, paired=paired_differences(arms, references))
  return section


def curve_over_models(curves: Sequence[Sequence[float]], pad: float) -> tuple[np.ndarray, np.ndarray]:
  """Mean and sample std (ddof=1; zeros for one curve) over models of per-model curves, the shorter ones extended
  with `pad` (1 for cumulative explained variance, 0 for the normalised decay: past a model's longest sequence)."""
  size = max(len(c) for c in curves)
  stacked = np.full((len(curves), size), pad, dtype=np.float64)
  for i, c in enumerate(curves):
    stacked[i, : len(c)] = c
  std = stacked.std(axis=0, ddof=1) if len(curves) > 1 else np.zeros(size)
  return stacked.mean(axis=0), std


def comparison_rows(runs: Sequence[dict]) -> list[dict[str, Any]]:
  """One table row per (run, layer): components for 90% / 99% energy and the decay statistics (means)."""
  rows = []
  for run in runs:
    for layer in run["layers"]:
      stats = layer["stats"]
      rows.append(
        {
          "run": run["label"],
          "layer": block_of(layer["name"]),
          "kind": layer["kind"],
          "k90": stats["components_90"]["mean"],
          "k99": stats["components_99"]["mean"],
          "decay_area": stats["decay_area"]["mean"],
          "stable_rank": stats["stable_rank"]["mean"],
          "length": layer["length"]["mean"],
        }
      )
  return rows


def arm_rows(section: dict) -> list[dict[str, Any]]:
  """One printed row per (arm, layer): models, seeds and components for 90% / 99% as mean +- std over models."""
  rows = []
  for arm, blocks in section["summary"].items():
    for block, s in blocks.items():
      k90, k99 = (_mean_std_text(s[stat]) for stat in ("components_90", "components_99"))
      seeds = ",".join("-" if seed is None else str(seed) for seed in s["seeds"])
      rows.append({"arm": arm, "layer": block, "kind": s["kind"], "n": s["n"], "seeds": seeds, "k90": k90, "k99": k99})
  return rows


def _mean_std_text(stat: dict) -> str:
  return f"{stat['mean']:.2f}" if stat["std"] is None else f"{stat['mean']:.2f} +- {stat['std']:.2f}"
