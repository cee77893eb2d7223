"""The paired-difference tables (experiments.engine.paired): results.md / paired.csv of a sweep with baselines, and
the docs table `paired:<family>:<table>`, checked against numbers computed here from the written records."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math

import numpy as np
import pytest

from experiments.engine.aggregate import Row, results_markdown, stored_rows, write_results
from experiments.engine.paired import by_seed, comparisons, paired_table
from experiments.engine.records import RESULT_FILE
from experiments.engine.spec import Cell, Run, Sweep, plan
from primal_jax.errors import ConfigError

T_975_2 = 4.302652729749464  # Student t, 97.5% quantile, 2 degrees of freedom (tables: 4.303)
BASE = Cell("t", (("dataset", "D"), ("model", "Trans.")), 90.0)
PRIMAL = Cell("t", (("dataset", "D"), ("model", "Primal")))
OTHER = Cell("u", (("model", "Trans."),))  # a table without a baseline: no paired section


def test_write_results_pairs_a_row_with_its_baseline_by_seed(tmp_path):
  runs = [Run("uea:model=softmax,smoke", BASE, seed=s) for s in range(3)]
  runs += [Run("uea:smoke", PRIMAL, seed=s) for s in range(3)]
  runs += [Run("uea:smoke", OTHER, seed=s, overrides={"ksvd.eta": 0.3}) for s in range(3)]
  sweep = Sweep(tuple(runs), titles={"t": "Table T"}, baselines={"t": ("model", "Trans.")})
  accuracy = {(BASE, 0): 0.80, (BASE, 1): 0.82, (BASE, 2): 0.78, (PRIMAL, 0): 0.83, (PRIMAL, 1): 0.86}
  accuracy[(PRIMAL, 2)] = 0.80
  for key, planned in plan(sweep.runs).items():
    run = planned.runs[0]
    summary = {"best_test": {"step": 1, "accuracy": accuracy.get((run.cell, run.seed), 0.5)}}
    (tmp_path / "runs" / key).mkdir(parents=True)
    entries = [{"cell": dataclasses.asdict(r.cell), "seed": r.seed, "protocol": r.protocol} for r in planned.runs]
    record = {"key": key, "wall_seconds": 1.0, "runs": entries, "summary": summary}
    (tmp_path / "runs" / key / RESULT_FILE).write_text(json.dumps(record))
  rows = write_results(sweep, tmp_path)
  primal = next(row for row in rows if row.cell == PRIMAL)
  assert primal.seeds == (0, 1, 2)

  differences = np.array([100 * (accuracy[(PRIMAL, s)] - accuracy[(BASE, s)]) for s in range(3)])  # 3, 4, 2
  mean, std = differences.mean(), differences.std(ddof=1)
  half = T_975_2 * std / np.sqrt(3)
  assert (mean, std) == (pytest.approx(3.0), pytest.approx(1.0))
  markdown = (tmp_path / "results.md").read_text()
  section = markdown.split("### Table T")[1].split("###")[0]
  assert "Paired differences vs model=Trans.:" in section
  interval = f"[+{mean - half:.1f}, +{mean + half:.1f}]"  # one comparison: Holm's interval is the raw one
  assert f"| D | Primal | Trans. | 3 | +{mean:.1f} | {std:.1f} | {interval} | {interval} | 0.035 | better |" in section
  # The same by hand: t = 3 / (1 / sqrt 3) = 5.196 on 2 df, two-sided p = 0.0351.
  assert "| D | Primal | Trans. | 3 | +3.0 | 1.0 | [+0.5, +5.5] | [+0.5, +5.5] | 0.035 | better |" in section
  assert "Higher is better here." in section and "nothing is called level" in section
  assert markdown.count("Paired differences") == 1  # table u has no baseline

  (line,) = csv.DictReader(io.StringIO((tmp_path / "paired.csv").read_text()))
  assert (line["table"], line["dataset"], line["model"], line["protocol"]) == ("t", "D", "Primal", "release")
  assert (line["baseline"], line["n"], line["verdict"], line["seeds"]) == ("model=Trans.", "3", "better", "0;1;2")
  assert (float(line["p"]), float(line["p_holm"]), line["raw_verdict"]) == (pytest.approx(0.03510, abs=5e-5),) * 2 + (
    "better",
  )
  numbers = [float(line[k]) for k in ("mean", "std", "low", "high")]
  assert numbers == pytest.approx([mean, std, mean - half, mean + half], abs=1e-4)
  assert stored_rows(tmp_path)[1].seeds == (0, 1, 2)  # the docs tables' rows carry their seeds too


def _row(cell, values: dict[int, float], protocol="release") -> Row:
  seeds = tuple(sorted(values))
  accuracies = tuple(values[s] for s in seeds)
  return Row(cell, protocol, accuracies, planned=len(seeds), wall_seconds=(1.0,) * len(seeds), seeds=seeds)


def _sweep(cells, **kwargs) -> Sweep:
  return Sweep(tuple(Run("uea:smoke", cell) for cell in cells), baselines={"t": ("model", "Trans.")}, **kwargs)


def test_lower_is_better_turns_the_words_and_level_needs_the_margin():
  """Bits per byte: a lower row is better. Differences -0.03, -0.02, -0.025 (mean -0.025, sd 0.005): better; a
  row within ±0.005 of its baseline (mean 0, sd 0.005) is level at margin 0.05, unresolved without one."""
  flat = Cell("t", (("dataset", "D"), ("model", "Flat")))
  rows = [
    _row(BASE, {0: 1.50, 1: 1.52, 2: 1.48}),
    _row(PRIMAL, {0: 1.47, 1: 1.50, 2: 1.455}),
    _row(flat, {0: 1.505, 1: 1.515, 2: 1.48}),
  ]
  sweep = _sweep([BASE, PRIMAL, flat], higher_is_better=False, digits=3, level_margin=0.05)
  primal, level = comparisons(sweep, rows, "t")
  half = T_975_2 * 0.005 / math.sqrt(3)
  assert primal.paired.mean == pytest.approx(-0.025) and primal.paired.high == pytest.approx(-0.025 + half)
  assert (primal.paired.verdict, primal.verdict) == ("lower", "better")
  assert (level.paired.verdict, level.verdict) == ("level", "level")
  # Holm over the family of 2: t = -0.025 / (0.005 / sqrt 3) = -8.66 on 2 df, p = 0.01307, adjusted x2 = 0.02614;
  # Flat's p = 1. Primal's corrected interval is at the first step's level, 1 - 0.05 / 2 (t_{0.9875, 2} = 6.2053).
  assert (primal.p, primal.p_holm) == (pytest.approx(0.013072, abs=2e-6), pytest.approx(0.026144, abs=4e-6))
  assert (level.p, level.p_holm) == (pytest.approx(1.0), pytest.approx(1.0))  # mean 0 up to rounding
  holm_half = 6.205346816 * 0.005 / math.sqrt(3)
  assert primal.corrected.high == pytest.approx(-0.025 + holm_half) and level.corrected == level.paired
  table = paired_table(sweep, rows, "t")
  raw = f"[{-0.025 - half:+.3f}, {-0.025 + half:+.3f}]"
  corrected = f"[{-0.025 - holm_half:+.3f}, {-0.025 + holm_half:+.3f}]"
  assert f"| D | Primal | Trans. | 3 | -0.025 | 0.005 | {raw} | {corrected} | 0.026 | better |" in table
  flat_interval = "[-0.012, +0.012]"
  assert f"| D | Flat | Trans. | 3 | +0.000 | 0.005 | {flat_interval} | {flat_interval} | 1.000 | level |" in table
  markdown = results_markdown(sweep, rows, [])
  assert "Lower is better here." in markdown and "level: the Holm CI contains zero and lies inside ±0.05" in markdown
  no_margin = dataclasses.replace(sweep, level_margin=None)
  assert [c.verdict for c in comparisons(no_margin, rows, "t")] == ["better", "unresolved"]


def test_unpaired_seeds_missing_baselines_and_protocols():
  """Seeds one row lacks are left out; a row whose baseline has no finished run shows 0 pairs; rows pair only
  under their own protocol, and the table gets a protocol column when it has several."""
  other = Cell("t", (("dataset", "E"), ("model", "Primal")))  # no Trans. row on E
  rows = [
    _row(BASE, {0: 80.0, 1: 82.0, 5: 70.0}),
    _row(PRIMAL, {0: 81.0, 1: 85.0, 2: 99.0}),  # pairs on seeds 0 and 1: differences 1 and 3
    _row(other, {0: 50.0, 1: 60.0}),
    _row(BASE, {0: 10.0, 1: 20.0}, protocol="honest"),
    _row(PRIMAL, {0: 30.0, 1: 40.0}, protocol="honest"),
  ]
  sweep = _sweep([BASE, PRIMAL, other])
  found = comparisons(sweep, rows, "t")
  assert [(c.row.cell, c.row.protocol, c.paired.n) for c in found] == [
    (PRIMAL, "release", 2),
    (other, "release", 0),
    (PRIMAL, "honest", 2),
  ]
  half = 12.706204736174698 * math.sqrt(2) / math.sqrt(2)  # t_{0.975,1}, sd of (1, 3) = sqrt(2)
  assert (found[0].paired.mean, found[0].paired.low) == (2.0, pytest.approx(2 - half))
  assert found[1].baseline is None and found[1].verdict == "unresolved"
  table = paired_table(sweep, rows, "t")
  header = "| dataset | model | protocol | vs | pairs | mean diff. | std | 95% CI | Holm CI | p (Holm) | verdict |"
  assert table.splitlines()[0] == header
  assert "| E | Primal | release | Trans. | 0 | - | - | - | - | - | unresolved |" in table
  # std 0, n 2: the sign test's p = 0.5; release's differences 1, 3: t = 2 on 1 df, p = 0.2952, adjusted x2 =
  # 0.5903, which Holm's step-down carries to the honest row's 0.5 (the empty comparison does not count in m).
  assert (
    "| D | Primal | honest | Trans. | 2 | +20.0 | 0.0 | [+20.0, +20.0] | [+20.0, +20.0] | 0.590 | unresolved |" in table
  )


def test_a_seed_counted_twice_cannot_be_paired():
  row = Row(PRIMAL, "release", (1.0, 2.0), planned=2, wall_seconds=(1.0, 1.0), seeds=(0, 0))
  with pytest.raises(ValueError, match=r"t dataset=D model=Primal \(release\) has seed 0 twice"):
    by_seed(row)


def test_a_sweep_refuses_a_baseline_no_run_has():
  with pytest.raises(ConfigError, match=r"no run of table 't' has model='Trans' \(model values: Primal, Trans.\)"):
    Sweep((Run("uea:smoke", BASE), Run("uea:smoke", PRIMAL)), baselines={"t": ("model", "Trans")})
  with pytest.raises(ConfigError, match="no run of 't' has a 'modle' label"):
    Sweep((Run("uea:smoke", BASE),), baselines={"t": ("modle", "Trans.")})
  Sweep((Run("uea:smoke", OTHER),), baselines={"t": ("model", "Trans.")})  # table t left out by the sweep's arg
  with pytest.raises(ConfigError, match="level_margin must be >= 0"):
    Sweep((Run("uea:smoke", BASE),), level_margin=-1.0)


SWEEP_FILE = """
from experiments.engine.spec import Cell, Run, Sweep


