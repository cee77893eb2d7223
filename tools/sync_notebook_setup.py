"""Copies notebooks/colab_setup.py into the setup cell of every notebook that has one.

  python tools/sync_notebook_setup.py           # rewrite the notebooks whose setup cell differs
  python tools/sync_notebook_setup.py --check   # exit 1, naming them, instead

The setup cell (runtime check, install, mesh) is the same in every notebook so that the repository URL and
the pinned versions live in one file; a notebook opened alone on Colab cannot import a sibling file, so each
carries a copy. The setup cell is the code cell whose first line is the first line of colab_setup.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SETUP = NOTEBOOKS / "colab_setup.py"


def setup_source() -> str:
  return SETUP.read_text().rstrip("\n")


def setup_cells(nb) -> list:
  first = setup_source().split("\n", 1)[0]
  return [c for c in nb.cells if c.cell_type == "code" and c.source.split("\n", 1)[0] == first]


def stale_notebooks() -> list[Path]:
  """The notebooks with a setup cell that differs from colab_setup.py."""
  stale = []
  for path in sorted(NOTEBOOKS.glob("*.ipynb")):
    cells = setup_cells(nbformat.read(path, as_version=4))
    if any(c.source != setup_source() for c in cells):
      stale.append(path)
  return stale


def main(argv: list[str]) -> int:
  stale = stale_notebooks()
  if "--check" in argv:
    for path in stale:
      print(f"{path.name}: setup cell differs from {SETUP.name}")
    return 1 if stale else 0
  for path in stale:
    nb = nbformat.read(path, as_version=4)
    for cell in setup_cells(nb):
      cell.source = setup_source()
    nbformat.write(nb, path)
    print("updated", path.name)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
