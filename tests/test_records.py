"""The committed records: what the docs tables read is there, the sweep finds every finished run by its key, and
every recorded command still runs through the committed mapping (experiments/results/recorded_commands.json)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from experiments.engine.records import COMMAND_MAP, RESULT_FILE, current_command, current_config
from experiments.engine.spec import config_hash
from primal_jax.atomic_files import read_json
from primal_jax.cli.config_lookup import load_config

ROOT = Path(__file__).resolve().parents[1]
RECORDS = (ROOT / "experiments" / "results", ROOT / "benchmarks" / "results")


def _recorded_configs() -> set[str]:
  """Every --config value a JSON record names (its command, or a benchmark's `config` argument)."""
  specs = set()
  for folder in RECORDS:
    for path in folder.rglob("*.json"):
      text = path.read_text()
      specs |= set(re.findall(r"--config=([^\s\"']+)", text))
      specs |= set(re.findall(r'"config": "([^"]*configs/[^"]*)"', text))
  return specs


def test_every_recorded_config_runs_through_the_mapping():
  specs = _recorded_configs()
  assert any(spec.startswith("experiments/configs/") for spec in specs)  # the old form is recorded
  for spec in sorted(specs):
    load_config(current_config(spec))  # raises on a config that does not run


def test_the_mapping_names_gone_files_and_packaged_configs():
  mapping = read_json(COMMAND_MAP)["config"]
  for old, new in mapping.items():
    assert not (ROOT / old).exists(), f"{old} exists: the mapping would hide it"
    load_config(new)
  assert current_config("experiments/configs/uea.py:smoke") == "uea:smoke"
  assert current_config("/elsewhere/experiments/configs/lra.py") == "lra"
  assert current_config("uea:smoke") == "uea:smoke" and current_config("my/own.py:x") == "my/own.py:x"
  recorded = "python -m experiments.main --config=experiments/configs/vit.py:short --workdir=W --config.seed=1"
  assert current_command(recorded) == "python -m experiments.main --config=vit:short --workdir=W --config.seed=1"


@pytest.mark.parametrize("family", ["uea", "d4rl/sweep", "lm/sweep", "vit/sweep"])
def test_every_run_record_is_found_under_its_key(family):
  """A run's directory is its key (what the sweep looks up; the UEA sweep's current plan finds its 108 keys:
  tests/test_sweep.py), for the later sweeps also the hash of the config its result.json records, and its
  result.json holds the command, config and summary the tables and the provenance need."""
  runs = sorted((ROOT / "experiments" / "results" / family / "runs").iterdir())
  assert runs
  for run in runs:
    result = json.loads((run / RESULT_FILE).read_text())
    assert run.name == result["key"]
    if family != "uea":  # the UEA configs recorded there do not hash to their keys; its plan finds them (test_sweep)
      assert config_hash(result["config"]) == run.name
    assert result["command"].startswith("python -m experiments.main --config=")
    assert isinstance(result["summary"], dict) and result["runs"]
