"""One tuning protocol for every mechanism (experiments.engine.tuning): each group's value chosen on validation,
only the chosen rows paired, a group with an unfinished value pending; checked on hand-made rows."""

from __future__ import annotations

import dataclasses
import math

import pytest

from experiments.engine.paired import comparisons
from experiments.engine.rows import Cell, Row
from experiments.engine.spec import Run, Sweep
from experiments.engine.tuning import Choice, choose, pilot_skip, tuned_rows
from primal_jax.errors import ConfigError


def _row(model: str, lr: str, tests: dict[int, float], validations: dict[int, float], planned: int = 3) -> Row:
  seeds = tuple(sorted(tests))
  cell = Cell("t", (("model", model), ("lr", lr)))
  return Row(
    cell,
    "rollouts",
    tuple(tests[s] for s in seeds),
    planned=planned,
    wall_seconds=(1.0,) * len(seeds),
    seeds=seeds,
    validations=tuple(validations[s] for s in seeds),
  )


ROWS = [
  # DT: validation 30 at 1e-4, 40 at 1e-3 -> 1e-3 (its test numbers at 1e-4 are higher: they must not choose).
  _row("DT", "1e-4", {0: 50.0, 1: 51.0, 2: 52.0}, {0: 29.0, 1: 30.0, 2: 31.0}),
  _row("DT", "1e-3", {0: 40.0, 1: 41.0, 2: 42.0}, {0: 39.0, 1: 40.0, 2: 41.0}),
  # Primal: 35 at 1e-4 against 34 at 1e-3 -> 1e-4.
  _row("Primal", "1e-4", {0: 44.0, 1: 45.0, 2: 47.0}, {0: 35.0, 1: 35.0, 2: 35.0}),
  _row("Primal", "1e-3", {0: 60.0, 1: 60.0, 2: 60.0}, {0: 34.0, 1: 34.0, 2: 34.0}),
  # Linear: its 1e-3 runs are not all finished -> pending.
  _row("Linear", "1e-4", {0: 40.0, 1: 41.0, 2: 42.0}, {0: 50.0, 1: 50.0, 2: 50.0}),
  _row("Linear", "1e-3", {0: 40.0}, {0: 99.0}),
]


def _sweep(**kwargs) -> Sweep:
  runs = tuple(Run("uea:smoke", row.cell) for row in ROWS)
  return Sweep(runs, baselines={"t": ("model", "DT")}, tuned={"t": "lr"}, **kwargs)


def test_each_group_chooses_its_value_on_mean_validation_not_on_test():
  dt, primal, linear = choose(ROWS, "t", "lr")
  assert (dt.chosen, primal.chosen, linear.chosen) == ("1e-3", "1e-4", None)
  assert dt.tried == (("1e-4", 30.0), ("1e-3", 40.0)) and primal.tried == (("1e-4", 35.0), ("1e-3", 34.0))
  assert dt.row.cell == Cell("t", (("model", "DT"),)) and dt.row.accuracies == (40.0, 41.0, 42.0)
  assert linear.row is None and linear.tried[1] == ("1e-3", 99.0)  # one seed of three: no choice yet
  # Lower is better (bits per byte): the lower mean validation wins.
  assert [c.chosen for c in choose(ROWS, "t", "lr", higher_is_better=False)[:2]] == ["1e-4", "1e-3"]
  # A tie goes to the first value of the grid.
  tie = [dataclasses.replace(ROWS[0], validations=(39.0, 40.0, 41.0)), ROWS[1]]
  assert choose(tie, "t", "lr")[0].chosen == "1e-4"
  # A finished run without a validation value cannot be chosen on: pending.
  blind = [dataclasses.replace(ROWS[0], validations=(29.0, math.nan, 31.0)), ROWS[1]]
  assert choose(blind, "t", "lr")[0].chosen is None


def test_only_the_chosen_rows_are_paired_and_pending_groups_are_left_out():
  """Primal at 1e-4 (44, 45, 47) against DT at 1e-3 (40, 41, 42): differences 4, 4, 5, mean 4.33; Linear is
  pending, so it is not compared at all (not a 0-pair row)."""
  (c,) = comparisons(_sweep(), ROWS, "t")
  assert c.row.cell.labels == (("model", "Primal"),) and c.baseline.cell.labels == (("model", "DT"),)
  assert c.paired.n == 3 and c.paired.mean == pytest.approx(13 / 3)
  kept = tuned_rows(_sweep(), ROWS, "t")
  assert [dict(r.cell.labels) for r in kept] == [{"model": "DT"}, {"model": "Primal"}]