def get_sweep(arg=None):
  cells = [Cell("t", (("model", m),)) for m in ("DT", "Primal.+DT")]
  runs = tuple(Run("uea:smoke", cell, seed=s) for cell in cells for s in range(3))
  return Sweep(runs, baselines={"t": ("model", "DT")}, higher_is_better=False, digits=2)
"""


def test_the_docs_table_reads_the_records_and_the_sweep_files_baseline(tmp_path, monkeypatch):
  from experiments import docs_tables
  from experiments.tables import common, sweeps

  scores = {("DT", 0): 50.0, ("DT", 1): 60.0, ("DT", 2): 55.0, ("Primal.+DT", 0): 52.0, ("Primal.+DT", 1): 66.0}
  scores[("Primal.+DT", 3)] = 90.0  # no DT run of seed 3: left out; DT seed 2 has no Primal.+DT run
  for i, ((model, seed), score) in enumerate(scores.items()):
    cell = {"table": "t", "labels": [["model", model]], "paper": None}
    runs = [{"cell": cell, "seed": seed, "protocol": "rollouts"}]
    record = {"wall_seconds": 1.0, "runs": runs, "summary": {"test_at_best_validation": {"normalized_score": score}}}
    (tmp_path / "fam" / "sweep" / "runs" / f"k{i}").mkdir(parents=True)
    (tmp_path / "fam" / "sweep" / "runs" / f"k{i}" / RESULT_FILE).write_text(json.dumps(record))
  (tmp_path / "sweeps").mkdir()
  (tmp_path / "sweeps" / "fam.py").write_text(SWEEP_FILE)
  monkeypatch.setattr(common, "RESULTS", tmp_path)
  monkeypatch.setattr(sweeps, "SWEEPS", tmp_path / "sweeps")

  differences = np.array([52.0 - 50.0, 66.0 - 60.0])  # seeds 0 and 1: higher scores, and lower is "better" here
  half = 12.706204736174698 * differences.std(ddof=1) / np.sqrt(2)
  table = docs_tables.render_table("paired:fam:t", tmp_path)
  row = f"| Primal.+DT | DT | 2 | +{differences.mean():.2f} | {differences.std(ddof=1):.2f} | "
  interval = f"[{differences.mean() - half:+.2f}, {differences.mean() + half:+.2f}]"
  # One comparison: Holm's interval is the raw one; t = 4 / (2.83 / sqrt 2) = 2 on 1 df, p = 0.295.
  assert row + f"{interval} | {interval} | 0.295 | unresolved |" in table
  forest = docs_tables.render_table("forest:fam:t", tmp_path)  # the same comparison, drawn (tests/test_forest.py)
  assert forest.startswith("```text\n") and "Primal.+DT vs DT" in forest
  assert f"+4.00 [{differences.mean() - half:+.2f}, {differences.mean() + half:+.2f}] unresolved" in forest
  with pytest.raises(ValueError, match="names no baseline for table 'u'"):
    docs_tables.render_table("paired:fam:u", tmp_path)
  with pytest.raises(ValueError, match=r"paired:<family>:<table>\[@every_seed\]\[:<label>\]"):
    docs_tables.render_table("paired:fam", tmp_path)

  # paired:<family>:<table>:<label>: every row against the row of that label instead (DT - Primal.+DT: -2, -6)
  against = docs_tables.render_table("paired:fam:t:Primal.+DT", tmp_path)
  half = 12.706204736174698 * np.std([-2.0, -6.0], ddof=1) / np.sqrt(2)
  row = f"| DT | Primal.+DT | 2 | -4.00 | {np.std([-2.0, -6.0], ddof=1):.2f} | [{-4 - half:+.2f}, {-4 + half:+.2f}] |"
  assert row + f" [{-4 - half:+.2f}, {-4 + half:+.2f}] | 0.295 | unresolved |" in against
  assert "| Primal.+DT | DT |" not in against
  marked = "<!-- table:paired:fam:t:Primal.+DT begin -->\nold\n<!-- table:paired:fam:t:Primal.+DT end -->"
  assert docs_tables.MARKER.fullmatch(marked).group("name") == "paired:fam:t:Primal.+DT"  # a label with '+' is named
  with pytest.raises(ValueError, match=r"no run of table 't' has model='Primal' \(model values: DT, Primal.\+DT\)"):
    docs_tables.render_table("paired:fam:t:Primal", tmp_path)
  with pytest.raises(ValueError, match="names no column to pair table 'u' on"):
    docs_tables.render_table("paired:fam:u:DT", tmp_path)


# Differences +1 and +2: mean 1.5, std 0.71, 95% Student-t interval with 1 degree of freedom (t = 12.706).
_HALF = 12.706204736174698 * math.sqrt(0.5) / math.sqrt(2)
T1_INTERVAL = f"[{1.5 - _HALF:+.1f}, {1.5 + _HALF:+.1f}]"


def _honest_record(run_dir, cells, seed, summary) -> None:
  """A finished run's result.json reporting `summary` to `cells` (honest protocol) at `seed`."""
  entries = [{"cell": cell, "seed": seed, "protocol": "honest"} for cell in cells]
  run_dir.mkdir(parents=True)
  (run_dir / RESULT_FILE).write_text(json.dumps({"wall_seconds": 1.0, "runs": entries, "summary": summary}))


