"""The committed records: what the docs tables read is there, the sweep finds every finished run by its key, and
every recorded command still runs through the committed mapping (experiments/results/recorded_commands.json)."""

from __future__ import annotations

import json
import re
import subprocess
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


def _tracked_runs(folder) -> set[str]:
  """The run directories under `folder` that git tracks (a clean checkout: all of them)."""
  out = subprocess.run(["git", "ls-files", "--", str(folder)], cwd=ROOT, capture_output=True, text=True, check=True)
  return {Path(line).relative_to(folder.relative_to(ROOT)).parts[0] for line in out.stdout.splitlines()}


@pytest.mark.parametrize(
  "family",
  ["uea_table1", "uea_figure1", "uea_figure1_calibrated", "lra/sweep", "lra_figure1", "d4rl/sweep", "lm/sweep"]
  + ["vit/sweep", "vit_figure1_calibrated"],
)
def test_every_run_record_is_found_under_its_key(family):
  """A run's directory is its key (what the sweep looks up), the hash of the config its result.json records,
  and its result.json holds the command, config and summary the tables and the provenance need."""
  folder = ROOT / "experiments" / "results" / family / "runs"
  runs, tracked = sorted(folder.iterdir()), _tracked_runs(folder)
  assert runs and tracked
  for run in runs:
    if run.name not in tracked and not (run / RESULT_FILE).exists():
      continue  # a run in progress or stopped in this working checkout: not committed, so not a record yet
    result = json.loads((run / RESULT_FILE).read_text())
    assert run.name == result["key"] == config_hash(result["config"])
    assert result["command"].startswith("python -m experiments.main --config=")
    assert isinstance(result["summary"], dict) and result["runs"]


# ---------------------------------------------------------------------------------------------------------------------
# Every recorded command is a command of the current CLI: mapped by `current_command`, then parsed by the binary's
# own flags (absl for experiments.main and experiments.generate, argparse for the others), and nothing run.

# Option values renamed since a record was written, as the docs state beside its table (docs/benchmarks.md: the
# decoding record's `--softmax_impl=auto` "is now spelled `--softmax_impl=einsum`"). `current_command` maps only
# --config; such a rename belongs in recorded_commands.json once experiments.engine.records applies one.
RENAMED_VALUES = {"--softmax_impl=auto": "--softmax_impl=einsum"}
# Records that hold no command line: the step profile (`argv: null`, its table says so), the spectra (their
# experiments.spectrum commands are in docs/results.md) and the LM throughput runs (a loop in docs/results.md).
WITHOUT_COMMAND = (
  "benchmarks/results/step_profile/",
  "experiments/results/spectrum_",
  "experiments/results/lm/throughput/",
)


class _Parsed(Exception):
  """Raised where a binary has parsed its command line, before it checks or does anything else."""


@pytest.fixture
def stop_after_parsing(monkeypatch):
  """argparse parsers (and experiments.generate, once its absl flags are read) raise `_Parsed(parser, args)`."""
  import argparse

  from primal_jax.cli import generate

  original = argparse.ArgumentParser.parse_args

  def parse_args(self, args=None, namespace=None):
    raise _Parsed(self, original(self, args, namespace))

  def generate_from_run(*args, **kwargs):
    raise _Parsed(None, kwargs)

  monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
  monkeypatch.setattr(generate, "generate_from_run", generate_from_run)


def _binaries() -> dict:
  """module -> the function that parses its command line (the arguments after `python -m MODULE`)."""
  from benchmarks import decoding, efficiency, gemv_chain, vs_release
  from experiments import make_d4rl_dataset, pathfinder_learnability, release_ratio
  from primal_jax.cli import generate
  from primal_jax.cli.train import parse_command_line

  return {
    "experiments.main": lambda argv: parse_command_line(["experiments.main", *argv]),
    "experiments.generate": lambda argv: generate.main(["experiments.generate", *argv]),
    "experiments.pathfinder_learnability": pathfinder_learnability.main,
    "experiments.make_d4rl_dataset": make_d4rl_dataset.main,
    "experiments.release_ratio": release_ratio.main,
    "benchmarks.decoding": decoding.parse_args,
    "benchmarks.efficiency": efficiency.parse_args,
    "benchmarks.vs_release": vs_release.parse_args,
    "benchmarks.gemv_chain": gemv_chain.parse_args,
  }


