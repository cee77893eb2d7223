"""The package's shape: no import cycle between modules of `primal_jax`, no library module over 400 lines.

Imports are read from the code (every `import` statement, also inside functions, as a lazy import only
hides a cycle), so the check needs no import of the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "primal_jax"
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


def import_graph(package: Path) -> dict[str, set[str]]:
  """Module -> the package's modules it imports. A package's __init__ re-exporting its own children, and a
  child importing its parent package's __init__, are not edges (re-exports, not code that depends back)."""
  modules = module_files(package)

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
