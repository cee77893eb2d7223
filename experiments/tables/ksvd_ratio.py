"""eta x KSVD / task loss of a sweep table's row, from its runs' records (summary `ksvd_ratio`, written by
`primal_jax.training.metrics`): how much the KSVD regulariser weighs in the loss a row was trained on."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from primal_jax import markdown
from primal_jax.atomic_files import read_json


def _ratios(row) -> list[dict]:
  """The `ksvd_ratio` entries of a row's counted runs (runs made before it existed have none)."""
  records = [read_json(Path(source) / "result.json", "a finished run's record") for source in row.sources]
  return [r["summary"]["ksvd_ratio"] for r in records if r["summary"].get("ksvd_ratio")]


def mean_ratio(row, at: str) -> str:
  """Mean over a row's runs of eta x KSVD / task loss at the first ("start") or last ("end") logged step; "-"
  where no run recorded it (runs made before `ksvd_ratio` existed), "(n = k)" where only k did."""
  values = [entry[at]["ratio"] for entry in _ratios(row)]
  if not values:
    return "-"
  return f"{np.mean(values):.3g}" + ("" if len(values) == len(row.sources) else f" (n = {len(values)})")


KSVD_RATIO = "eta x KSVD / task: start / middle / end"  # the header of `ksvd_ratio`'s column


def ksvd_ratio(row) -> str:
  """The weight of the KSVD term in a row's loss, eta x KSVD / task loss, each a mean over its runs at the first,
  middle and last logged steps ("-" at a step not every run recorded: the middle before 2026-12-05); "-" where the row
  has no KSVD term (eta 0) or no runs, 'not recorded' where no counted run recorded it, '(n = k)' where only k did."""
  found = _ratios(row) if row is not None else []
  if not found:
    return "not recorded" if row is not None and row.sources else "-"
  if all(entry["start"]["eta"] == 0 for entry in found):
    return "-"
  means = [[entry[at]["ratio"] for entry in found if at in entry] for at in ("start", "middle", "end")]
  text = " / ".join(f"{np.mean(values):.2g}" if len(values) == len(found) else "-" for values in means)
  return text if len(found) == len(row.sources) else f"{text} (n = {len(found)})"


def release_ratio(name: str, base: Path) -> str:
  """`release_ratio:<name>`: eta x KSVD / task loss in the authors' own UEA PrimalFormer training
  (experiments/results/release_ratio/<name>/ratio.json, `experiments.release_ratio`) at its first, middle and
  last steps, per seed and averaged: the release's counterpart of our records' `ksvd_ratio`."""
  from experiments.tables.common import RESULTS, link

  path = RESULTS / "release_ratio" / name / "ratio.json"
  record = read_json(path, "the release's KSVD ratio record")
  runs, meta = record["runs"], record["meta"]
  counts = {len(run["steps"]) for run in runs}
  if len(counts) != 1:
    raise ValueError(f"{path}: its runs have different step counts {sorted(counts)}")
  steps = counts.pop()
  at = {"step 1": 0, f"step {steps // 2}": steps // 2 - 1, f"step {steps}": steps - 1}
  body = [[str(run["seed"]), *(f"{run['steps'][i]['ratio']:.3g}" for i in at.values())] for run in runs]
  body.append(["mean", *(f"{np.mean([run['steps'][i]['ratio'] for run in runs]):.3g}" for i in at.values())])
  table = markdown.table(["torch seed", *(f"eta x KSVD / task, {k}" for k in at)], body)
  eta = runs[0]["steps"][0]["eta"]
  release = (meta.get("release_commit") or "unknown")[:7]
  return (
    f"{table}\n\nThe release's PrimalFormer (commit {release}), {meta['dataset']}, eta {eta:g}, {meta['epochs']} "
    f"epochs ({steps} steps of batch 16), torch {runs[0]['torch']} on the CPU; {link(path, base)}."
  )
