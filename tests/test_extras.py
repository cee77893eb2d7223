"""The extras install what the code imports, and one family's run imports no other family's dependencies.

From the import graph, read statically with `ast` (every `import` of a module, inside functions too, following
`primal_jax.*` and `experiments.*`; an import guarded by `except ImportError` or `if TYPE_CHECKING` is optional),
the third-party top-level modules reachable from each entry point (each config family's config, its tasks'
pipeline modules and the training binary; `primal-train`, `primal-generate`, `primal-convert`; `import
primal_jax`) are mapped to distributions (`importlib.metadata.packages_distributions()`), and the extras that
serve the entry point (setup.cfg's, with install_requires, followed through the installed distributions'
Requires-Dist) must install each of them. A dependency added to the code without its extra fails here; the
synthetic graph below proves that it does.
"""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import subprocess
import sys
import types
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from primal_jax import tasks
from primal_jax.data import registry
from primal_jax.errors import ConfigError
from primal_jax.models.registry import MODELS
from primal_jax.registry import Lazy

ROOT = Path(__file__).resolve().parents[1]
INTERNAL = ("primal_jax", "experiments")  # the packages whose imports are followed
# The families (primal_jax.tasks.FAMILIES, the one list) by config name, and their tasks' lazy entries.
FAMILIES = {family.config: family for family in tasks.FAMILIES}
BUILTIN_TASKS = {task: registry.TASKS.lazy_entry(task) for family in tasks.FAMILIES for task in family.tasks}
# The binary builds any registered model family: its lazy entries' modules count as imported.
MODEL_FAMILIES = tuple(sorted({MODELS.lazy_entry(name).module for name in MODELS if MODELS.lazy_entry(name)}))
TRAINING_BINARY = ("experiments.main", "primal_jax.cli.train", "primal_jax.models.registry", *MODEL_FAMILIES)
# Entry points besides the families: (modules, the extras that serve them). The console scripts must be here.
ENTRY_POINTS = {
  "primal-train": (TRAINING_BINARY, ("train",)),
  "primal-generate": (("experiments.generate", "primal_jax.cli.generate"), ("train",)),
  "primal-convert": (("primal_jax.convert.cli", "primal_jax.convert.__main__"), ("train",)),  # timm: orbax
  "primal-convert verify": (("primal_jax.convert.cases",), ()),  # the library alone
  "import primal_jax": (("primal_jax", "primal_jax.models", "primal_jax.attention", "primal_jax.data"), ()),
}
OTHER_FAMILIES_DEPS = {"PIL", "mujoco", "gymnasium", "h5py", "minari"}  # vision's and offline RL's


def _is_type_checking(test: ast.expr) -> bool:
  return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
    isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
  )


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
  kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
  return any(isinstance(k, ast.Name) and k.id in ("ImportError", "ModuleNotFoundError") for k in kinds)


def imported_names(source: str, module: str, is_package: bool) -> set[str]:
  """The absolute names `module` imports anywhere in `source` (functions included), `from a import b` as both
  `a` and `a.b`; optional imports (guarded by `except ImportError`, or under `if TYPE_CHECKING`) left out."""
  package = module if is_package else module.rpartition(".")[0]
  found: set[str] = set()

  def visit(node: ast.AST) -> None:
    if isinstance(node, ast.If) and _is_type_checking(node.test):
      children = node.orelse
    elif isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
      children = [*node.handlers, *node.orelse, *node.finalbody]  # the body's imports are optional
    else:
      children = list(ast.iter_child_nodes(node))
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")
        anchor = ".".join(parts[: len(parts) - node.level + 1])
        base = f"{anchor}.{base}" if base else anchor
      found.add(base)
      found.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    elif (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Attribute)
      and node.func.attr == "import_module"
      and node.args
      and isinstance(node.args[0], ast.Constant)
      and isinstance(node.args[0].value, str)
    ):
      found.add(node.args[0].value)
    for child in children:
      visit(child)

  visit(ast.parse(source))
  found.discard("__future__")
  return found


def module_file(root: Path, name: str) -> Path | None:
  path = root.joinpath(*name.split("."))
  for candidate in (path / "__init__.py", path.with_suffix(".py")):
    if candidate.is_file():
      return candidate
  return None


def reachable(root: Path, starts, internal=INTERNAL) -> tuple[set[str], dict[str, set[str]]]:
  """(internal modules, {third-party top-level module: the internal modules importing it}) reachable from
  `starts`; importing a module imports its parent packages too."""
  modules: set[str] = set()
  external: dict[str, set[str]] = {}
  todo = list(starts)
  while todo:
    name = todo.pop()
    if name in modules:
      continue
    path = module_file(root, name)
    if path is None:
      raise AssertionError(f"{name} is not a module under {root}")
    modules.add(name)
    parts = name.split(".")
    todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
    for imported in imported_names(path.read_text(), name, path.name == "__init__.py"):
      top = imported.partition(".")[0]
      if top in internal:
        if module_file(root, imported) is not None:
          todo.append(imported)
        elif module_file(root, imported.rpartition(".")[0]) is None:  # `from a import b`: b may be a name
          raise AssertionError(f"{name} imports {imported}, which does not exist")
      elif top not in sys.stdlib_module_names and module_file(root, top) is None:  # not a local folder either
        external.setdefault(top, set()).add(name)
  return modules, external


