"""The worked examples of docs/development.md ("Extending") run as written: each fenced python block under an
`### Add ...` heading executes in a fresh namespace, in a temporary working directory, and cleans up the
registry entries it makes (each example ends by unregistering, which the test then checks)."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "development.md"


def examples() -> dict[str, str]:
  """Heading -> the python block under it, for every `### Add ...` section of the page."""
  text = DOC.read_text()
  found = {}
  for section in re.split(r"^### ", text, flags=re.M)[1:]:
    heading, _, body = section.partition("\n")
    if not heading.startswith("Add "):
      continue
    blocks = re.findall(r"```python\n(.*?)```", body, flags=re.S)
    assert len(blocks) == 1, f"{heading!r}: one python block expected, found {len(blocks)}"
    found[heading.strip()] = blocks[0]
  return found


def test_the_page_has_the_four_worked_examples():
  headings = " | ".join(examples())
  for kind in ("attention", "task", "model family", "objective"):
    assert f"Add {'an' if kind[0] in 'ao' else 'a'} {kind}" in headings, headings


@pytest.mark.parametrize("heading", sorted(examples()))
def test_worked_example_runs(heading, tmp_path, monkeypatch):
  from primal_jax.attention import ATTENTIONS
  from primal_jax.data.registry import TASKS
  from primal_jax.models.registry import MODELS
  from primal_jax.training.objectives import OBJECTIVES

  before = [set(r) for r in (ATTENTIONS, TASKS, MODELS, OBJECTIVES)]
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv("PRIMAL_JAX_DATA", str(tmp_path / "data"))
  module = types.ModuleType("development_example")  # dataclasses look their module up in sys.modules
  monkeypatch.setitem(sys.modules, module.__name__, module)
  exec(compile(examples()[heading], f"docs/development.md: {heading}", "exec"), module.__dict__)
  assert [set(r) for r in (ATTENTIONS, TASKS, MODELS, OBJECTIVES)] == before  # the example cleaned up
