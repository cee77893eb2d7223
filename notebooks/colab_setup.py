# Setup: the first code cell of every notebook here is this file (notebooks/colab_setup.py; after editing it,
# `python tools/sync_notebook_setup.py` copies it into each notebook, and tests/test_notebooks.py checks they agree).
# It finds (or, on Colab, clones) the repository, installs the tested stack only when primal_jax is missing,
# and shows the devices and a batch split over all of them, which is how every notebook uses a TPU's cores.
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_URL = "https://github.com/<owner>/primal_jax.git"  # the one line a fork changes
JAX_VERSION = "0.10.2"  # the tested version (BUILD_NOTES.md)


def find_checkout(start):
  for directory in (start, *start.parents):
    if (directory / "setup.cfg").is_file() and (directory / "primal_jax").is_dir():
      return directory
  return None


REPO_ROOT = find_checkout(Path.cwd().resolve())
print("python", sys.version.split()[0], "at", sys.executable)
if importlib.util.find_spec("primal_jax") is not None and REPO_ROOT is not None:
  print("primal_jax is importable: installing nothing")
else:  # a fresh Colab runtime: clone, then install jax for this accelerator and the package with its extras
  if REPO_ROOT is None:
    subprocess.run(["git", "clone", "--depth=1", REPO_URL, "primal_jax"], check=True)
    REPO_ROOT = Path("primal_jax").resolve()
  if os.environ.get("COLAB_TPU_ADDR") or os.environ.get("TPU_ACCELERATOR_TYPE") or Path("/dev/accel0").exists():
    jax_req = f"jax[tpu]=={JAX_VERSION}"
  elif shutil.which("nvidia-smi"):
    jax_req = f"jax[cuda12]=={JAX_VERSION}"
  else:
    jax_req = f"jax=={JAX_VERSION}"
  if "jax" in sys.modules:  # a replaced module that is already imported is only reloaded by a new session
    raise RuntimeError("jax was imported before this cell: restart the session, then run all cells again")
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", jax_req, "-e", f"{REPO_ROOT}[train,rl]"], check=True)
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], check=True)
  importlib.invalidate_caches()
sys.path.insert(0, str(REPO_ROOT))  # experiments/ and benchmarks/ are imported from the checkout

import jax  # noqa: E402
import numpy as np  # noqa: E402

from primal_jax.training.sharding import batch_sharding, make_mesh  # noqa: E402

print("backend:", jax.default_backend())
print("devices:", jax.devices())
mesh = make_mesh((-1, 1))  # ("data", "model"): every device on the data axis
print("mesh", dict(mesh.shape))
example = jax.device_put(np.zeros((2 * jax.device_count(), 4), np.float32), batch_sharding(mesh))
print("a batch of", example.shape[0], "rows is split as", [s.data.shape for s in example.addressable_shards])