def read_requirements(setup_cfg: Path) -> dict[str, list[str]]:
  """{"": install_requires, extra: its requirements} from setup.cfg."""
  parser = configparser.ConfigParser()
  parser.read(setup_cfg)

  def lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]

  out = {"": lines(parser["options"]["install_requires"])}
  out.update({extra: lines(text) for extra, text in parser["options.extras_require"].items()})
  return out


def installed_closure(requirements) -> set[str]:
  """The canonical names of `requirements` and everything their installed metadata requires (extras followed)."""
  extras_seen: dict[str, set[str]] = {}
  todo = [Requirement(r) for r in requirements]
  while todo:
    req = todo.pop()
    name = canonicalize_name(req.name)
    if name in extras_seen and set(req.extras) <= extras_seen[name]:
      continue
    extras = extras_seen.setdefault(name, set())
    extras.update(req.extras)
    try:
      requires = importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
      continue  # not installed here: its own requirements are unknown (a missing import says so below)
    for text in requires:
      sub = Requirement(text)
      if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in {"", *extras}):
        todo.append(sub)
  return set(extras_seen)


def unserved(external: dict[str, set[str]], requirements: dict[str, list[str]], extras, providers) -> list[str]:
  """One line per third-party module that install_requires plus `extras` does not install."""
  wanted = [r for key in ("", *extras) for r in requirements[key]]
  installed = installed_closure(wanted)
  problems = []
  for top, importers in sorted(external.items()):
    dists = {canonicalize_name(d) for d in providers.get(top, ())}
    if not dists:
      problems.append(f"{top} (imported by {', '.join(sorted(importers))}): no installed distribution provides it")
    elif not dists & installed:
      extra_list = ",".join(extras) or "no extra"
      problems.append(f"{top} (from {'/'.join(sorted(dists))}, imported by {', '.join(sorted(importers))}) "
                      f"is not installed by install_requires + [{extra_list}]")  # fmt: skip
  return problems


@pytest.fixture(scope="module")
def requirements():
  return read_requirements(ROOT / "setup.cfg")


@pytest.fixture(scope="module")
def providers():
  return importlib.metadata.packages_distributions()


