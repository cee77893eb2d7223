"""benchmarks/vs_release.py: its load and memory probes, the interleaved plan, the table, and end-to-end runs.

Our side runs end to end at a tiny size in every CI run; the release's side runs where an interpreter with
torch (PRIMAL_JAX_TORCH_PYTHON) and an extraction of the authors' repository (PRIMAL_JAX_RELEASE_DIR) are
given (docs/benchmarks.md says how to get both), and is skipped with that reason elsewhere: torch is never
one of this project's test dependencies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import release_step, vs_release
from benchmarks.harness import process
from experiments.engine.records import record_origin
from experiments.tables.vs_release import results_markdown, summary_markdown

TORCH_PYTHON = os.environ.get("PRIMAL_JAX_TORCH_PYTHON", "")
RELEASE_DIR = os.environ.get("PRIMAL_JAX_RELEASE_DIR", "")


def test_busy_seconds_count_busy_columns_only(tmp_path):
  stat = tmp_path / "stat"
  # user nice system idle iowait irq softirq steal: busy = 100 + 0 + 50 + 7 + 3 + 40 = 200 ticks.
  stat.write_text("cpu  100 0 50 900 20 7 3 40 0 0\ncpu0 1 2 3 4\n")
  assert process.machine_busy_seconds(stat) == pytest.approx(200 / os.sysconf("SC_CLK_TCK"))
  stat.write_text("intr 1 2 3\n")
  assert process.machine_busy_seconds(stat) is None


def test_timed_with_load_measures_the_call():
  sample = process.timed_with_load(lambda: sum(range(200_000)))
  assert sample["seconds"] > 0
  assert sample["own_cores"] >= 0
  assert sample["other_cores"] is None or sample["other_cores"] >= 0


def test_mapped_allocator_reads_the_memory_map(tmp_path):
  maps = tmp_path / "maps"
  maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10\n")
  assert process.mapped_allocator(maps) == "tcmalloc"
  maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
  assert process.mapped_allocator(maps) == "system"
  assert process.mapped_allocator(tmp_path / "missing") == "system"


def test_plan_interleaves_sides_and_covers_every_cell():
  args = vs_release.parse_args(["--sides=ours", "--lengths=1024,2048", "--allocators=system,tcmalloc", "--rounds=2"])
  args.sides = ["release", "ours"]
  jobs = vs_release.plan(args)
  assert len(jobs) == 2 * 2 * 2 * 2 * 2  # rounds x allocators x lengths x models x sides
  firsts = [jobs[i]["side"] for i in range(0, len(jobs), 2)]
  assert firsts[:4] == ["release", "ours", "release", "ours"]  # the first side alternates
  cells = {(j["round"], j["allocator"], j["seq_len"], j["model"], j["side"]) for j in jobs}
  assert len(cells) == len(jobs)


def test_release_config_follows_run_tasks_time_memory():
  class LraConfig:  # the shape of the release's lra_config.config
    config = {
      "listops": {
        "model": {"vocab_size": 32, "max_seq_len": 2000, "num_classes": 10},
        "extra_attn_config": {"primal_cos": {"attention_grad_checkpointing": False}, "softmax": {}},
      }
    }

  args = release_step.parse_args(["--release_dir=x", "--model=primalformer", "--seq_len=1000"])
  config = release_step.release_config(LraConfig, "primalformer", 1000, args)
  assert config["max_seq_len"] == 1024 and config["attn_type"] == "primal_cos"
  assert (config["low_rank"], config["rank_multi"], config["eta"], config["trace_no_x"]) == (20, 10, 0.1, True)
  assert config["mixed_precision"] is False
  assert LraConfig.config["listops"]["model"]["max_seq_len"] == 2000  # the release's dict is left alone


def _record(side, seconds, other, **extra):
  steps = [{"seconds": s, "other_cores": other, "own_cores": 2.0, "loadavg_1m": 0.1} for s in seconds]
  return dict(
    round=0, allocator="system", seq_len=1024, model="primalformer", side=side, steps=steps, losses=[2.3],
    peak_rss_bytes=300 * 2**20, allocator_mapped="system", **extra,
  )  # fmt: skip


def test_markdown_ratio_load_and_peak_fraction():
  results = {
    "meta": {
      "date": "2026-01-01T00:00:00",
      "git_commit": "abc",
      "machine": "x86_64",
      "cpu_count": 2,
      "load_average_start": [0.5, 0, 0],
      "load_average_end": [0.7, 0, 0],
      "args": {"steps": 3, "warmup_steps": 1, "rounds": 1, "task": "listops", "batch_size": 8, "threads": 2},
    },
    "records": [
      _record("release", [0.40, 0.50, 0.45], 0.0, versions={"torch": "2.13.0"}),
      # 1 GFLOP per step at a 0.2 s median, peak 10 GFLOP/s: 50% of the peak.
      _record("ours", [0.20, 0.30, 0.10], 0.25, flops_per_step=1e9, matmul_peak={"flops_per_s": 1e10}),
    ],
  }
  table = results_markdown(results)
  row = next(line for line in table.splitlines() if "primalformer" in line)
  cells = [c.strip() for c in row.strip("|").split("|")]
  assert cells[3] == "0.450 (0.450)" and cells[4] == "0.200 (0.200)"
  assert cells[5] == "2.25"  # release / primal_jax
  assert cells[6] == "0.00 (0.00) / 0.25 (0.25)"
  assert cells[8] == "50%"
  assert "torch 2.13.0" in table and "load average 0.5" in table


def test_summary_leaves_out_a_contended_cell_and_names_it():
  """A cell timed while other processes kept more than BUSY_CORES busy takes no part in the summary's ranges."""
  meta = {"date": "2026-01-01T00:00:00", "git_commit": "abc", "args": {"threads": 2}}
  records = [
    _record("release", [0.40], 0.0),
    _record("ours", [0.20], 0.0),  # N 1024: 2.00x
    {**_record("release", [0.80], 0.0), "seq_len": 2048},
    {**_record("ours", [0.50], 0.0), "seq_len": 2048},  # 1.60x
    {**_record("release", [1.60], 0.0), "seq_len": 4096},
    {**_record("ours", [2.00], 0.38), "seq_len": 4096},  # 0.80x, contended
  ]
  text = summary_markdown({"meta": meta, "records": records})
  assert "primalformer 1.60-2.00x with glibc malloc." in text
  assert "glibc malloc N=4096 primalformer (ours 0.38)." in text
  calm = {**records[5], "steps": [{**records[5]["steps"][0], "other_cores": 0.1}]}
  quiet = summary_markdown({"meta": meta, "records": records[:5] + [calm]})
  assert "primalformer 0.80-2.00x with glibc malloc." in quiet and "Left out" not in quiet


