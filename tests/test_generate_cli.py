"""experiments/generate.py: one-line refusals (exit 2) before anything is loaded (issue 26.10)."""

from __future__ import annotations

import pytest

from experiments.generate import main as generate_main
from primal_jax.cli.config_lookup import load_config


def _refusal(capsys, argv) -> str:
  with pytest.raises(SystemExit) as exit_info:
    generate_main(["generate", *argv])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and err.count("\n") == 1, err  # one line, no traceback
  return err


@pytest.fixture
def lm_workdir(tmp_path):
  """The record of an LM run that saved no checkpoint (config.json only)."""
  (tmp_path / "config.json").write_text(load_config("lm:smoke").to_json())
  return tmp_path


def test_a_workdir_without_a_checkpoint_says_what_to_pass(lm_workdir, capsys):
  err = _refusal(capsys, [f"--workdir={lm_workdir}", "--prompt=x"])
  assert "holds no checkpoint" in err and "pass --workdir of a run that saved one" in err
  assert "latest_step()" not in err
  (lm_workdir / "checkpoints").mkdir()
  assert "holds no checkpoint" in _refusal(capsys, [f"--workdir={lm_workdir}", "--prompt=x"])


@pytest.mark.parametrize("seed", [2**64, 2**63, -(2**63) - 1])
def test_a_seed_beyond_64_bits_is_refused(lm_workdir, capsys, seed):
  err = _refusal(capsys, [f"--workdir={lm_workdir}", "--prompt=x", f"--seed={seed}"])
  assert "flag --seed=" in err and "is not an integer in the range [-9223372036854775808, 9223372036854775807]" in err


def test_a_tiny_temperature_is_refused(lm_workdir, capsys):
  err = _refusal(capsys, [f"--workdir={lm_workdir}", "--prompt=x", "--temperature=1e-40"])
  assert "temperature must be 0 (greedy) or >= 1.1754944e-38" in err


def test_a_step_that_was_not_saved_lists_the_saved_ones(lm_workdir, capsys):
  for step in (4, 8):
    (lm_workdir / "checkpoints" / str(step)).mkdir(parents=True)
  err = _refusal(capsys, [f"--workdir={lm_workdir}", "--prompt=x", "--step=7"])
  assert "--step 7: " in err and "holds the steps [4, 8]; pass one of them (no --step: the latest)" in err
