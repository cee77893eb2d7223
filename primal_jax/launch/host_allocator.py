"""Choose the host memory allocator (glibc malloc, tcmalloc or jemalloc) of a CPU run.

Why: XLA's CPU runtime allocates every temporary buffer of a step afresh. With
glibc malloc, buffers above its mmap threshold are mapped and unmapped on every
step, so each step pays page faults on all of its large temporaries: the
memory-bound loop fusions of the small LRA models then run at about 1 GB/s.
tcmalloc keeps freed pages for reuse. On the 2-core development machine it made
the PrimalFormer LRA step at N = 4096, batch 8, 1.5-2.4x faster and the softmax
Transformer's about 2.5x faster (`python -m benchmarks.efficiency --allocator=...`).
GPU and TPU device memory is not affected.

An allocator can only be chosen when the process starts (`LD_PRELOAD`), so
`ensure_allocator` re-executes the current command line with the library
preloaded. The library must be installed, e.g. Debian/Ubuntu
`apt-get install libtcmalloc-minimal4` (or `libjemalloc2`).

"auto", the training binary's default, is the fast path without asking: the
allocator already loaded, else tcmalloc where it is installed, else glibc's
malloc (nothing breaks without the library; `speed_hint` says once per run how
to get it). The allocator changes where buffers live, not what is computed:
a run's metrics are bit-identical under tcmalloc and glibc malloc
(`tests/test_host_allocator.py`).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

ALLOCATORS = ("system", "tcmalloc", "jemalloc")
CHOICES = ("auto", *ALLOCATORS)  # what `--allocator` accepts
AUTO_LIBRARY = "tcmalloc"  # the fastest of the three for XLA:CPU steps here (docs/benchmarks.md)
# Shared-object names per allocator, in order of preference; "system" preloads nothing.
LIBRARY_NAMES = {
  "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"),
  "jemalloc": ("libjemalloc.so.2",),
}
PACKAGES = {"tcmalloc": "libtcmalloc-minimal4", "jemalloc": "libjemalloc2"}
# Set before re-executing, so a preload that did not take is an error instead of an exec loop.
REEXEC_MARKER = "PRIMAL_JAX_ALLOCATOR_REEXEC"


def _check_name(name: str) -> str:
  if name not in ALLOCATORS:
    raise ValueError(f"allocator must be one of {', '.join(ALLOCATORS)}, got {name!r}")
  return name


def library_dirs() -> list[Path]:
  """Directories searched for the allocator libraries (the platform's multiarch ones first)."""
  multiarch = sysconfig.get_config_var("MULTIARCH") or ""
  candidates = [f"/usr/lib/{multiarch}" if multiarch else "", "/usr/lib64", "/usr/lib", "/usr/local/lib"]
  candidates += [str(Path(sys.prefix) / "lib")]
  return [Path(c) for c in candidates if c and Path(c).is_dir()]


def find_library(name: str, search_dirs: Sequence[Path] | None = None) -> Path | None:
  """The shared object of allocator `name`, or None if it is not installed ("system": None)."""
  if _check_name(name) == "system":
    return None
  for directory in library_dirs() if search_dirs is None else search_dirs:
    for soname in LIBRARY_NAMES[name]:
      if (Path(directory) / soname).is_file():
        return Path(directory) / soname
  return None


def loaded_allocator(maps_path: str | Path = "/proc/self/maps") -> str:
  """Which allocator this process runs with: "tcmalloc", "jemalloc" or "system" (neither mapped).

  Reads the process's memory map; where there is none (not Linux), reports "system".
  """
  try:
    maps = Path(maps_path).read_text()
  except OSError:
    return "system"
  for name in ("tcmalloc", "jemalloc"):
    if any(f"lib{name}" in line for line in maps.splitlines()):
      return name
  return "system"


def preload_environment(library: Path, environ: dict[str, str] | None = None) -> dict[str, str]:
  """A copy of `environ` with `library` first in LD_PRELOAD and the re-exec marker set."""
  env = dict(os.environ if environ is None else environ)
  existing = [p for p in env.get("LD_PRELOAD", "").split(":") if p and p != str(library)]
  env["LD_PRELOAD"] = ":".join([str(library), *existing])
  env[REEXEC_MARKER] = "1"
  return env


def command_line() -> list[str]:
  """The interpreter and arguments that started this process (`python -m pkg.mod ...` kept as such)."""
  return [sys.executable, *sys.orig_argv[1:]]


def auto_choice() -> str:
  """The allocator "auto" stands for: the one already loaded, else tcmalloc if installed, else "system".

  After a re-exec whose preload did not take (the marker is set, tcmalloc still unmapped) it is "system":
  "auto" runs as it can and never loops.
  """
  loaded = loaded_allocator()
  if loaded != "system" or os.environ.get(REEXEC_MARKER):
    return loaded
  return AUTO_LIBRARY if find_library(AUTO_LIBRARY) is not None else "system"


def auto_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
  """`environ` for a child process that would choose "auto": with tcmalloc preloaded where it is installed.

  The sweep runner starts its training processes with it, so they do not each re-execute themselves.
  """
  env = dict(os.environ if environ is None else environ)
  if env.get("LD_PRELOAD") or env.get(REEXEC_MARKER):
    return env  # the caller preloads something already (or a preload failed): leave it as it is
  library = find_library(AUTO_LIBRARY)
  return env if library is None else preload_environment(library, env)


def speed_hint(platform: str) -> str | None:
  """One line for a CPU run under glibc malloc where tcmalloc is not installed (None otherwise)."""
  if platform != "cpu" or loaded_allocator() != "system" or find_library(AUTO_LIBRARY) is not None:
    return None
  return (
    "the host allocator is glibc malloc: CPU training steps ran faster with tcmalloc in our benchmarks "
    f"(docs/benchmarks.md; Debian/Ubuntu: apt-get install {PACKAGES[AUTO_LIBRARY]}; --allocator=auto then uses it)"
  )


def ensure_allocator(name: str, argv: Sequence[str] | None = None) -> str:
  """Make this process run with allocator `name`, re-executing `argv` with it preloaded if needed.

  Returns the allocator in use when nothing had to change. "system" never
  re-executes (a preloaded allocator stays: it cannot be unloaded); "auto" is
  `auto_choice()`. Raises ValueError for an unknown name, a library that is
  not installed, or a preload that did not take effect after re-executing
  (never for "auto").
  """
  if name == "auto":
    name = auto_choice()
  loaded = loaded_allocator()
  if _check_name(name) == "system" or loaded == name:
    return loaded
  if loaded != "system":
    raise ValueError(
      f"allocator {name!r}: this process already runs with {loaded} (LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r}), "
      "which cannot be swapped; start it without that preload"
    )
  if os.environ.get(REEXEC_MARKER):
    raise ValueError(
      f"allocator {name!r}: re-executed with LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r}, but {name} is "
      "still not mapped into the process"
    )
  library = find_library(name)
  if library is None:
    dirs = ", ".join(str(d) for d in library_dirs())
    raise ValueError(
      f"allocator {name!r}: none of {', '.join(LIBRARY_NAMES[name])} found in {dirs}; install it (Debian/Ubuntu: "
      f"apt-get install {PACKAGES[name]}) or pass allocator 'system'"
    )
  argv = list(command_line() if argv is None else argv)
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(argv[0], argv, preload_environment(library))
  raise AssertionError("unreachable: execve returned")  # pragma: no cover