def family_entry(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
  family = FAMILIES[name]
  entries = [BUILTIN_TASKS[t] for t in family.tasks]
  config = tasks.CONFIGS.lazy_entry(name)
  modules = (config.module, *TRAINING_BINARY, *(t.module for t in entries))
  extras = tuple(sorted({e for t in (config, *entries) for e in t.extras}))
  return modules, extras


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_is_installed_by_its_extras(family, requirements, providers):
  modules, extras = family_entry(family)
  assert set(extras) <= set(requirements), extras
  _, external = reachable(ROOT, modules)
  assert not unserved(external, requirements, extras, providers)
  if family in ("uea", "lra", "lm", "vit"):  # the README's CPU families need [train] alone
    assert extras == ("train",)


@pytest.mark.parametrize("task", sorted(BUILTIN_TASKS))
def test_each_input_pipeline_alone_is_installed_by_the_data_extra(task, requirements, providers):
  extras = ("data", *(e for e in BUILTIN_TASKS[task].extras if e != "train"))
  _, external = reachable(ROOT, [BUILTIN_TASKS[task].module])
  assert not unserved(external, requirements, extras, providers)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_each_command_is_installed_by_its_extras(entry, requirements, providers):
  modules, extras = ENTRY_POINTS[entry]
  _, external = reachable(ROOT, modules)
  assert not unserved(external, requirements, extras, providers)


def test_every_family_task_and_console_script_is_covered():
  """Every family folder is in the family list with a config; every registered task and config is a family's."""
  folders = {p.parent.name for p in (ROOT / "primal_jax" / "tasks").glob("*/config.py")}
  assert folders == {family.folder for family in tasks.FAMILIES}
  assert set(tasks.CONFIGS) == set(FAMILIES)
  assert set(registry.TASKS) == set(BUILTIN_TASKS) and None not in BUILTIN_TASKS.values()
  parser = configparser.ConfigParser()
  parser.read(ROOT / "setup.cfg")
  scripts = {line.split("=")[0].strip() for line in parser["options.entry_points"]["console_scripts"].splitlines()}
  assert scripts - {""} <= set(ENTRY_POINTS)


def test_the_training_binary_imports_no_task_and_no_other_familys_dependency():
  """Statically: the binary reaches no task module (the registry names them as strings), so a family's run
  imports the binary's modules and its own; and the UEA family reaches neither Pillow nor MuJoCo."""
  modules, external = reachable(ROOT, TRAINING_BINARY)
  assert not modules & {t.module for t in BUILTIN_TASKS.values()}
  assert not set(external) & OTHER_FAMILIES_DEPS
  _, uea = reachable(ROOT, family_entry("uea")[0])
  assert not set(uea) & OTHER_FAMILIES_DEPS, uea


def test_test_extra_is_a_superset_of_the_others(requirements):
  test = {canonicalize_name(Requirement(r).name) for r in requirements["test"]}
  for extra in ("data", "train", "rl"):
    assert {canonicalize_name(Requirement(r).name) for r in requirements[extra]} <= test, extra


def test_a_uea_run_imports_no_vision_or_rl_dependency_at_run_time():
  """The package, the training binary and the UEA task imported in a fresh interpreter."""
  code = (
    "import sys, primal_jax, primal_jax.training, primal_jax.models, primal_jax.training.loop\n"
    "from primal_jax.data import registry\n"
    "registry.get_task('uea')\n"
    f"print(sorted(set(m.partition('.')[0] for m in sys.modules) & set({sorted(OTHER_FAMILIES_DEPS)!r})))\n"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
  assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_task_whose_dependency_is_missing_is_refused_naming_the_module_and_extra(tmp_path, monkeypatch):
  (tmp_path / "task_without_its_dependency.py").write_text("import no_such_dependency_xyz\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  task = Lazy("task_without_its_dependency:make", ("train", "rl"))
  config = types.SimpleNamespace(task="toy_missing")
  message = "task 'toy_missing' needs the 'no_such_dependency_xyz' module, which is not installed: "
  with registry.registered_task("toy_missing", task):
    with pytest.raises(ConfigError, match=rf"^{message}pip install 'primal-jax\[train,rl\]'$"):
      registry.get_input_pipeline(config)


def test_builtin_tasks_are_imported_on_first_use():
  factory = registry.TASKS["listops"]
  from primal_jax.tasks.lra.listops import make_listops_pipeline

  assert factory is make_listops_pipeline and registry.get_task("listops") is factory
  assert len(registry.TASKS) == len(list(registry.TASKS)) >= len(BUILTIN_TASKS)


# The checker itself, on a synthetic package: an import added without its extra fails.


def _write(root: Path, files: dict[str, str]) -> None:
  for name, text in files.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)


SYNTHETIC = {
  "pkg/__init__.py": "",
  "pkg/entry.py": "import os\nimport numpy as np\n\ndef run():\n  from . import helper\n  return helper\n",
  "pkg/helper.py": (
    "from typing import TYPE_CHECKING\nfrom pkg.sub import thing\nimport PIL.Image\n"
    "if TYPE_CHECKING:\n  import scipy\n"
    "try:\n  import torch\nexcept (ImportError, OSError):\n  torch = None\n"
  ),
  "pkg/sub/__init__.py": "import importlib\nmod = importlib.import_module('pkg.sub.late')\n",
  "pkg/sub/thing.py": "",
  "pkg/sub/late.py": "import yaml\n",
  "pkg/unused.py": "import mujoco\n",
}


def test_the_checker_finds_a_dependency_added_without_its_extra(tmp_path, providers):
  _write(tmp_path, SYNTHETIC)
  modules, external = reachable(tmp_path, ["pkg.entry"], internal=("pkg",))
  assert modules == {"pkg", "pkg.entry", "pkg.helper", "pkg.sub", "pkg.sub.thing", "pkg.sub.late"}
  assert external == {"numpy": {"pkg.entry"}, "PIL": {"pkg.helper"}, "yaml": {"pkg.sub.late"}}
  requirements = {"": ["numpy>=1.26"], "train": ["pyyaml"], "vision": ["pyyaml", "pillow>=10"]}
  (problem,) = unserved(external, requirements, ("train",), providers)
  assert problem.startswith("PIL (from pillow, imported by pkg.helper) is not installed by install_requires + [train]")
  assert not unserved(external, requirements, ("vision",), providers)
  _write(tmp_path, {"pkg/sub/thing.py": "import no_such_dependency_xyz\n"})
  problems = unserved(reachable(tmp_path, ["pkg.entry"], internal=("pkg",))[1], requirements, ("vision",), providers)
  assert problems == ["no_such_dependency_xyz (imported by pkg.sub.thing): no installed distribution provides it"]
  _write(tmp_path, {"pkg/sub/thing.py": "from pkg import missing_module\nfrom pkg.gone import x\n"})
  with pytest.raises(AssertionError, match="pkg.sub.thing imports pkg.gone.x, which does not exist"):
    reachable(tmp_path, ["pkg.entry"], internal=("pkg",))


def test_requirements_are_followed_through_installed_metadata_and_their_extras():
  closure = installed_closure(["orbax-checkpoint", "gymnasium[mujoco]"])
  assert {"orbax-checkpoint", "etils", "jax", "gymnasium", "mujoco"} <= closure
  assert "mujoco" not in installed_closure(["gymnasium"])  # the extra is what brings MuJoCo
