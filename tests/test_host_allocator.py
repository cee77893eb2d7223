"""Choosing the host allocator: library search, detection from the memory map, and the real re-exec."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from primal_jax.launch import host_allocator as ha

ROOT = Path(__file__).resolve().parents[1]


def test_unknown_allocator_is_rejected_by_name():
  for call in (lambda: ha.find_library("mimalloc"), lambda: ha.ensure_allocator("mimalloc")):
    with pytest.raises(ValueError, match="allocator must be one of system, tcmalloc, jemalloc, got 'mimalloc'"):
      call()


def test_find_library_searches_the_given_directories(tmp_path):
  assert ha.find_library("jemalloc", [tmp_path]) is None
  (tmp_path / "libjemalloc.so.2").write_bytes(b"")
  (tmp_path / "libtcmalloc.so.4").write_bytes(b"")
  assert ha.find_library("jemalloc", [tmp_path]) == tmp_path / "libjemalloc.so.2"
  assert ha.find_library("tcmalloc", [tmp_path]) == tmp_path / "libtcmalloc.so.4"  # the full one if no minimal
  (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")
  assert ha.find_library("tcmalloc", [tmp_path]) == tmp_path / "libtcmalloc_minimal.so.4"
  assert ha.find_library("system", [tmp_path]) is None


def test_loaded_allocator_reads_the_memory_map(tmp_path):
  maps = tmp_path / "maps"
  line = "7f00-7f01 r-xp 00000000 08:01 1234 {}\n"
  maps.write_text(line.format("/usr/lib/x86_64-linux-gnu/libc.so.6"))
  assert ha.loaded_allocator(maps) == "system"
  maps.write_text(maps.read_text() + line.format("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10"))
  assert ha.loaded_allocator(maps) == "tcmalloc"
  maps.write_text(line.format("/usr/lib/libjemalloc.so.2"))
  assert ha.loaded_allocator(maps) == "jemalloc"
  assert ha.loaded_allocator(tmp_path / "missing") == "system"


def test_this_process_reports_what_ld_preload_says():
  preload = os.environ.get("LD_PRELOAD", "")
  expected = next((n for n in ("tcmalloc", "jemalloc") if f"lib{n}" in preload), "system")
  assert ha.loaded_allocator() == expected


def test_preload_environment_puts_the_library_first_once():
  env = ha.preload_environment(Path("/x/libjemalloc.so.2"), {"LD_PRELOAD": "/y/liba.so:/x/libjemalloc.so.2", "A": "1"})
  assert env["LD_PRELOAD"] == "/x/libjemalloc.so.2:/y/liba.so"
  assert env["A"] == "1" and env[ha.REEXEC_MARKER] == "1"
  assert ha.preload_environment(Path("/x/l.so"), {})["LD_PRELOAD"] == "/x/l.so"


def test_missing_library_and_failed_preload_are_clear_errors(monkeypatch):
  monkeypatch.setattr(ha, "loaded_allocator", lambda: "system")
  monkeypatch.setattr(ha, "find_library", lambda name: None)
  with pytest.raises(ValueError, match="apt-get install libjemalloc2"):
    ha.ensure_allocator("jemalloc")
  monkeypatch.setenv(ha.REEXEC_MARKER, "1")
  with pytest.raises(ValueError, match="still not mapped"):
    ha.ensure_allocator("jemalloc")
  assert ha.ensure_allocator("system") == "system"  # never re-executes
  monkeypatch.setattr(ha, "loaded_allocator", lambda: "tcmalloc")
  with pytest.raises(ValueError, match="already runs with tcmalloc"):
    ha.ensure_allocator("jemalloc")
  assert ha.ensure_allocator("tcmalloc") == ha.ensure_allocator("system") == "tcmalloc"


@pytest.mark.parametrize("name", ["tcmalloc", "jemalloc"])
def test_ensure_allocator_reexecutes_with_the_library_preloaded(name):
  if ha.find_library(name) is None:
    pytest.skip(f"{name} is not installed here (apt-get install {ha.PACKAGES[name]})")
  code = (
    "import os, json, sys; from primal_jax.launch import host_allocator as h; "
    "print('start', flush=True); h.ensure_allocator(sys.argv[1]); "
    "print(json.dumps({'loaded': h.loaded_allocator(), 'argv': sys.argv[1:], 'preload': os.environ['LD_PRELOAD']}))"
  )
  env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", ha.REEXEC_MARKER)}
  result = subprocess.run(
    [sys.executable, "-c", code, name, "extra"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
  )
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.strip().splitlines()
  assert lines[:2] == ["start", "start"]  # the script ran twice: before and after the exec
  report = json.loads(lines[-1])
  assert report["loaded"] == name and report["argv"] == [name, "extra"]
  assert report["preload"] == str(ha.find_library(name))


def test_auto_is_what_is_loaded_else_tcmalloc_where_installed_else_system(monkeypatch):
  monkeypatch.delenv(ha.REEXEC_MARKER, raising=False)
  monkeypatch.setattr(ha, "loaded_allocator", lambda: "jemalloc")
  assert ha.auto_choice() == "jemalloc"  # a preload the user chose is kept
  monkeypatch.setattr(ha, "loaded_allocator", lambda: "system")
  monkeypatch.setattr(ha, "find_library", lambda name: Path(f"/lib/lib{name}.so") if name == "tcmalloc" else None)
  assert ha.auto_choice() == "tcmalloc"
  monkeypatch.setattr(ha, "find_library", lambda name: None)
  assert ha.auto_choice() == "system" and ha.ensure_allocator("auto") == "system"  # missing: runs, no error
  monkeypatch.setattr(ha, "find_library", lambda name: Path(f"/lib/lib{name}.so"))
  monkeypatch.setenv(ha.REEXEC_MARKER, "1")  # re-executed, yet tcmalloc is not mapped: run as is, never loop
  assert ha.auto_choice() == "system" and ha.ensure_allocator("auto") == "system"
  with pytest.raises(ValueError, match="allocator must be one of system, tcmalloc, jemalloc, got 'fast'"):
    ha.ensure_allocator("fast")


def test_speed_hint_only_for_a_cpu_run_without_tcmalloc(monkeypatch):
  monkeypatch.setattr(ha, "loaded_allocator", lambda: "system")
  monkeypatch.setattr(ha, "find_library", lambda name: None)
  hint = ha.speed_hint("cpu")
  assert "apt-get install libtcmalloc-minimal4" in hint and "--allocator=auto" in hint
  assert ha.speed_hint("gpu") is None and ha.speed_hint("tpu") is None  # device memory: not the host's malloc
  monkeypatch.setattr(ha, "find_library", lambda name: Path("/lib/libtcmalloc_minimal.so.4"))
  assert ha.speed_hint("cpu") is None
  monkeypatch.setattr(ha, "loaded_allocator", lambda: "jemalloc")
  monkeypatch.setattr(ha, "find_library", lambda name: None)
  assert ha.speed_hint("cpu") is None


def test_auto_environment_preloads_tcmalloc_for_children_unless_told_otherwise(monkeypatch):
  library = Path("/lib/libtcmalloc_minimal.so.4")
  monkeypatch.setattr(ha, "find_library", lambda name: library)
  env = ha.auto_environment({"A": "1"})
  assert env["LD_PRELOAD"] == str(library) and env[ha.REEXEC_MARKER] == "1" and env["A"] == "1"
  assert ha.auto_environment({"LD_PRELOAD": "/x/libjemalloc.so.2"}) == {"LD_PRELOAD": "/x/libjemalloc.so.2"}
  assert ha.auto_environment({ha.REEXEC_MARKER: "1"}) == {ha.REEXEC_MARKER: "1"}
  monkeypatch.setattr(ha, "find_library", lambda name: None)
  assert ha.auto_environment({"A": "1"}) == {"A": "1"}


def test_a_cpu_run_without_tcmalloc_is_told_once_how_to_get_it(jv_tfds_dir, tmp_path, monkeypatch):
  from primal_jax.cli.config_lookup import load_config
  from primal_jax.training.loop import train_and_evaluate

  monkeypatch.setattr(ha, "loaded_allocator", lambda maps_path=None: "system")
  monkeypatch.setattr(ha, "find_library", lambda name, search_dirs=None: None)
  config = load_config("uea:smoke", lock=False)
  config.data.data_dir, config.total_steps = jv_tfds_dir, 1
  lines = []
  train_and_evaluate(config, tmp_path, print_fn=lines.append)
  hints = [line for line in lines if line.startswith("note: the host allocator is glibc malloc")]
  assert len(hints) == 1 and "apt-get install libtcmalloc-minimal4" in hints[0]


def _train_smoke(data_dir, workdir, *extra):
  env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", ha.REEXEC_MARKER) and not k.startswith("JAX_")}
  args = [
    sys.executable, "-m", "experiments.main", "--config=uea:smoke", f"--workdir={workdir}",
    f"--config.data.data_dir={data_dir}", "--config.total_steps=2", *extra,
  ]  # fmt: skip
  result = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
  return result, json.loads((workdir / "summary.json").read_text())


def _metrics_without_times(workdir):
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [{k: v for k, v in row.items() if k != "wall_time"} for row in rows]  # the only field that may differ


@pytest.mark.slow
def test_training_binary_defaults_to_tcmalloc_and_computes_the_same_run(jv_tfds_dir, tmp_path):
  if ha.find_library("tcmalloc") is None:
    pytest.skip("tcmalloc is not installed here (apt-get install libtcmalloc-minimal4)")
  _, fast = _train_smoke(jv_tfds_dir, tmp_path / "auto")  # no --allocator: auto
  result, plain = _train_smoke(jv_tfds_dir, tmp_path / "system", "--allocator=system")
  assert (fast["host_allocator"], plain["host_allocator"]) == ("tcmalloc", "system")
  assert "note: the host allocator" not in result.stdout + result.stderr  # tcmalloc is installed: no hint
  rows = _metrics_without_times(tmp_path / "auto")
  assert any("loss" in row.get("scalars", {}) for row in rows)
  assert rows == _metrics_without_times(tmp_path / "system")  # bit for bit


def test_training_binary_reexecutes_with_the_allocator_and_records_it(jv_tfds_dir, tmp_path):
  if ha.find_library("tcmalloc") is None:
    pytest.skip("tcmalloc is not installed here (apt-get install libtcmalloc-minimal4)")
  _, summary = _train_smoke(jv_tfds_dir, tmp_path, "--allocator=tcmalloc")
  assert summary["host_allocator"] == "tcmalloc" and summary["steps"] == 2