def _run_tiny(tmp_path, sides):
  argv = [
    "-m", "benchmarks.vs_release", f"--sides={sides}", "--models=primalformer", "--lengths=256", "--steps=2",
    "--warmup_steps=1", "--rounds=1", "--allocators=system", "--peak_size=128", f"--out={tmp_path}",
  ]  # fmt: skip
  if "release" in sides:
    argv += [f"--torch_python={TORCH_PYTHON}", f"--release_dir={RELEASE_DIR}"]
  root = Path(vs_release.__file__).resolve().parents[1]
  proc = subprocess.run([sys.executable, *argv], cwd=root, capture_output=True, text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  results = json.loads((tmp_path / "vs_release.json").read_text())
  assert record_origin(results).devices == {"platform": "cpu", "kind": "cpu"}
  assert (tmp_path / "vs_release.md").read_text().count("| system | 256 | primalformer |") == 1
  return results["records"]


@pytest.mark.slow
def test_ours_end_to_end_at_a_tiny_size(tmp_path):
  (record,) = _run_tiny(tmp_path, "ours")
  assert "error" not in record, record.get("error")
  assert record["side"] == "ours" and record["allocator"] == "system"
  assert len(record["steps"]) == 2 and all(s["seconds"] > 0 for s in record["steps"])
  assert record["devices"]["platform"] == "cpu"  # the record's meta takes it (the provenance check reads it)
  assert all(2.0 < loss < 2.7 for loss in record["losses"])  # cross-entropy near log(10) after 3 steps
  assert record["flops_per_step"] > 1e8 and record["matmul_peak"]["flops_per_s"] > 0
  assert record["threads"]["cores"] and "--xla_cpu_multi_thread_eigen=true" in record["threads"]["xla_flags"]


@pytest.mark.slow
@pytest.mark.skipif(
  not (TORCH_PYTHON and RELEASE_DIR),
  reason="the release's side needs PRIMAL_JAX_TORCH_PYTHON (a python with torch) and PRIMAL_JAX_RELEASE_DIR",
)
def test_both_sides_end_to_end_at_a_tiny_size(tmp_path):
  records = _run_tiny(tmp_path, "release,ours")
  assert [r["side"] for r in records] == ["release", "ours"]
  for record in records:
    assert "error" not in record, record.get("error")
    assert len(record["steps"]) == 2 and record["peak_rss_bytes"] > 0
    assert all(2.0 < loss < 2.7 for loss in record["losses"])
  release = records[0]
  assert release["attn_type"] == "primal_cos" and release["threads"]["torch_num_threads"] == 2
  # Same model size on both sides: the release's parameters minus its positional table rows beyond N.
  assert abs(release["num_params"] - records[1]["num_params"]) < 0.05 * release["num_params"]
