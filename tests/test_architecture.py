"""The package's shape: no import cycle between modules of `primal_jax`, `experiments` and `benchmarks`, no library
module over 400 lines.

Imports are read from the code (every `import` statement, also inside functions and under `if TYPE_CHECKING:`, as
a lazy or type-only import only hides a cycle), so the check needs no import of the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "primal_jax"
# The library and the code beside it that imports it (the binaries, sweeps and tables; the benchmarks): one graph,
# as /work/shared/tools/arch_check.py counts it.
CHECKED = (PACKAGE, REPO / "experiments", REPO / "benchmarks")
MAX_LINES = 400


def module_files(package: Path) -> dict[str, Path]:
  """Dotted module name -> file, for every .py under `package` (a package is its __init__)."""
  out = {}
  for path in sorted(package.rglob("*.py")):
    parts = path.relative_to(package.parent).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = path
  return out


def import_graph(*packages: Path) -> dict[str, set[str]]:
  """Module -> the modules of `packages` it imports, wherever the `import` statement stands (module level, inside a
  function, under `if TYPE_CHECKING:`). A package's __init__ re-exporting its own children, and a child importing
  its parent package's __init__, are not edges (re-exports, not code that depends back)."""
  modules = {name: path for package in packages for name, path in module_files(package).items()}

  def resolve(name: str) -> str | None:
    while name and name not in modules:
      name = name.rpartition(".")[0]
    return name or None

  graph: dict[str, set[str]] = {m: set() for m in modules}
  for module, path in modules.items():
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          anchor = module if is_package else module.rpartition(".")[0]
          for _ in range(node.level - 1):
            anchor = anchor.rpartition(".")[0]
          base = f"{anchor}.{node.module}" if node.module else anchor
        targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
      else:
        continue
      for target in filter(None, map(resolve, targets)):
        parent_init = modules[target].name == "__init__.py" and module.startswith(target + ".")
        own_child = is_package and target.startswith(module + ".")
        if target != module and not parent_init and not own_child:
          graph[module].add(target)
  return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one module (Tarjan), each sorted."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  found: list[list[str]] = []

  def visit(v: str) -> None:
    index[v] = low[v] = len(index)
    stack.append(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_no_import_cycle_in_primal_jax():
  graph = import_graph(PACKAGE)
  assert len(graph) > 50 and graph["primal_jax.attention.primal"]  # the graph was really read
  assert cycles(graph) == []


def test_no_import_cycle_in_the_binaries_and_benchmarks():
  """Issue 54: benchmarks.decoding <-> decoding_extras (through imports inside functions) and experiments.engine's
  spec / paired <-> aggregate (through `Row` imported under TYPE_CHECKING) were cycles this test did not see."""
  graph = import_graph(*CHECKED)
  assert graph["experiments.engine.aggregate"] and graph["benchmarks.decoding"]  # the graph was really read
  assert any(m.startswith("primal_jax.") for m in graph["experiments.engine.spec"])  # and across the packages
  assert cycles(graph) == []


def test_cycle_detection_counts_function_and_type_checking_imports(tmp_path):
  """A cycle closed only by an import inside a function, or only under `if TYPE_CHECKING:`, is still a cycle."""
  package = tmp_path / "pkg"
  package.mkdir()
  (package / "__init__.py").write_text("")
  (package / "spec.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n  from pkg.agg import Row\n")
  (package / "agg.py").write_text("from pkg.spec import Sweep\n")
  (package / "bench.py").write_text("def measure():\n  from pkg import extras\n")
  (package / "extras.py").write_text("from pkg.bench import build\n")
  (package / "rows.py").write_text("")
  assert cycles(import_graph(package)) == [["pkg.agg", "pkg.spec"], ["pkg.bench", "pkg.extras"]]
  (package / "spec.py").write_text("from pkg.rows import Row\n")  # the untangled shape: Row below both
  assert cycles(import_graph(package)) == [["pkg.bench", "pkg.extras"]]


def test_cycle_detection_finds_a_cycle(tmp_path):
  """The check can fail: a two-module cycle through a lazy import, and a package re-export that is not one."""
  package = tmp_path / "pkg"
  (package / "sub").mkdir(parents=True)
  (package / "__init__.py").write_text("from pkg.a import f\n")
  (package / "a.py").write_text("from pkg import b\n\ndef f():\n  return b\n")
  (package / "b.py").write_text("def g():\n  from pkg.a import f\n  return f\n")
  (package / "sub" / "__init__.py").write_text("from pkg.sub.c import h\n")
  (package / "sub" / "c.py").write_text("import pkg.sub\n\ndef h():\n  return 1\n")
  assert cycles(import_graph(package)) == [["pkg.a", "pkg.b"]]


def test_no_library_module_over_the_line_limit():
  lengths = {name: len(path.read_text().splitlines()) for name, path in module_files(PACKAGE).items()}
  assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}


# --- Between packages: the layers of docs/development.md ------------------------------------------------------