def test_a_sweep_refuses_pairing_on_the_column_it_tunes():
  with pytest.raises(ConfigError, match="table 't' pairs on 'lr', the column it tunes"):
    Sweep((Run("uea:smoke", ROWS[0].cell),), baselines={"t": ("lr", "1e-4")}, tuned={"t": "lr"})


def test_a_pilot_chooses_on_its_seeds_alone_and_the_chosen_row_keeps_every_seed():
  """On seed 0 alone: DT 29 at 1e-4 against 39 at 1e-3 -> 1e-3; Primal 35 against 34 -> 1e-4; Linear 50 against
  99 -> 1e-3 (its one seed is the pilot, so it is no longer pending), its row the one seed it has."""
  dt, primal, linear = choose(ROWS, "t", "lr", pilot=(0,))
  assert dt.tried == (("1e-4", 29.0), ("1e-3", 39.0)) and linear.tried == (("1e-4", 50.0), ("1e-3", 99.0))
  assert (dt.chosen, primal.chosen, linear.chosen) == ("1e-3", "1e-4", "1e-3")
  assert dt.row.accuracies == (40.0, 41.0, 42.0) and linear.row.accuracies == (40.0,)
  # On seeds 1 and 2 Linear's 1e-3 has none: pending, as without a pilot.
  assert choose(ROWS, "t", "lr", pilot=(1, 2))[2].chosen is None
  # Through the sweep: the paired table compares Linear's one seed too.
  linear_pair = comparisons(_sweep(pilot={"t": (0,)}), ROWS, "t")[1]
  assert linear_pair.row.cell.labels == (("model", "Linear"),) and linear_pair.paired.n == 1


def test_a_row_that_learned_at_no_value_of_the_grid_says_so_and_one_that_lapsed_on_a_seed_does_not():
  """Chance 50%, margin 2 (a seed learned iff its best validation is above 52), pilot seed 0. Flat sits at chance at
  both rates, so its verdict names the grid; Lapse learned (seed 0 at 1e-4, chosen) but not on seed 1, so it is
  plain "did not learn"; a reference that learned at no rate makes every comparison name it the same way."""
  rows = [
    _row("DT", "1e-4", {0: 60.0, 1: 61.0, 2: 62.0}, {0: 60.0, 1: 61.0, 2: 62.0}),
    _row("DT", "1e-3", {0: 50.0}, {0: 50.0}),
    _row("Flat", "1e-4", {0: 50.0}, {0: 50.0}),
    _row("Flat", "1e-3", {0: 51.0, 1: 50.0, 2: 52.0}, {0: 51.0, 1: 50.0, 2: 52.0}),  # 52.0 is not above 52
    _row("Lapse", "1e-4", {0: 70.0, 1: 51.0, 2: 70.0}, {0: 70.0, 1: 51.0, 2: 70.0}),
    _row("Lapse", "1e-3", {0: 60.0}, {0: 60.0}),
  ]
  runs = tuple(Run("uea:smoke", row.cell) for row in rows)
  tuned = {"baselines": {"t": ("model", "DT")}, "tuned": {"t": "lr"}, "pilot": {"t": (0,)}}
  sweep = Sweep(runs, chance={"t": 50.0}, **tuned)
  flat, lapse = comparisons(sweep, rows, "t")
  assert (flat.verdict, lapse.verdict) == ("did not learn at any lr tried", "did not learn")
  assert flat.row.accuracies == (51.0, 50.0, 52.0) and math.isnan(flat.p)  # the chosen 1e-3, untested
  assert lapse.row.accuracies == (70.0, 51.0, 70.0) and math.isnan(lapse.p)
  # The reference at chance at both rates: a row that learned on every seed names it, with the grid.
  flat_dt = [dataclasses.replace(rows[0], validations=(50.0, 51.0, 49.0)), rows[1]]
  learner = [dataclasses.replace(rows[4], validations=(70.0, 60.0, 70.0)), rows[5]]
  assert [c.verdict for c in comparisons(sweep, flat_dt + learner, "t")] == ["DT did not learn at any lr tried"]
  # Without a chance level every comparison is tested.
  assert all(not c.verdict.startswith("did not") for c in comparisons(Sweep(runs, **tuned), rows, "t"))


