"""The documentation site builds with warnings as errors (issue 18.12): API reference, pages, notebooks.

Sphinx runs in a subprocess (it imports every module of the package) from the repository root with
docs/conf.py, into a tmp dir. A docstring docutils cannot parse, a broken link between pages or a page
outside the table of contents fails the build, and the test prints every warning (`--keep-going`).
"""

from __future__ import annotations

import fcntl
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import primal_jax

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory, worker_id) -> Path:
  """The site, built once per test session. docs/conf.py regenerates docs/_autosummary in the checkout, so two
  builds at once (this module's tests on two xdist workers) delete each other's pages: the workers share one
  build, the first to take the lock making it and the other reading its result."""
  shared = tmp_path_factory.mktemp("site").parent if worker_id == "master" else tmp_path_factory.getbasetemp().parent
  out, stderr = shared / "docs_site", shared / "docs_site.stderr"
  with open(shared / "docs_site.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    if not stderr.exists():
      command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-E", "-b", "html", "-c", "docs"]
      command += ["-d", str(out / ".doctrees"), ".", str(out)]
      result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
      stderr.write_text(f"sphinx exited {result.returncode}\n{result.stderr}" if result.returncode else "")
  failure = stderr.read_text()
  assert not failure, failure[-6000:]
  return out


def _text_of(html: str) -> str:
  return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def _text(path: Path) -> str:
  return _text_of(path.read_text(encoding="utf-8"))


@pytest.mark.slow
def test_every_module_has_an_api_page_from_its_docstrings(site):
  modules = {
    m.name for m in pkgutil.walk_packages(primal_jax.__path__, "primal_jax.") if not m.name.endswith("__main__")
  }
  pages = {p.stem for p in (site / "docs" / "_autosummary").glob("primal_jax*.html")}
  assert modules | {"primal_jax"} == pages
  primal = (site / "docs" / "_autosummary" / "primal_jax.attention.primal.html").read_text(encoding="utf-8")
  assert 'id="primal_jax.attention.primal.PrimalAttention"' in primal  # the class itself, with its signature
  assert "Self-attention as asymmetric kernel SVD in the primal" in _text_of(primal)
  # Napoleon turned the Google-style sections into fields, and the docstring's own words are there.
  ksvd = _text(site / "docs" / "_autosummary" / "primal_jax.ksvd.html")
  assert "The KSVD objective J of Primal-Attention" in ksvd and "Parameters" in ksvd


@pytest.mark.slow
def test_pages_and_notebooks_are_rendered(site):
  for page in ("docs/index", "docs/training", "docs/reliability", "README", "BUILD_NOTES", "CHANGELOG"):
    assert (site / f"{page}.html").stat().st_size > 5_000, page
  notebook = _text(site / "notebooks" / "quickstart.html")
  assert "Primal-Attention in JAX/Flax: quickstart" in notebook
  assert "import importlib.metadata" in notebook  # code cells shown, not executed
  # A page's link to another page (docs/index.md -> training.md) is a link of the site.
  assert 'href="training.html"' in (site / "docs" / "index.html").read_text(encoding="utf-8")