def test_the_eta_docs_table_takes_its_release_rows_from_table1_all_once(tmp_path, monkeypatch):
  from experiments.tables import common, results

  jv_pf = {"table": "table1_all", "labels": [["dataset", "JapaneseVowels"], ["model", "PrimalFormer"]], "paper": 98.4}

  def eta_cell(eta):
    return {"table": "eta", "labels": [["model", "PrimalFormer"], ["eta", eta]], "paper": None}

  # (cells, seed, accuracy, ratio at step 1, at the last step); seed 1's release run also names the eta cell
  # (runs made after the eta table existed), seed 0's only table1_all (made before): each counted once.
  records = [
    ([jv_pf], 0, 0.96, 180.0, 1.0),
    ([jv_pf, eta_cell("0.5 (release)")], 1, 0.98, 190.0, 2.0),
    ([eta_cell("0")], 0, 0.95, 0.0, 0.0),
    ([eta_cell("0")], 1, 0.96, 0.0, 0.0),
    ([eta_cell("0.0003")], 0, 0.97, 0.1, 0.001),
  ]
  for i, (cells, seed, accuracy, start, end) in enumerate(records):
    summary = {
      "test_at_best_validation": {"accuracy": accuracy},
      "ksvd_ratio": {"start": {"ratio": start}, "end": {"ratio": end}},
    }
    _honest_record(tmp_path / results.TABLE1_DIR / "runs" / f"k{i}", cells, seed, summary)
  monkeypatch.setattr(common, "RESULTS", tmp_path)

  table = results.uea_eta(tmp_path)
  # Release row: seeds 0 and 1 (97.0 +- 1.4), ratios averaged over both runs; eta 0: 95.5 +- 0.7.
  assert "| PrimalFormer | 0 | 95.5 ± 0.7 (n = 2) | 0 | 0 |" in table
  assert "| PrimalFormer | 0.0003 | 97.0 (n = 1) | 0.1 | 0.001 |" in table
  assert "| PrimalFormer | 0.5 (release) | 97.0 ± 1.4 (n = 2) | 185 | 1.5 |" in table
  # Paired against eta 0: release - 0 = +1, +2 (mean 1.5, std 0.71, t(1) interval +-6.35); 0.0003: one pair.
  # t = 1.5 / 0.5 = 3 on 1 df: p = 0.205, the only testable comparison of the family (one pair is not a test).
  assert (
    f"| PrimalFormer | 0.5 (release) | 0 | 2 | +1.5 | 0.7 | {T1_INTERVAL} | {T1_INTERVAL} | 0.205 | unresolved |"
    in table
  )
  assert "| PrimalFormer | 0.0003 | 0 | 1 | +2.0 | - | - | - | - | unresolved |" in table
  assert table.count("0.5 (release)") == 3  # once in the means, the pairs and the forest plot: not doubled
  forest = table.split("```text")[1]  # the plot draws the same comparison, with the same interval
  assert "PrimalFormer 0.5 (release) vs 0  " in forest and f"+1.5 {T1_INTERVAL} unresolved" in forest


