"""A run's spectrum kept in its workdir (experiments.spectrum_store): read back where the checkpoint is gone, never
when it no longer describes the run, and a run with neither refused in one line before anything is computed."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest


def _copy(run: Path, to: Path) -> Path:
  shutil.copytree(run, to)
  return to


def _as_committed(run: Path) -> None:
  """What a sweep commits of a run directory: everything but its records goes (checkpoints, config.json, logs)."""
  for path in run.iterdir():
    if not path.name.startswith("spectrum_"):
      shutil.rmtree(path) if path.is_dir() else path.unlink()


def _quiet(**kwargs):
  from experiments.spectrum import analyze

  return analyze(**kwargs, print_fn=lambda _: None)


def test_a_stored_spectrum_replaces_the_gone_checkpoint_exactly(tiny_run, tmp_path):
  from experiments.spectrum_store import store_path

  run = _copy(tiny_run, tmp_path / "run")
  first = _quiet(workdirs=[run], out=tmp_path / "a", num_examples=6, chunk_size=4)
  (computed,) = first["runs"]
  stored = json.loads(store_path(run, "test", 6).read_text())
  assert computed["source"] == "computed" and stored["run"]["step"] == computed["step"] == 2
  assert stored["config_hash"] and stored["provenance"]["commit"] and stored["default_label"] == computed["label"]
  _as_committed(run)
  assert sorted(p.name for p in run.iterdir()) == ["spectrum_test_6.json"]
  again = _quiet(workdirs=[run], out=tmp_path / "b", num_examples=6)
  (read,) = again["runs"]
  assert read["source"] == "stored" and read["label"] == computed["label"] and read["seed"] == 0
  assert read["layers"] == computed["layers"]  # the same numbers, not recomputed ones
  assert again["arms"]["summary"] == first["arms"]["summary"]
  assert (tmp_path / "b" / "explained_variance.png").stat().st_size > 0
  with np.load(tmp_path / "b" / "singular_values.npz") as arrays:
    assert list(arrays) == []  # raw values only of the runs computed in this call


def test_a_stored_spectrum_that_no_longer_describes_the_run_is_recomputed(tiny_run, tmp_path):
  from experiments.spectrum_store import load_stored, store_path

  run = _copy(tiny_run, tmp_path / "run")
  _quiet(workdirs=[run], out=tmp_path / "a", num_examples=4)
  assert load_stored(run, "test", 4) is not None
  assert load_stored(run, "test", 5) is None and load_stored(run, "validation", 4) is None
  assert load_stored(run, "test", 4, step=1) is None  # another step asked for
  before = store_path(run, "test", 4).read_bytes()
  store_path(run, "test", 4).unlink()
  result = _quiet(workdirs=[run], out=tmp_path / "c", num_examples=4, step=2)
  assert result["runs"][0]["source"] == "computed" and not store_path(run, "test", 4).exists()  # a step: not kept
  store_path(run, "test", 4).write_bytes(before)
  path = store_path(run, "test", 4)
  record = json.loads(path.read_text())
  record["run"]["step"] = 1  # a spectrum of an older checkpoint than the latest (2)
  path.write_text(json.dumps(record))
  assert load_stored(run, "test", 4) is None
  config = json.loads((run / "config.json").read_text())
  config["seed"] = 7  # the run's config changed: the stored spectrum is of another run
  (run / "config.json").write_text(json.dumps(config))
  result = _quiet(workdirs=[run], out=tmp_path / "b", num_examples=4)
  assert result["runs"][0]["source"] == "computed" and result["runs"][0]["seed"] == 7
  assert json.loads(path.read_text())["run"]["seed"] == 7  # replaced by the recomputed one


def test_arms_mix_stored_and_computed_runs_and_pair_them_by_seed(tiny_run, tmp_path):
  run0 = _copy(tiny_run, tmp_path / "s0")
  run1 = _copy(tiny_run, tmp_path / "s1")
  config = json.loads((run1 / "config.json").read_text())
  config["seed"] = 1
  (run1 / "config.json").write_text(json.dumps(config))
  _quiet(workdirs=[run0], out=tmp_path / "a", num_examples=4)
  _as_committed(run0)
  result = _quiet(
    workdirs=[run0, run1, run1, run0], labels=["a", "a", "b", "b"], references=["b"], out=tmp_path / "b", num_examples=4
  )
  assert [(r["arm"], r["seed"], r["source"]) for r in result["runs"]] == [
    ("a", 0, "stored"),
    ("a", 1, "computed"),
    ("b", 1, "computed"),  # what is stored is decided before anything is computed
    ("b", 0, "stored"),
  ]
  assert all(p["n"] == 2 and p["mean"] == 0.0 for p in result["arms"]["paired"])


def test_nostore_writes_nothing_in_the_run_and_reads_nothing(tiny_run, tmp_path):
  from experiments.spectrum import main

  run = _copy(tiny_run, tmp_path / "run")
  for stale in run.glob("spectrum_*.json"):
    stale.unlink()
  main(["spectrum", f"--workdir={run}", f"--out={tmp_path / 'out'}", "--num_examples=4", "--nostore"])
  assert not list(run.glob("spectrum_*.json"))


def test_a_run_with_neither_checkpoint_nor_stored_spectrum_is_refused_in_one_line(tiny_run, tmp_path, capsys):
  from experiments.spectrum import main

  run = _copy(tiny_run, tmp_path / "run")
  _quiet(workdirs=[run], out=tmp_path / "a", num_examples=4)
  _as_committed(run)
  out = tmp_path / "out"
  with pytest.raises(SystemExit) as exit_info:
    main(["spectrum", f"--workdir={tiny_run}", f"--workdir={run}", f"--out={out}", "--num_examples=8"])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and err.count("\n") == 1, err
  assert err.startswith(f"FATAL --workdir={run}: no config.json") and "spectrum_test_8.json" in err
  assert not out.exists()  # refused before anything was computed
