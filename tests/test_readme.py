"""The README's usage example and main job run, and print what they claim."""

import pathlib
import re
import subprocess

import numpy as np

from experiments import demo
from primal_jax import tasks

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_usage_example_runs(capsys):
  text = (ROOT / "README.md").read_text()
  blocks = re.findall(r"```python\n(.*?)```", text, re.S)
  assert blocks, "README has no python example"
  exec(compile(blocks[0], "README.md", "exec"), {})
  shape, reg = capsys.readouterr().out.split(")")
  assert shape == "(4, 64, 512"
  assert np.isfinite(float(reg)) and float(reg) > 0


def test_readme_has_two_commands_first():
  text = (ROOT / "README.md").read_text()
  fences = re.findall(r"```(\w*)\n(.*?)```", text, re.S)
  assert [lang for lang, _ in fences[:2]] == ["bash", "bash"]
  assert "experiments.main" in fences[0][1] and "--config=uea " in fences[0][1]  # the packaged config, by name
  assert '".[test]"' in fences[1][1] and "pytest" in fences[1][1]
  assert "pytest -n 2" in fences[1][1]  # both cores (pytest-xdist, in the test extra)
  assert fences[1][1].rstrip().endswith('-m "not slow"')  # the fast tests: CI's time limit (docs/development.md)
  assert text.index(fences[0][1]) < text.index(fences[1][1]) < text.index("## ")  # the README starts with them


def test_ci_runs_the_readme_blocks_as_written():
  """.ci/run extracts the README's two commands exactly (it runs the first in a fresh venv, the second after)."""
  fences = re.findall(r"```(\w*)\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
  for n in (1, 2):
    out = subprocess.run(["bash", ".ci/run", "--readme-block", str(n)], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == fences[n - 1][1], (n, out.stdout, out.stderr)
  script = (ROOT / ".ci" / "run").read_text()
  assert "\nset -euo pipefail\n" in script
  assert "final test/accuracy" in script  # the first block must end by printing it
  configs = sorted(family.config for family in tasks.FAMILIES)
  default_smokes = re.search(r"smokes=\$\{PRIMAL_JAX_CI_SMOKES-([\w ]+)\}", script).group(1).split()
  assert sorted(default_smokes) == configs  # every family's smoke config, through the installed wheel
  for command in ('"$wheel[train,rl]"', "primal-train --help", "primal-train --list_configs", "primal-generate",
                  "primal-convert verify", "readme_block 2"):  # fmt: skip
    assert command in script, command


def test_readme_is_short_and_every_relative_link_resolves():
  assert len((ROOT / "README.md").read_text().splitlines()) <= 200  # the details live in docs/
  for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
      if "://" in target or target.startswith("#"):
        continue
      assert (path.parent / target.split("#")[0]).exists(), f"{path.name}: broken link {target}"


def test_demo_prints_ksvd_terms_per_layer(capsys):
  assert demo.main(["--sampling", "padding_aware"]) == 0
  out = capsys.readouterr().out
  rows = re.findall(r"^\s+(\d)\s+([-\d.]+)\s+([-\d.]+)", out, re.M)
  assert [r[0] for r in rows] == ["0", "1"], out  # one row per Primal layer
  assert all(np.isfinite(float(r[1])) and np.isfinite(float(r[2])) for r in rows)
  assert "loss_ksvd" in out and "20 lines of the Zen of Python" in out


def test_zen_batch_is_real_text_with_padding():
  tokens, mask, lines = demo.zen_batch(128)
  assert len(lines) == 20 and lines[0].startswith("The Zen of Python")
  lengths = mask.sum(1).astype(int)
  assert lengths.tolist() == [len(line.encode()) for line in lines]
  np.testing.assert_array_equal(tokens[0, : lengths[0]], np.frombuffer(lines[0].encode(), np.uint8))
  assert (tokens[mask == 0] == 0).all()