def test_the_table8_docs_table_finds_its_runs_by_the_sweeps_plan(tmp_path, monkeypatch):
  """Table 8's data-dependent row is table1_all's Primal.+Trans. (one config, trained once, for table1_all): its
  record names only table1_all, and the docs table still finds it, by the key the sweep's plan gives the cell."""
  from experiments.tables import common, results

  sweep = results.uea_sweep()
  table8 = [r for r in sweep.runs if r.cell.table == "table8" and r.protocol == "honest" and r.seed < 2]
  accuracy = {("yes", 0): 0.98, ("yes", 1): 0.97, ("no", 0): 0.99, ("no", 1): 0.99}  # no - yes: +1, +2 points
  for key, planned in plan(table8).items():
    (run,) = planned.runs
    elsewhere = {"table": "table1_all", "labels": [["dataset", "JapaneseVowels"]], "paper": None}  # not table8
    summary = {"test_at_best_validation": {"accuracy": accuracy[dict(run.cell.labels)["data-dependent"], run.seed]}}
    _honest_record(tmp_path / results.TABLE1_DIR / "runs" / key, [elsewhere], run.seed, summary)
  monkeypatch.setattr(common, "RESULTS", tmp_path)

  table = results.uea_table8(tmp_path)
  assert "| Primal.+Trans. | yes | 98.9 | 97.5 ± 0.7 (n = 2) | - |" in table
  assert "| Primal.+Trans. | no | 99.2 | 99.0 ± 0.0 (n = 2) | - |" in table
  assert f"| Primal.+Trans. | no | yes | 2 | +1.5 | 0.7 | {T1_INTERVAL} | {T1_INTERVAL} | 0.205 | unresolved |" in table
  monkeypatch.setattr(common, "RESULTS", tmp_path / "empty")
  with pytest.raises(ValueError, match="no finished table8 runs"):
    results.uea_table8(tmp_path)


