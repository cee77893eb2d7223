"""experiments/pathfinder_learnability.py: the conv-net check runs end to end and records what it measured."""

from __future__ import annotations

import json

import chex
import numpy as np
import pytest

from experiments import pathfinder_learnability as pl


def test_run_writes_every_evaluation(tmp_path, capsys):
  out = tmp_path / "cnn.json"
  argv = ["--contour_length=4", "--num_distractors=0", "--num_train=64", "--num_test=40", "--steps=4"]
  pl.main([*argv, "--eval_every=2", f"--out={out}"])
  record = json.loads(out.read_text())
  assert record["geometry"] == {"contour_length": 4, "num_distractors": 0}
  assert [row["step"] for row in record["history"]] == [2, 4]
  for row in record["history"]:
    assert 0.0 <= row["train_accuracy"] <= 1.0
    # 40 test images: the accuracy is a whole number of them.
    np.testing.assert_allclose(row["test_accuracy"] * 40, round(row["test_accuracy"] * 40), atol=1e-6)
  assert record["command"].endswith("--out=" + str(out))
  assert "step 4: train" in capsys.readouterr().out


def test_conv_net_shapes():
  import jax

  model = pl.SmallConvNet(widths=(4,))
  images = np.zeros((3, 32, 32, 1), np.float32)
  logits = model.apply(model.init(jax.random.key(0), images), images)
  chex.assert_shape(logits, (3, 2))


@pytest.mark.parametrize(
  "flag, message",
  [("--steps=0", "--steps must be >= 1"), ("--num_distractors=-2", "--num_distractors must be >= 0")],
)
def test_bad_flags_are_refused(flag, message, capsys):
  with pytest.raises(SystemExit):
    pl.main([flag])
  assert message in capsys.readouterr().err


def test_same_seed_same_record_other_seed_other_images():
  kwargs = dict(contour_length=4, num_distractors=0, num_train=32, num_test=32, steps=2, eval_every=2)
  first, again = pl.run(seed=0, **kwargs), pl.run(seed=0, **kwargs)
  assert first["history"] == again["history"]
  # The splits `run` trains and tests on come from different streams, so they never share an image.
  train, train_y, test, test_y = pl.draw_splits(32, 32, seed=0, contour_length=4, num_distractors=0)
  assert train.shape == test.shape == (32, 32, 32) and len(train_y) == len(test_y) == 32
  shared = {t.tobytes() for t in train} & {t.tobytes() for t in test}
  assert not shared


def test_an_existing_record_is_refused_before_training(tmp_path, capsys, monkeypatch):
  """Issue 26, item 3 (the same pattern): `--out` used to be overwritten silently, and `main()` without
  arguments recorded a command without them. An existing record is refused before anything trains unless
  --overwrite; the command recorded is the one that ran."""
  out = tmp_path / "cnn.json"
  out.write_text('{"recorded": true}\n')
  argv = ["--contour_length=4", "--num_distractors=0", "--num_train=16", "--num_test=8", "--steps=1", f"--out={out}"]
  with pytest.raises(SystemExit) as info:
    pl.main(argv)
  assert info.value.code == 2 and f"--out {out} exists (a recorded result)" in capsys.readouterr().err
  assert out.read_text() == '{"recorded": true}\n'
  monkeypatch.setattr("sys.argv", ["pathfinder_learnability.py", *argv, "--overwrite"])
  pl.main()
  assert json.loads(out.read_text())["command"] == "python -m experiments.pathfinder_learnability " + " ".join(
    [*argv, "--overwrite"]
  )
