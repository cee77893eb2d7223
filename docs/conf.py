"""Sphinx configuration: the API reference from the docstrings, the docs/ pages and the notebooks, one site.

Build from the repository root (the source directory is the root, so the pages' links to README.md,
BUILD_NOTES.md and the notebooks resolve as they do on GitHub; this directory only holds the configuration):

  pip install -e ".[docs,train,rl]"
  sphinx-build -W -c docs . /tmp/primal_jax_docs    # open /tmp/primal_jax_docs/docs/contents.html

The API pages import every module, so the extras the modules need must be installed. Notebooks are rendered
as committed, without executing them (tests/test_notebook.py runs them). tests/test_docs_build.py builds the
site with warnings as errors.
"""

import re
import shutil
from pathlib import Path

from sphinx import addnodes
from sphinx.transforms.post_transforms import SphinxPostTransform

import primal_jax

project = "primal_jax"
author = "The primal_jax contributors"
copyright = "the primal_jax contributors, Apache-2.0"  # noqa: A001  (Sphinx's name)
release = version = primal_jax.__version__

extensions = [
  "sphinx.ext.autodoc",
  "sphinx.ext.autosummary",
  "sphinx.ext.napoleon",
  "myst_nb",  # Markdown pages (myst-parser) and notebooks
]

root_doc = "docs/contents"
# Only these are pages; the rest of the repository is not scanned (code is reached through autodoc).
include_patterns = [
  "README.md", "BUILD_NOTES.md", "CHANGELOG.md", "docs/**", "notebooks/*.ipynb", "notebooks/*.md",
  "benchmarks/results/**.md", "experiments/results/**.md",  # the records the pages link to
]  # fmt: skip
# decoding.md and gemv_chain.md are bare tables (no title) that no page links to.
exclude_patterns = [
  "docs/_build",
  ".git",
  ".venv*",
  "build",
  "dist",
  "workdirs",
  "benchmarks/results/decoding/*",
  "benchmarks/results/**/decoding.md",
  "benchmarks/results/**/gemv_chain.md",
]  # decoding and gemv_chain tables carry no title; the pages show them
# The generated benchmark records put their tables under H3 headings directly below the H1 (a style warning).
suppress_warnings = ["myst.header"]

# `name` in a docstring links to the object when Sphinx knows it and is shown as code either way.
default_role = "py:obj"
autosummary_generate = True
# Regenerated on every build, so a module renamed or removed leaves no stale page behind.
shutil.rmtree(Path(__file__).parent / "_autosummary", ignore_errors=True)
# Each object is documented where it is defined, not again where a package re-exports it (`__all__`).
autodoc_default_options = {"members": True, "show-inheritance": True, "ignore-module-all": True}
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

nb_execution_mode = "off"
myst_heading_anchors = 3  # the pages link to each other's sections (`results.md#offline-rl-...`)
myst_enable_extensions = ["colon_fence"]

html_theme = "alabaster"
html_title = f"primal_jax {release}"

# Docstrings written as plain text that docutils cannot parse, in modules other work was changing when the
# docs build arrived: shown verbatim (a literal block) rather than reformatted. The config files' docstrings
# (`primal_jax.tasks.<family>.config`: the exact command, hardware, runtime and target, laid out for a terminal)
# are all shown so. Narrow on purpose: any other docstring that breaks the build fails tests/test_docs_build.py and is
# fixed in the docstring.
VERBATIM_MODULES = re.compile(r"^primal_jax\.tasks\.\w+\.config(\.|$)")
VERBATIM_DOCSTRINGS = (
  "primal_jax.convert.cli",
  "primal_jax.data.registry",
  "primal_jax.training.metrics",
  "primal_jax.training.metrics.read_metrics",
)


def _verbatim(app, what, name, obj, options, lines):
  if (name in VERBATIM_DOCSTRINGS or VERBATIM_MODULES.match(name)) and lines:
    lines[:] = ["::", "", *(f"  {line}" for line in lines)]


class FolderLinks(SphinxPostTransform):
  """A page's link to a folder of the repository (`../experiments/results/uea_table1/`), which works on GitHub, shows
  its text unlinked: a folder is no page of the site. Any other unresolved link still fails the build."""

  default_priority = 8  # before myst's resolver (9) warns about it

  def run(self, **kwargs) -> None:
    here = Path(self.env.doc2path(self.env.docname)).parent
    for node in list(self.document.findall(addnodes.pending_xref)):
      target = node.get("reftarget", "")
      if node.get("reftype") == "myst" and target.endswith("/") and (here / target).is_dir():
        node.replace_self(node[0].deepcopy())


def setup(app):
  app.connect("autodoc-process-docstring", _verbatim)
  app.add_post_transform(FolderLinks)