def test_pilot_skip_trains_only_the_pilot_seeds_and_the_chosen_value():
  sweep, P = _sweep(pilot={"t": (0,)}), "rollouts"  # noqa: N806
  choices = {"t": choose(ROWS, "t", "lr", pilot=(0,))}
  dt_1e4, dt_1e3 = (Cell("t", (("model", "DT"), ("lr", lr))) for lr in ("1e-4", "1e-3"))
  assert pilot_skip(sweep, [Run("uea:smoke", dt_1e4, seed=0, protocol=P)], choices.get) is None  # the pilot itself
  assert pilot_skip(sweep, [Run("uea:smoke", dt_1e3, seed=2, protocol=P)], choices.get) is None  # the chosen value
  assert pilot_skip(sweep, [], choices.get) is None  # a planned run with no cells: nothing holds it back, not ""
  why = pilot_skip(sweep, [Run("uea:smoke", dt_1e4, seed=2, protocol=P)], choices.get)
  assert why == "lr 1e-4 not chosen by the pilot of t (1e-3)"
  # A run another table needs is trained whatever the pilot says.
  other = Run("uea:smoke", Cell("u", (("model", "DT"),)), seed=2, protocol=P)
  assert pilot_skip(sweep, [Run("uea:smoke", dt_1e4, seed=2, protocol=P), other], choices.get) is None
  pending = {"t": [Choice((("model", "DT"),), P, (("1e-4", math.nan), ("1e-3", 39.0)), None, None)]}
  waiting = pilot_skip(sweep, [Run("uea:smoke", dt_1e3, seed=1, protocol=P)], pending.get)
  assert waiting == "waiting for the pilot (seeds 0) of t"


def test_a_sweep_refuses_a_pilot_on_an_untuned_table_or_without_seeds():
  with pytest.raises(ConfigError, match="pilot: table 'u' is not tuned"):
    _sweep(pilot={"u": (0,)})
  with pytest.raises(ConfigError, match=r"pilot\['t'\] must be a non-empty tuple of seeds"):
    _sweep(pilot={"t": ()})


def test_d4rl_table4_tuned_reuses_table4_all_and_adds_the_baselines_at_1e_3():
  from experiments.engine.spec import load_sweep, plan, select

  sweep = load_sweep("experiments/sweeps/d4rl.py")
  tuned = select(plan(sweep.runs), ["table4_tuned"])
  assert sweep.tuned == {"table4_tuned": "learning_rate"} and sweep.pilot == {"table4_tuned": (0,)}
  assert len(tuned) == 7 * 2 * 3
  shared = [p for p in tuned if any(r.cell.table == "table4_all" for r in p.runs)]
  assert len(shared) == 27  # 7 mechanisms at their release rate + the two controls, 3 seeds each
  new = [p for p in tuned if p not in shared]
  models = {dict(i.split("=") for i in p.runs[0].config.split(":")[1].split(",") if "=" in i)["model"] for p in new}
  assert {p.config.optimizer.learning_rate for p in new} == {1e-3}
  assert models == {"linear", "reformer", "performer", "cosformer", "flowformer"} and len(new) == 15


def test_a_piloted_docs_table_shows_and_pairs_on_the_every_seed_choice_recomputed_from_the_records():
  """`tuned:` adds what every seed's validation would choose, `@every_seed` pairs on it; both checked against the
  ListOps Linformer records read here with json and numpy (1e-3 is the `listops` table's own rate)."""
  import json
  from pathlib import Path

  import numpy as np

  from experiments.tables.paired_docs import paired_target, tuned_sweep

  by_rate: dict[str, list[float]] = {}
  for path in Path("experiments/results/lra/sweep/runs").glob("*/result.json"):
    record = json.loads(path.read_text())
    labels = dict(record["runs"][0]["cell"]["labels"])
    if record["runs"][0]["cell"]["table"] in ("listops", "listops_tuned") and labels["model"] == "Linformer":
      rate = labels.get("learning_rate", "0.001")
      by_rate.setdefault(rate, []).append(100 * record["summary"]["best_validation"]["accuracy"])
  assert sorted(by_rate) == ["0.001", "0.003"] and all(len(v) == 3 for v in by_rate.values())
  means = {rate: float(np.mean(v)) for rate, v in by_rate.items()}
  best = max(means, key=means.get)
  row = next(line for line in tuned_sweep("lra:listops_tuned", Path(".")).splitlines() if "| Linformer |" in line)
  assert row.split(" | ")[-1] == f"{best} ({means['0.001']:.1f} / {means['0.003']:.1f}) |"

  _, sweep, table = paired_target("d4rl:table4_tuned@every_seed:Primal.+DT")
  assert table == "table4_tuned" and sweep.pilot == {} and sweep.baselines[table] == ("model", "Primal.+DT")
  for bad in ("lra:listops@every_seed", "d4rl:table4_tuned@pilot"):
    with pytest.raises(ValueError, match="only a piloted table takes a suffix, @every_seed"):
      paired_target(bad)