def command_error(command: str) -> str | None:
  """Why the recorded `python -m MODULE ARGS...` line is not a command of the current CLI; None if it parses."""
  import contextlib
  import io
  import shlex

  for old, new in RENAMED_VALUES.items():
    command = command.replace(old, new)
  argv = shlex.split(current_command(command))
  argv = argv[1:] if argv[:1] == ["python"] else argv
  binaries = _binaries()
  if len(argv) < 2 or argv[0] != "-m" or argv[1] not in binaries:
    return "not a command of a known binary"
  stderr = io.StringIO()
  try:
    with contextlib.redirect_stderr(stderr):
      binaries[argv[1]](argv[2:])
  except _Parsed:
    return None
  except SystemExit as err:  # argparse's exit on a bad argument
    return f"exit {err.code}: {' '.join(stderr.getvalue().split())[-200:]}"
  except Exception as err:  # absl's flags.Error, ConfigError, ml_collections' errors on a --config.FIELD
    return f"{type(err).__name__}: {err}"
  return None  # experiments.main returns its parsed config


def args_command(module: str, args: dict) -> str:
  """The command line of a benchmark record that stores its parsed arguments (`meta.args`), rebuilt with the
  current parser's options; an argument that parser lacks stays as `--NAME=VALUE`, so the command fails to parse."""
  import argparse
  import shlex

  try:
    _binaries()[module]([])
  except _Parsed as parsed:
    parser = parsed.args[0]
  options = {action.dest: action for action in parser._actions if action.option_strings}
  argv = []
  for key, value in args.items():
    action = options.get(key)
    if value is None:
      continue
    if action is None:
      argv.append(f"--{key}={value}")
    elif isinstance(action, argparse.BooleanOptionalAction):
      argv.append(action.option_strings[0] if value else "--no-" + action.option_strings[0].removeprefix("--"))
    elif action.nargs == 0:  # store_true
      argv += action.option_strings[:1] if value else []
    elif isinstance(action, argparse._AppendAction):  # --set KEY=VALUE, recorded parsed as [KEY, VALUE]
      argv += [f"{action.option_strings[0]}={v if isinstance(v, str) else f'{v[0]}={v[1]!r}'}" for v in value]
    elif isinstance(value, list | tuple):
      argv.append(f"{action.option_strings[0]}={','.join(map(str, value))}")
    else:
      argv.append(f"{action.option_strings[0]}={value}")
  return shlex.join(["python", "-m", module, *argv])


