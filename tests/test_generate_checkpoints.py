"""`primal-generate` on a run whose latest checkpoint is damaged (issue 54.8): the refusal names the flag a CLI user
has (`--step=` an earlier step), not the Python argument `allow_corrupt=True`, and comes before any model is built."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from primal_jax.cli.config_lookup import load_config
from primal_jax.cli.generate import _check_checkpoint
from primal_jax.cli.generate import main as generate_main
from primal_jax.training.checkpointing.checkpointer import Checkpointer


@pytest.mark.parametrize("checksums", [False, True])
def test_generate_names_the_step_flag_for_an_unreadable_latest_checkpoint(tmp_path, capsys, checksums):
  """Steps 1 and 2 saved, step 2's info record overwritten: without checksums the Checkpointer's refusal (which
  said "pass allow_corrupt=True", no flag of this command), with them its checksum report; both name --step=1."""
  (tmp_path / "config.json").write_text(load_config("lm:smoke").to_json())
  with Checkpointer(tmp_path / "checkpoints", max_to_keep=None, async_save=False) as ckpt:
    for step in (1, 2):
      ckpt.save(step, {"w": jnp.arange(4.0)}, force=True)
  (tmp_path / "checkpoints" / "2" / "info" / "metadata").write_text("{")
  if not checksums:  # as a step saved before checksums were recorded
    (tmp_path / "checkpoints" / "2" / "checksums.json").unlink()
  with pytest.raises(SystemExit) as exit_info:
    generate_main(["generate", f"--workdir={tmp_path}", "--prompt=x"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith(f"error: --workdir {tmp_path}: ") and err.count("\n") == 1, err
  assert "pass --step=1 to generate from an earlier step (saved: [1, 2])" in err and "allow_corrupt" not in err, err
  assert ("is damaged" if checksums else f"the latest checkpoint {tmp_path / 'checkpoints' / '2'} is unreadable") in err
  _check_checkpoint(str(tmp_path), 1)  # the step it names passes the same check


def test_generate_with_only_a_damaged_step_says_to_train_again(tmp_path, capsys):
  (tmp_path / "config.json").write_text(load_config("lm:smoke").to_json())
  with Checkpointer(tmp_path / "checkpoints", max_to_keep=None, async_save=False) as ckpt:
    ckpt.save(3, {"w": jnp.arange(4.0)}, force=True)
  (tmp_path / "checkpoints" / "3" / "info" / "metadata").write_text("{")
  (tmp_path / "checkpoints" / "3" / "checksums.json").unlink()
  with pytest.raises(SystemExit):
    generate_main(["generate", f"--workdir={tmp_path}", "--prompt=x"])
  err = capsys.readouterr().err
  assert "no earlier step was saved: train the run again" in err and "allow_corrupt" not in err, err
