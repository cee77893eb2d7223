"""primal_jax.tasks, the one list of families: lazy registration, configs by name, no family imports another."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from primal_jax import tasks
from primal_jax.cli.config_lookup import list_configs, load_config
from primal_jax.data import registry
from primal_jax.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TASKS_DIR = ROOT / "primal_jax" / "tasks"


def test_importing_the_package_registers_every_family_and_imports_none():
  code = "import sys, primal_jax; print(sorted(m for m in sys.modules if m.startswith('primal_jax.tasks.')))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
  assert out.stdout.strip() == "[]", out.stdout + out.stderr
  names = {"uea", "lra", "lm", "d4rl", "vit", "uncertainty"}
  assert set(tasks.CONFIGS) == {family.config for family in tasks.FAMILIES} == names
  for family in tasks.FAMILIES:
    assert tasks.CONFIGS.lazy_entry(family.config).module == f"primal_jax.tasks.{family.folder}.config"
    for task in family.tasks:
      assert registry.TASKS.lazy_entry(task).module.startswith(f"primal_jax.tasks.{family.folder}.")


def test_a_registered_config_is_found_by_name_and_listed():
  def get_config(arg=None):
    """A config of a test's own."""
    config = tasks.CONFIGS.get("uea")("smoke")
    config.seed = int(arg or 0)
    return config

  with pytest.raises(ConfigError, match="unknown config name 'mine'"):
    load_config("mine")
  with tasks.registered_config("mine", get_config):
    assert load_config("mine:3").seed == 3
    assert "mine" in list_configs()
  assert "mine" not in tasks.CONFIGS


def _imported_modules(path: Path) -> set[str]:
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      found.add(node.module)
  return found


@pytest.mark.parametrize("family", [family.folder for family in tasks.FAMILIES])
def test_no_family_imports_another_familys_folder(family):
  others = tuple(f"primal_jax.tasks.{f.folder}" for f in tasks.FAMILIES if f.folder != family)
  for path in (TASKS_DIR / family).rglob("*.py"):
    leaks = {m for m in _imported_modules(path) if m in others or m.startswith(tuple(o + "." for o in others))}
    assert not leaks, (path, leaks)