# First-level package (or root module group "root") -> the packages it may import. `primal_jax/__init__.py`
# re-exports and seeds the registries (it imports `primal_jax.tasks`), so it is not a tie between packages.
LAYERS: dict[str, set[str]] = {
  "root": set(),
  "attention": {"root"},
  "models": {"root", "attention"},
  "nnx": {"root", "attention", "models"},
  "data": {"root"},
  "launch": {"root"},
  "training": {"root", "attention", "models", "data", "launch"},
  "tasks": {"root", "attention", "models", "data", "training", "launch", "analysis"},  # uncertainty: its metrics
  "cli": {"root", "attention", "models", "data", "training", "tasks", "launch"},
  "convert": {"root", "attention", "models", "nnx", "data", "training", "analysis"},  # verify checks its metrics
  "analysis": {"root", "attention", "models", "data", "training"},
}


def unit(module: str, package: str = "primal_jax") -> str:
  """The first-level package of `module` ('tasks' for primal_jax.tasks.uea.config), 'root' for a root module,
  '' for the top-level __init__."""
  parts = module.split(".")
  if len(parts) == 1:
    return ""
  return parts[1] if (PACKAGE.parent / package / parts[1]).is_dir() else "root"


def package_graph(graph: dict[str, set[str]], unit_of=unit) -> dict[str, set[str]]:
  """First-level package -> the packages its modules import (the top-level __init__ left out)."""
  out: dict[str, set[str]] = {}
  for module, targets in graph.items():
    a = unit_of(module)
    if not a:
      continue
    out.setdefault(a, set())
    for target in targets:
      b = unit_of(target)
      if b and b != a:
        out[a].add(b)
        out.setdefault(b, set())
  return out


def test_no_import_cycle_between_packages():
  packages = package_graph(import_graph(PACKAGE))
  assert {"attention", "training", "data", "models"} <= set(packages)
  assert cycles(packages) == []


def test_package_cycle_detection_finds_one(tmp_path):
  """Two packages whose modules import each other, with no cycle between modules, are a package cycle."""
  package = tmp_path / "pkg"
  for sub in ("x", "y"):
    (package / sub).mkdir(parents=True)
    (package / sub / "__init__.py").write_text("")
  (package / "__init__.py").write_text("")
  (package / "x" / "a.py").write_text("from pkg.y import c\n")
  (package / "y" / "b.py").write_text("from pkg.x import d\n")
  (package / "x" / "d.py").write_text("")
  (package / "y" / "c.py").write_text("")
  graph = import_graph(package)
  assert cycles(graph) == []

  def unit_of(module):
    parts = module.split(".")
    return "" if len(parts) == 1 else parts[1]

  assert cycles(package_graph(graph, unit_of)) == [["x", "y"]]


def test_every_package_imports_only_the_layers_below_it():
  packages = package_graph(import_graph(PACKAGE))
  unknown = set(packages) - set(LAYERS)
  assert not unknown, f"packages with no layer in LAYERS: {unknown}"
  wrong = {a: sorted(targets - LAYERS[a]) for a, targets in packages.items() if targets - LAYERS[a]}
  assert wrong == {}


def test_no_family_imports_another_family():
  """A family folder under primal_jax/tasks/ imports the shared modules of tasks/, never another family."""
  graph = import_graph(PACKAGE)
  families = {p.name for p in (PACKAGE / "tasks").iterdir() if p.is_dir() and p.name != "__pycache__"}
  assert {"uea", "lra", "lm", "vision", "offline_rl"} <= families

  def family(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "tasks" and parts[2] in families else None

  crossing = {
    (m, t) for m, targets in graph.items() for t in targets if family(m) and family(t) and family(m) != family(t)
  }
  assert crossing == set()


def outside_paths(package: Path) -> list[str]:
  """`file:line` of every library line that reaches outside `package`: a `parents[k]` climbing above it, or a
  path into the repository's `experiments/` or `benchmarks/` (prose in docstrings aside)."""
  import re

  pattern = re.compile(r"parents\[(\d+)\]|\.parent\.parent|[\"'/](experiments|benchmarks)/")
  found = []
  for path in sorted(package.rglob("*.py")):
    depth = len(path.relative_to(package).parts) - 1  # 0 for package/x.py
    for n, line in enumerate(path.read_text().splitlines(), 1):
      if line.lstrip().startswith("#"):
        continue
      for hit in pattern.finditer(line):
        if hit.group(1) is not None and int(hit.group(1)) <= depth:
          continue  # parents[k] that stays inside the package
        if hit.group(2) is not None and ('"""' in line or "`" in line or "python -m" in line):
          continue
        found.append(f"{path.relative_to(package.parent)}:{n}")
  return found


def test_no_library_path_outside_the_package():
  assert outside_paths(PACKAGE) == []


def test_outside_path_detection_finds_one(tmp_path):
  package = tmp_path / "pkg"
  (package / "sub").mkdir(parents=True)
  (package / "sub" / "ok.py").write_text("ROOT = Path(__file__).parents[1]\n")
  (package / "sub" / "bad.py").write_text("ROOT = Path(__file__).parents[2]\nX = 'experiments/results'\n")
  assert outside_paths(package) == ["pkg/sub/bad.py:1", "pkg/sub/bad.py:2"]