def recorded_commands() -> dict[str, str]:
  """{where: command} of every record: a sweep run's result.json, a one-off record's `command`, the D4RL datasets'
  commands, the LM samples' first line, a benchmark's `meta.command`, `meta.args` (rebuilt) or `runs[].argv`."""
  import shlex

  found = {}
  for path in sorted(RECORDS[0].rglob("*.json")):
    where = str(path.relative_to(ROOT))
    if path.name == COMMAND_MAP.name or ("/runs/" in where and path.name != RESULT_FILE):
      continue
    if path.name == "config.json" and (path.parent / "summary.json").exists():
      continue  # a run directory's executed config: its command is the summary's provenance argv
    record = json.loads(path.read_text())
    if "command" in record:
      found[where] = record["command"]
    elif str(record.get("provenance", {}).get("argv", [""])[0]).endswith("experiments/main.py"):
      # a training run's summary.json: its command is the training binary's argv
      found[where] = shlex.join(["python", "-m", "experiments.main", *record["provenance"]["argv"][1:]])
    elif Path((argv := record.get("meta", {}).get("provenance", {}).get("argv") or ["."])[0]).parent.name == (
      "experiments"
    ):  # a one-off experiment's record (experiments/release_ratio.py, run from any checkout): its argv, as run
      found[where] = shlex.join(["python", "-m", f"experiments.{Path(argv[0]).stem}", *argv[1:]])
    elif all(isinstance(v, dict) and "command" in v for v in record.values()):  # d4rl/datasets.json
      found.update({f"{where}:{key}": v["command"] for key, v in record.items()})
    else:
      assert where.startswith(WITHOUT_COMMAND), f"{where}: a record without a command"
  for path in sorted((RECORDS[0] / "lm" / "samples").glob("*.txt")):
    found[str(path.relative_to(ROOT))] = path.read_text().splitlines()[0].removeprefix("$ ")
  for path in sorted(RECORDS[1].rglob("*.json")):
    where, record = str(path.relative_to(ROOT)), json.loads(path.read_text())
    meta = record.get("meta", {})
    if meta.get("command"):
      found[where] = meta["command"]
    elif isinstance(meta.get("args"), dict):
      module = "benchmarks.vs_release" if path.name == "vs_release.json" else "benchmarks.efficiency"
      found[where] = (module, meta["args"])
    elif record.get("runs") and "argv" in record["runs"][0]:
      found.update({f"{where}:{i}": shlex.join(["python", *r["argv"]]) for i, r in enumerate(record["runs"])})
    else:
      assert where.startswith(WITHOUT_COMMAND), f"{where}: a record without a command"
  return found


def test_every_recorded_command_parses_as_a_command_of_the_current_cli(stop_after_parsing):
  commands = recorded_commands()
  kinds = {c[0] if isinstance(c, tuple) else c.split()[2] for c in commands.values()}
  assert {"experiments.main", "experiments.generate", "benchmarks.efficiency", "benchmarks.decoding"} <= kinds
  assert sum("/runs/" in where for where in commands) >= 150  # every sweep run of uea, d4rl, lm and vit
  failed = {}
  for where, command in commands.items():
    if isinstance(command, tuple):
      command = args_command(*command)
    if error := command_error(command):
      failed[where] = f"{command[:120]}: {error}"
  assert not failed, "\n".join(f"{where}: {why}" for where, why in failed.items())


@pytest.mark.parametrize(
  "command, why",
  [
    ("python -m experiments.main --config=uea:model=primal_plus --workdir=W --config.model.low_rank=8", "no field"),
    ("python -m experiments.main --config=uea:family=primal_plus --workdir=W", "unknown config argument"),
    ("python -m experiments.main --config=experiments/configs/uea.py --workdir=W --config.seed=x", "invalid literal"),
    ("python -m experiments.main --config=uea --workdir=W --num_epochs=3", "Unknown command line flag"),
    ("python -m benchmarks.decoding --contexts=1024 --softmax_impl=flash", "exit 2"),
    ("python -m experiments.pathfinder_learnability --distractors=2", "exit 2"),
    ("python -m experiments.release_ratio --release_dir=R --torch_python=P --out=O --steps=3", "exit 2"),
    ("python -m experiments.gone --x=1", "not a command of a known binary"),
  ],
)
def test_a_broken_command_does_not_parse(stop_after_parsing, command, why):
  """The pre-refactor forms the UEA records were trained with (`family=`, `model.low_rank`) are refused, so a
  record whose command was never rewritten would fail the test above."""
  error = command_error(command)
  assert error is not None and why in error, error


def test_a_benchmark_record_with_an_argument_the_parser_lacks_does_not_parse(stop_after_parsing):
  args = {"variants": "softmax", "lengths": "1024", "steps": 3, "rss": False, "set": [["model.dim", 32]]}
  assert command_error(args_command("benchmarks.efficiency", args)) is None
  assert "--no-rss" in args_command("benchmarks.efficiency", args)
  assert "exit 2" in command_error(args_command("benchmarks.efficiency", {**args, "removed_option": 1}))
