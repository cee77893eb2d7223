"""primal_jax.provenance: what every record says produced it (issue 29)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from primal_jax import provenance

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh_snapshot():
  """`checkout` is read once per process: each test here starts and ends without a snapshot."""
  provenance.checkout.cache_clear()
  yield
  provenance.checkout.cache_clear()


def test_git_commit_is_this_checkouts_head_unless_named(monkeypatch):
  """Records name the commit they ran; a tree copied without its history (an accelerator host) names it."""
  monkeypatch.delenv(provenance.COMMIT_ENV, raising=False)
  head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
  assert provenance.git_commit() == (head.stdout.strip() or None)
  monkeypatch.setenv(provenance.COMMIT_ENV, "0123abc")
  assert provenance.git_commit() == "0123abc" and provenance.git_dirty() is None


def test_the_commit_is_read_once_per_process(monkeypatch, fresh_snapshot):
  """A sweep that runs for hours names the code it loaded, not a commit made in its checkout meanwhile."""
  monkeypatch.delenv(provenance.COMMIT_ENV, raising=False)
  replies = {"rev-parse": "a" * 40, "status": ""}
  monkeypatch.setattr(provenance, "_git", lambda *args: replies[args[0]])
  assert provenance.checkout() == ("a" * 40, False)
  replies.update({"rev-parse": "b" * 40, "status": " M primal_jax/loop.py"})  # the checkout moves on
  origin = provenance.provenance(["prog", "--flag=1"], devices=False)
  assert (origin["commit"], origin["dirty"], origin["argv"]) == ("a" * 40, False, ["prog", "--flag=1"])
  assert "devices" not in origin and origin["versions"]["jax"] == jax.__version__


def test_a_dirty_tree_is_recorded_as_dirty(monkeypatch, fresh_snapshot):
  monkeypatch.delenv(provenance.COMMIT_ENV, raising=False)
  monkeypatch.setattr(provenance, "_git", lambda *args: {"rev-parse": "c" * 40, "status": " M x.py"}[args[0]])
  origin = provenance.provenance([])
  assert origin["dirty"] is True and origin["devices"]["platform"] == jax.devices()[0].platform
  assert origin["date"].endswith("+00:00") and origin["versions"]["python"]


def test_the_default_matmul_precision_is_recorded(fresh_snapshot):
  """On a GPU the default precision decides float32 against TF32 passes: a record names the one it ran under."""
  with jax.default_matmul_precision(None):
    assert provenance.device_summary()["matmul_precision"] is None  # the platform's default
  with jax.default_matmul_precision("highest"):
    assert provenance.provenance([])["devices"]["matmul_precision"] == "highest"


def test_the_cores_a_pinned_process_may_use_are_recorded(fresh_snapshot):
  """A run pinned to one core (`taskset -c 0`) says so beside the host's CPU count: its wall time is one core's."""
  script = (
    "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); from primal_jax import provenance; "
    "print(provenance.provenance([], devices=False)['host']['cores'])"
  )
  pinned = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
  assert pinned.stdout.strip() == "1", pinned.stderr[-2000:]
  host = provenance.provenance([], devices=False)["host"]
  assert host["cores"] == len(os.sched_getaffinity(0)) and host["cpus"] == os.cpu_count()


X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx fma avx2 avx512f avx512bw avx512vl avx512_bf16 sha_ni

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: another processor's block
flags\t\t: sse2
"""
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes sve
CPU implementer\t: 0x41
CPU part\t: 0xd0c
"""


def test_a_records_cpu_names_the_vector_extensions_xla_compiles_for():
  """Two hosts with other SIMD need not round a reduction alike: a record says which one it ran on."""
  x86 = provenance.parse_cpuinfo(X86_CPUINFO)
  assert x86 == {
    "vendor": "AuthenticAMD",
    "model_name": "AMD EPYC",
    "family": 25,
    "model": 17,
    "simd": ["avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16"],
  }
  arm = provenance.parse_cpuinfo(ARM_CPUINFO)
  assert arm == {"vendor": "0x41", "model_name": None, "family": None, "model": 0xD0C, "simd": ["asimd", "sve"]}
  assert provenance.parse_cpuinfo("") == {"vendor": None, "model_name": None, "family": None, "model": None, "simd": []}


def test_the_host_record_holds_this_machines_cpu(fresh_snapshot):
  host = provenance.provenance([], devices=False)["host"]
  if provenance.CPUINFO.exists():
    assert host["cpu"] == provenance.parse_cpuinfo(provenance.CPUINFO.read_text())
    flags = next(line for line in provenance.CPUINFO.read_text().splitlines() if line.startswith(("flags", "Features")))
    assert ("avx2" in flags.split()) == ("avx2" in host["cpu"]["simd"])
  else:
    assert host["cpu"]["simd"] == []


def test_a_sweeps_own_result_tables_leave_the_tree_clean(tmp_path, monkeypatch, fresh_snapshot):
  """A sweep rewrites its tracked results.md after each run; the next run's record was marked dirty for it
  (2026-12-06: a Table 4 control seed). Records under experiments/results and benchmarks/results are not code."""
  monkeypatch.delenv(provenance.COMMIT_ENV, raising=False)
  repo = tmp_path / "repo"
  for path in ("primal_jax/x.py", "experiments/results/d4rl/sweep/results.md", "benchmarks/results/b/r.json"):
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text("0\n")
  git = lambda *args: subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)  # noqa: E731
  git("init", "-q")
  git("add", ".")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
  monkeypatch.setattr(provenance, "_PACKAGE", repo / "primal_jax")  # git runs in the package's checkout
  assert provenance.git_dirty() is False
  (repo / "experiments/results/d4rl/sweep/results.md").write_text("1\n")
  (repo / "benchmarks/results/b/r.json").write_text("1\n")
  assert provenance.git_dirty() is False
  (repo / "primal_jax/x.py").write_text("1\n")
  assert provenance.git_dirty() is True
