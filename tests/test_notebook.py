"""Runs notebooks/quickstart.ipynb top to bottom in a Jupyter kernel, as a user would.

Nothing imports the notebook, so only executing it catches drift between it and the library (a renamed
config field, a changed return value). The kernel inherits this process's environment, including the 8 fake
CPU devices of conftest.py, so the notebook's training also runs data-parallel here.
"""

import os
import re
import sys
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "quickstart.ipynb"
KERNEL = "python3"  # the notebook's kernelspec
CELL_TIMEOUT_S = 300


def _pin_kernel_to_this_interpreter(tmp_path: Path, monkeypatch) -> None:
  """Makes `python3` launch sys.executable, the environment under test.

  A `python3` spec naming another interpreter would run the notebook without primal_jax, and its install
  cell would then pip-install into that interpreter. jupyter_client itself swaps a bare `python` in a spec's
  argv for sys.executable; any other spec is shadowed by one written for this interpreter (JUPYTER_PATH
  comes first in the kernel search path).
  """
  try:
    command = KernelSpecManager().get_kernel_spec(KERNEL).argv[0]
  except NoSuchKernel:
    command = None
  bare = {"python", f"python{sys.version_info[0]}", "python{}.{}".format(*sys.version_info[:2])}
  if command in bare or (command and os.path.realpath(command) == os.path.realpath(sys.executable)):
    return
  from ipykernel.kernelspec import write_kernel_spec

  jupyter_dir = tmp_path / "jupyter"
  write_kernel_spec(jupyter_dir / "kernels" / KERNEL)  # its argv starts with sys.executable
  monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(filter(None, [str(jupyter_dir), os.environ.get("JUPYTER_PATH")])))


def _stdout(nb) -> str:
  return "".join(
    out.text for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
    if out.output_type == "stream" and out.name == "stdout"
  )  # fmt: skip


def _one(pattern: str, text: str) -> str:
  found = re.findall(pattern, text, flags=re.MULTILINE)
  assert len(found) == 1, f"expected one match of {pattern!r} in the notebook's output, got {found}"
  return found[0]


def test_notebook_is_stored_clean():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(nb)
  assert nb.nbformat == 4 and nb.metadata.kernelspec.name == KERNEL
  dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
  assert not dirty, (
    f"code cells {dirty} of {NOTEBOOK.name} have outputs or execution counts: clear them before committing"
  )


def test_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
  _pin_kernel_to_this_interpreter(tmp_path, monkeypatch)
  workdir = tmp_path / "run"
  monkeypatch.setenv("PRIMAL_JAX_WORKDIR", str(workdir))
  monkeypatch.delenv("PRIMAL_JAX_SOURCE", raising=False)  # the repository must be found from the cwd
  copy = tmp_path / NOTEBOOK.name  # executed as a copy: the tracked file stays clean
  copy.write_bytes(NOTEBOOK.read_bytes())
  nb = nbformat.read(copy, as_version=4)
  # cwd = notebooks/, where a user opens it; execute() raises CellExecutionError naming the failing cell.
  client = NotebookClient(
    nb, timeout=CELL_TIMEOUT_S, kernel_name=KERNEL, resources={"metadata": {"path": str(NOTEBOOK.parent)}}
  )
  try:
    client.execute()
  finally:
    nbformat.write(nb, copy)  # with outputs, for reading a failure

  errors = [out for cell in nb.cells for out in cell.get("outputs", []) if out.output_type == "error"]
  assert not errors, [f"{e.ename}: {e.evalue}" for e in errors]
  text = _stdout(nb)
  assert os.path.realpath(_one(r"^python \S+ at (.+)$", text)) == os.path.realpath(sys.executable)
  assert "installing nothing" in text  # CI must never pip-install

  # Training ran data-parallel over every device the kernel saw (8 fake CPU devices under pytest).
  num_devices = len(re.findall(r"\(id=\d+", _one(r"^devices: (.+)$", text)))
  assert int(_one(r"mesh \{'data': (\d+)", text)) == num_devices >= 1

  total_steps = int(_one(r"total_steps (\d+)$", text))
  assert int(_one(r"^trained steps (\d+)$", text)) == total_steps
  assert int(_one(r"^restored step (\d+)$", text)) == total_steps

  figure = workdir / "quickstart_curves.png"
  assert figure.is_file() and figure.stat().st_size > 0
  images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
  assert len(images) == 1
