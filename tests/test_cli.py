"""The training binary answers a user's mistake in one line (issue 18, items 10 and 11).

Every try is a real subprocess of `python -m experiments.main` or of the installed `primal-train` script,
run from the repository or from another directory: a mistake exits with status 2 and one line on stderr
naming the argument and what it accepts, with no traceback; `--debug` adds the traceback. Configs are
found by name from anywhere, `--help` and `--list_configs` answer. The tries run four at a time in one
fixture (each is a fresh Python that imports JAX), and each test reads its own result.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRIMAL_TRAIN = shutil.which("primal-train", path=str(Path(sys.executable).parent)) or shutil.which("primal-train")
EXIT_USAGE = 2
# One CPU device (conftest asks for 8, which the mesh try must not have), and no accelerator probing.
ENV = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
WORKDIR = "--workdir=<one per try>"
TOY_HEADER = "@problemName Toy\n@dimensions 2\n@equalLength false\n@classLabel true a b\n@data\n"


def _cases(n: int, missing_at: int | None = None, broken_at: int | None = None) -> str:
  """`n` cases of two 3-step dimensions; case `missing_at` has a '?', case `broken_at` a non-number."""
  lines = []
  for i in range(n):
    first = ["1", str(i), "2"]
    if i == missing_at:
      first[1] = "?"
    if i == broken_at:
      first[1] = "x"
    lines.append(f"{','.join(first)}:{i % 3},{i % 5},1:{'ab'[i % 2]}")
  return TOY_HEADER + "\n".join(lines) + "\n"


def _archive(root: Path, train: str) -> str:
  (root / "Toy").mkdir(parents=True)
  (root / "Toy" / "Toy_TRAIN.ts").write_text(train)
  (root / "Toy" / "Toy_TEST.ts").write_text(_cases(6))
  return str(root)


def _tries(tmp: Path) -> dict[str, tuple[list[str], Path]]:
  """{name: (command, working directory)}; data-reading tries get their own archive and TFDS directory."""
  main = [sys.executable, "-m", "experiments.main"]
  good = _archive(tmp / "good", _cases(20))
  missing = _archive(tmp / "missing", _cases(20, missing_at=3))
  broken = _archive(tmp / "broken", _cases(20, broken_at=4))
  (tmp / "a_file").write_text("not a directory")
  elsewhere = tmp / "elsewhere"
  elsewhere.mkdir()

  def toy(name: str, source: str, *extra: str) -> list[str]:
    data = [f"--config.data.source={source}", f"--config.data.data_dir={tmp / ('tfds_' + name)}"]
    return [*main, "--config=uea:smoke,dataset=Toy", *data, f"--workdir={tmp / ('w_' + name)}", *extra]

  tries = {
    "help": ([*main, "--help"], ROOT),
    "help_installed": ([PRIMAL_TRAIN, "--help"], elsewhere),
    "list_configs": ([PRIMAL_TRAIN, "--list_configs"], elsewhere),
    "repo_path_elsewhere": ([PRIMAL_TRAIN, "--config=experiments/configs/uea.py:smoke", WORKDIR], elsewhere),
    "missing_config_file": ([*main, "--config=configs/nope.py", WORKDIR], ROOT),
    "unknown_config_name": ([*main, "--config=nope", WORKDIR], ROOT),
    "bad_config_argument": ([*main, "--config=uea:nonsense=1", WORKDIR], ROOT),
    "bad_config_value": ([*main, "--config=uea:smoke,model=nope", WORKDIR], ROOT),
    "override_not_a_float": ([*main, "--config=uea:smoke", "--config.optimizer.learning_rate=abc", WORKDIR], ROOT),
    "override_unknown_field": ([*main, "--config=uea:smoke", "--config.optimizer.lr=1e-3", WORKDIR], ROOT),
    "unknown_flag": ([*main, "--config=uea:smoke", "--bogus", WORKDIR], ROOT),
    "no_config": ([*main, WORKDIR], ROOT),
    "workdir_not_writable": ([*main, "--config=uea:smoke", f"--workdir={tmp / 'a_file' / 'run'}"], ROOT),
    "workdir_debug": ([*main, "--config=uea:smoke", f"--workdir={tmp / 'a_file' / 'run'}", "--debug"], ROOT),
    "unknown_dataset": ([*main, "--config=uea:smoke,dataset=Nope", WORKDIR], ROOT),
    "unknown_task": ([*main, "--config=uea:smoke", "--config.data.task=nope", WORKDIR], ROOT),
    "mesh_needs_devices": ([*main, "--config=uea:smoke", "--config.mesh_shape=(-1, 2)", WORKDIR], ROOT),
    "data_source_missing": ([*main, "--config=uea:smoke", f"--config.data.source={tmp / 'nowhere'}", WORKDIR], ROOT),
    "unknown_model_name": (toy("model", good, "--config.model.name=nope"), ROOT),
    "learning_rate_nan": (toy("nan", good, "--config.optimizer.learning_rate=nan"), ROOT),
    "ts_file_malformed": (toy("broken", broken), ROOT),
    "ts_missing_value": (toy("missing", missing), ROOT),
    "missing_keep": (toy("keep", missing, "--config.data.missing=keep"), ROOT),
    "missing_zero_trains": (toy("zero", missing, "--config.data.missing=zero", "--config.total_steps=2"), ROOT),
  }
  # Each try its own workdir: a workdir is locked by the run that uses it.
  return {
    name: ([f"--workdir={tmp / ('w_' + name)}" if arg == WORKDIR else arg for arg in command], cwd)
    for name, (command, cwd) in tries.items()
  }


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
  if PRIMAL_TRAIN is None:
    pytest.skip("the primal-train script is not installed (pip install -e '.[train]')")
  tries = _tries(tmp_path_factory.mktemp("cli"))

  def run(item):
    name, (command, cwd) = item
    result = subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)
    return name, result

  with ThreadPoolExecutor(max_workers=4) as pool:
    return dict(pool.map(run, tries.items()))


PREFIXES = ("python -m experiments.main: error: ", "primal-train: error: ")


def _one_line_error(result: subprocess.CompletedProcess, name: str) -> str:
  """The error line, after checking: exit status 2, no traceback, the error is the last line of stderr and the
  only one (a try that prepares its data first also shows TFDS's progress above it)."""
  lines = result.stderr.strip().splitlines()
  assert result.returncode == EXIT_USAGE, (result.returncode, result.stderr[-3000:])
  assert "Traceback" not in result.stderr
  assert [line for line in lines if line.startswith(PREFIXES)] == lines[-1:], result.stderr[-3000:]
  if not name.startswith(DATA_PREPARING):
    assert len(lines) == 1, result.stderr[-3000:]
  return lines[-1]


# Tries that start preparing the Toy archive (TFDS logs its progress) before they fail.
DATA_PREPARING = ("unknown_model_name", "learning_rate_nan", "ts_file_malformed", "ts_missing_value")
# {try: (regex the line must match: the argument it names, then what is accepted)}
ERRORS = {
  "repo_path_elsewhere": r"--config=experiments/configs/uea\.py:smoke: config file experiments/configs/uea\.py does "
  r"not exist \(relative to .*elsewhere\); the packaged config of that name is --config=uea; packaged configs: "
  r"d4rl, lm, lra, uea, uncertainty, vit",
  "missing_config_file": r"--config=configs/nope\.py: config file configs/nope\.py does not exist .*packaged configs: "
  r"d4rl, lm, lra, uea, uncertainty, vit",
  "unknown_config_name": r"--config=nope: unknown config name 'nope'; packaged configs: "
  r"d4rl, lm, lra, uea, uncertainty, vit",
  "bad_config_argument": r"--config=uea:nonsense=1: unknown config argument 'nonsense'; accepted: dataset, model, "
  r"smoke$",
  "bad_config_value": r"--config=uea:smoke,model=nope: model must be one of primalformer, primal_plus, .*got 'nope'",
  "override_not_a_float": r"--config\.optimizer\.learning_rate=abc: could not convert string to float: 'abc'; "
  r"--config\.optimizer\.learning_rate takes a float \(default 0\.001\)$",
  "override_unknown_field": r"--config\.optimizer\.lr: optimizer has no field 'lr'; its fields: .*learning_rate",
  "unknown_flag": r"Unknown command line flag 'bogus'; --config, --workdir, .*are accepted",
  "no_config": r"--config is required: a packaged config \(d4rl, lm, lra, uea, uncertainty, vit\) or a config file",
  "workdir_not_writable": r"--workdir=.*a_file/run: cannot write there \(Not a directory\)",
  "unknown_dataset": r"data\.dataset: source='aeon' has only BasicMotions, JapaneseVowels, not 'Nope'",
  "unknown_task": r"--config\.data\.task: data\.task must be one of \['d4rl', .*'uea'\], got 'nope'",
  "mesh_needs_devices": r"mesh_shape \[-1, 2\] does not divide the 1 devices; on CPU, start with "
  r"XLA_FLAGS=--xla_force_host_platform_device_count=N",
  "data_source_missing": r"data\.source: UEA problem 'JapaneseVowels': missing .*nowhere/JapaneseVowels/"
  r"JapaneseVowels_TRAIN\.ts",
  "unknown_model_name": r"model\.name must be one of \[.*'timeseries'.*\], got 'nope'",
  "learning_rate_nan": r"optimizer\.learning_rate must be a finite number > 0, got nan",
  "ts_file_malformed": r"broken/Toy/Toy_TRAIN\.ts, line 10: non-numeric value 'x' at dimension 1 of 2, value 2",
  "ts_missing_value": r"missing/Toy/Toy_TRAIN\.ts, line 9: missing value .*data\.missing='zero'",
  "missing_keep": r"data\.missing must be one of raise, zero, got 'keep'",
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_mistake_is_one_line_naming_the_argument(runs, name):
  line = _one_line_error(runs[name], name)
  assert re.search(ERRORS[name], line), line


def test_debug_shows_the_traceback_then_the_same_line(runs):
  result, plain = runs["workdir_debug"], runs["workdir_not_writable"]
  assert result.returncode == EXIT_USAGE
  assert "Traceback (most recent call last)" in result.stderr and "NotADirectoryError" in result.stderr
  assert result.stderr.strip().splitlines()[-1] == plain.stderr.strip()


@pytest.mark.parametrize("name", ["help", "help_installed"])
def test_help_lists_flags_and_how_to_name_a_config(runs, name):
  result = runs[name]
  assert result.returncode == 0 and result.stderr == "", result.stderr[-2000:]
  for text in ("--config=uea", "path/to/my_config.py", "--config.optimizer.learning_rate", "--workdir", "--debug"):
    assert text in result.stdout, text
  assert "(d4rl, lm, lra, uea, uncertainty, vit)" in result.stdout  # the packaged configs, by name


def test_list_configs_from_another_directory(runs):
  result = runs["list_configs"]
  assert result.returncode == 0, result.stderr[-2000:]
  names = [line.split()[0] for line in result.stdout.splitlines()]
  assert names == ["d4rl", "lm", "lra", "uea", "uncertainty", "vit"]
  assert "UEA multivariate time-series classification" in result.stdout


def test_missing_zero_trains_on_a_file_with_missing_values(runs, tmp_path_factory):
  """`data.missing=zero` reaches the `.ts` parser: the file with a '?' that the default refuses trains."""
  result = runs["missing_zero_trains"]
  assert result.returncode == 0, result.stderr[-3000:]
  workdir = next(Path(tmp_path_factory.getbasetemp()).glob("cli*/w_zero"))
  config = json.loads((workdir / "config.json").read_text())
  assert config["data"]["missing"] == "zero" and config["data"]["dataset"] == "Toy"
  assert json.loads((workdir / "summary.json").read_text())["steps"] == 2