def _learning_row(cell, values: dict[int, float], validations: dict[int, float]) -> Row:
  row = _row(cell, values)
  return dataclasses.replace(row, validations=tuple(validations[s] for s in row.seeds))


def test_a_row_that_did_not_learn_takes_no_part_in_a_verdict():
  """Chance 50%, margin 2: a seed learned iff its best validation accuracy is above 52%. A row that did not learn on
  a paired seed (or whose baseline did not) reads "did not learn" / "<baseline> did not learn", has no p-value and
  leaves the Holm family, so the one tested comparison is corrected over m = 1 (its raw interval)."""
  good = Cell("t", (("dataset", "D"), ("model", "Good")))
  flat = Cell("t", (("dataset", "D"), ("model", "Flat")))
  rows = [
    _learning_row(BASE, {0: 60.0, 1: 62.0, 2: 61.0}, {0: 60.5, 1: 61.0, 2: 60.0}),
    _learning_row(PRIMAL, {0: 64.0, 1: 65.0, 2: 64.5}, {0: 64.0, 1: 65.0, 2: 64.0}),
    _learning_row(good, {0: 61.0, 1: 63.0, 2: 62.0}, {0: 61.0, 1: 63.0, 2: 62.0}),
    _learning_row(flat, {0: 50.0, 1: 52.5, 2: 50.0}, {0: 50.0, 1: 52.0, 2: 53.0}),  # 52.0 is not above 52
  ]
  sweep = _sweep([BASE, PRIMAL, good, flat], chance={"t": 50.0})
  primal, good_c, flat_c = comparisons(sweep, rows, "t")
  assert flat_c.verdict == "did not learn" and math.isnan(flat_c.p) and flat_c.corrected is None
  assert flat_c.paired.mean == pytest.approx((-10.0 - 9.5 - 11.0) / 3)  # the raw difference is still shown
  tested = [primal, good_c]
  # Holm over the two tested comparisons only (flat's nan is not counted in m).
  p = [c.p for c in tested]
  assert [c.p_holm for c in tested] == pytest.approx(
    list(np.minimum(1.0, np.maximum.accumulate(np.array(sorted(p)) * np.array([2, 1])))[np.argsort(np.argsort(p))])
  )
  # The reference not learning makes every comparison untested, named by the reference's label.
  lazy_base = dataclasses.replace(rows[0], validations=(60.5, 51.0, 60.0))
  assert {c.verdict for c in comparisons(sweep, [lazy_base, *rows[1:]], "t")} == {
    "Trans. did not learn",
    "did not learn",
  }
  # A row without validation values (a record with no best_validation) did not learn.
  assert comparisons(sweep, [rows[0], _row(PRIMAL, {0: 64.0, 1: 65.0, 2: 64.5})], "t")[0].verdict == "did not learn"
  # Without a chance level nothing changes.
  assert comparisons(_sweep([BASE, PRIMAL, good, flat]), rows, "t")[2].verdict != "did not learn"
  table = paired_table(sweep, rows, "t")
  assert "| D | Flat | Trans. | 3 | -10.2 | 0.8 | " in table and table.splitlines()[-1].endswith(
    "| - | - | did not learn |"
  )
  assert "not above chance + 2 points" in results_markdown(sweep, rows, [])
  with pytest.raises(ConfigError, match=r"chance\['t'\] must be a validation accuracy in \[0, 100\) %, got 150"):
    _sweep([BASE], chance={"t": 150})
  with pytest.raises(ConfigError, match="learn_margin must be >= 0"):
    _sweep([BASE], learn_margin=-1)


def test_stored_rows_carry_each_seeds_best_validation(tmp_path):
  """`Row.validations` comes from each record's summary `best_validation.accuracy` (in %), nan where absent."""
  for seed, summary in enumerate(
    [
      {"best_validation": {"step": 3, "accuracy": 0.625}, "test_at_best_validation": {"accuracy": 0.6}},
      {"test_at_best_validation": {"accuracy": 0.5}},
    ]
  ):
    run = tmp_path / "runs" / f"k{seed}"
    run.mkdir(parents=True)
    entry = {"cell": {"table": "t", "labels": [["model", "A"]], "paper": None}, "protocol": "honest", "seed": seed}
    (run / RESULT_FILE).write_text(json.dumps({"summary": summary, "wall_seconds": 1.0, "runs": [entry]}))
  (row,) = stored_rows(tmp_path)
  assert row.accuracies == (60.0, 50.0) and row.validations[0] == 62.5 and math.isnan(row.validations[1])
