"""The wheel and sdist a user installs (issue 18.12): built here, then their contents and metadata checked.

`python -m build` runs without build isolation (the backend comes from the `test` extra), so no network is
needed; it builds from a copy of the packaging files, the library and the tests in a tmp dir, so the checkout
gets no `build/` or egg-info, and the wheel is built from the sdist, which proves the sdist is complete.
`twine check --strict` is the registry's own metadata check (README rendering included).
"""

from __future__ import annotations

import email.parser
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

import primal_jax

ROOT = Path(__file__).resolve().parents[1]
TOP_FILES = ("pyproject.toml", "setup.cfg", "MANIFEST.in", "README.md", "LICENSE", "CHANGELOG.md", "CITATION.cff")
TOP_FILES += ("BUILD_NOTES.md",)
EXTRAS = {"data", "train", "rl", "notebooks", "docs", "profile", "test"}


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
  src = tmp_path_factory.mktemp("src")
  for name in TOP_FILES:
    shutil.copy2(ROOT / name, src / name)
  skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
  shutil.copytree(ROOT / "primal_jax", src / "primal_jax", ignore=skip)
  # Only the tests' own files (not tests/data): enough to see that the sdist leaves them out.
  shutil.copytree(ROOT / "tests", src / "tests", ignore=shutil.ignore_patterns("data", "__pycache__"))
  out = tmp_path_factory.mktemp("dist")
  subprocess.run(
    [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
    check=True, capture_output=True, text=True,
  )  # fmt: skip
  (wheel,), (sdist,) = out.glob("*.whl"), out.glob("*.tar.gz")
  return {"wheel": wheel, "sdist": sdist}


def _modules() -> set[str]:
  """The library's files as the checkout has them, relative to the repository root."""
  return {p.relative_to(ROOT).as_posix() for p in (ROOT / "primal_jax").rglob("*.py") if "__pycache__" not in p.parts}


def _package_data() -> set[str]:
  """The data files a packaged config reads (the d4rl config's behaviour policies) and the PEP 561 marker."""
  folder = ROOT / "primal_jax" / "tasks" / "offline_rl" / "policies"
  policies = {p.relative_to(ROOT).as_posix() for p in folder.rglob("*.*")}
  assert any(n.endswith("hopper/medium.npz") for n in policies) and any(n.endswith(".json") for n in policies)
  return policies | {"primal_jax/py.typed"}


def test_no_library_path_points_outside_the_package():
  """What a packaged config reads ships with the package: no module reaches into the checkout around it."""
  for path in (ROOT / "primal_jax").rglob("*.py"):
    text = path.read_text()
    assert "parents[" not in text and ".parent.parent" not in text, path
    assert '"experiments"' not in text and "'experiments'" not in text, path


def test_wheel_ships_the_library_its_marker_and_license_and_nothing_else(dist):
  names = set(zipfile.ZipFile(dist["wheel"]).namelist())
  info = f"primal_jax-{primal_jax.__version__}.dist-info"
  assert {f"{info}/licenses/LICENSE", f"{info}/METADATA", f"{info}/entry_points.txt"} <= names
  assert {n for n in names if not n.startswith(info)} == _modules() | _package_data()
  assert not any(n.startswith(("tests/", "experiments/", "benchmarks/", "notebooks/", "docs/")) for n in names)
  license_text = zipfile.ZipFile(dist["wheel"]).read(f"{info}/licenses/LICENSE").decode()
  assert "Apache License\n                           Version 2.0, January 2004" in license_text
  assert "END OF TERMS AND CONDITIONS" in license_text  # the full text, not a pointer to it
  entry_points = zipfile.ZipFile(dist["wheel"]).read(f"{info}/entry_points.txt").decode()
  assert "primal-train = primal_jax.cli.train:run" in entry_points
  assert "primal-convert = primal_jax.convert.cli:main" in entry_points
  assert "primal-generate = primal_jax.cli.generate:main" in entry_points


def test_sdist_holds_the_library_and_its_records_but_not_the_tests(dist):
  with tarfile.open(dist["sdist"]) as tar:
    prefix = f"primal_jax-{primal_jax.__version__}/"
    names = {m.name.removeprefix(prefix) for m in tar.getmembers() if m.isfile()}
  assert set(TOP_FILES) <= names
  assert _modules() | _package_data() <= names
  assert not any(n.startswith("tests/") for n in names)


def test_metadata_name_version_license_python_and_extras(dist):
  with zipfile.ZipFile(dist["wheel"]) as whl:
    text = whl.read(f"primal_jax-{primal_jax.__version__}.dist-info/METADATA").decode()
  meta = email.parser.Parser().parsestr(text)
  assert meta["Name"] == "primal-jax"
  assert meta["Version"] == primal_jax.__version__ == "0.1.0"
  assert meta["License"] == "Apache-2.0" and meta["License-File"] == "LICENSE"
  assert meta["Requires-Python"] == ">=3.10"
  assert "Typing :: Typed" in meta.get_all("Classifier")
  assert set(meta.get_all("Provides-Extra")) == EXTRAS
  requires = meta.get_all("Requires-Dist")
  core = {r.split(";")[0].split("<")[0].split(">")[0] for r in requires if "extra ==" not in r}
  assert core == {"jax", "flax", "numpy", "optax", "chex"}  # the library alone needs only these
  assert any(r.startswith("sphinx") and 'extra == "docs"' in r for r in requires)
  assert meta["Description-Content-Type"] == "text/markdown" and meta.get_payload().startswith("# primal_jax")


def test_twine_check_passes(dist):
  result = subprocess.run(
    [sys.executable, "-m", "twine", "check", "--strict", str(dist["wheel"]), str(dist["sdist"])],
    capture_output=True, text=True,
  )  # fmt: skip
  assert result.returncode == 0, result.stdout + result.stderr
  assert result.stdout.count("PASSED") == 2


def test_citation_prefers_the_paper():
  cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
  assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
  assert cff["version"] == primal_jax.__version__ and cff["license"] == "Apache-2.0"
  paper = cff["preferred-citation"]
  assert paper["type"] == "conference-paper" and paper["year"] == 2023
  assert paper["title"] == "Primal-Attention: Self-attention through Asymmetric Kernel SVD in Primal Representation"
  assert [a["family-names"] for a in paper["authors"]] == ["Chen", "Tao", "Tonin", "Suykens"]
  assert "NeurIPS 2023" in paper["collection-title"]


def test_changelog_has_this_version():
  assert f"\n## {primal_jax.__version__}\n" in (ROOT / "CHANGELOG.md").read_text()
