"""benchmarks/accelerator.py on the CPU at tiny sizes: one command runs the decoding benchmark and the efficiency
benchmark in both dtypes, and writes records naming the device; an existing record folder is refused."""

from __future__ import annotations

import json

import pytest

from benchmarks import accelerator

TINY = [
  "--triad_elements=4096", "--peak_size=64",
  "--decoding=--contexts=24", "--decoding=--layers=2", "--decoding=--dim=16", "--decoding=--heads=2",
  "--decoding=--low_rank=3", "--decoding=--batch=1", "--decoding=--steps=20", "--decoding=--repeats=5",
  "--decoding=--prefill_context=16", "--decoding=--prefill_chunk=8", "--decoding=--e2e_prompt=8",
  "--decoding=--e2e_new=2", "--decoding=--scaling_batches=1,2", "--decoding=--scaling_context=24",
  "--decoding=--triad_elements=4096", "--decoding=--peak_size=64",
  "--efficiency=--lengths=128", "--efficiency=--long_lengths=", "--efficiency=--steps=1", "--efficiency=--repeats=1",
  "--efficiency=--warmup_steps=1", "--efficiency=--batch_size=2", "--efficiency=--peak_size=64",
  "--efficiency=--set=model.attention.primal.rank_multi=2",
]  # fmt: skip


def test_commands_run_decoding_then_efficiency_in_both_dtypes(tmp_path):
  runs = accelerator.commands(tmp_path, "quick", ["--batch=1"], ["--steps=2"])
  assert [run[2] for run in runs] == ["benchmarks.decoding", "benchmarks.efficiency", "benchmarks.efficiency"]
  assert runs[0][-2:] == ["--batch=1", f"--out={tmp_path / 'decoding'}"]  # extra flags come last: they win
  for run, dtype in zip(runs[1:], accelerator.DTYPES, strict=True):
    assert "--variants=softmax_dpa,primalformer" in run and f"--set=model.dtype={dtype}" in run and "--no-rss" in run
    assert run[-1] == f"--out={tmp_path / f'efficiency_{dtype}'}"
  gpu = accelerator.commands(tmp_path, "full", [], [], platform="gpu")
  assert [run[-1] for run in gpu[:2]] == [f"--out={tmp_path / 'decoding'}", f"--out={tmp_path / 'decoding_dpa'}"]
  assert "--softmax_impl=dot_product_attention" in gpu[1] and len(gpu) == 4


def test_an_existing_record_folder_is_refused(tmp_path, capsys):
  (tmp_path / "device.json").write_text("{}")
  with pytest.raises(SystemExit) as exit_info:
    accelerator.main([f"--out={tmp_path}", "--dry_run"])
  assert exit_info.value.code == 2 and "never overwritten" in capsys.readouterr().err


@pytest.mark.slow
def test_tiny_run_on_the_cpu_writes_records_naming_the_device(tmp_path):
  out = tmp_path / "run"
  assert accelerator.main([f"--out={out}", "--quick", *TINY]) == 0
  device = json.loads((out / "device.json").read_text())
  assert device["platform"] == "cpu" and device["device_kind"] and device["bandwidth_bytes_per_s"] > 0
  assert set(device["matmul_peak"]) == {"float32", "bfloat16"} and all(r["returncode"] == 0 for r in device["runs"])
  assert device["provenance"]["commit"] == device["git_commit"] and device["provenance"]["versions"]["flax"]
  decoding = json.loads((out / "decoding" / "decoding.json").read_text())
  assert decoding["meta"]["platform"] == "cpu" and decoding["meta"]["softmax_impl"] == "einsum"
  for dtype in accelerator.DTYPES:
    efficiency = json.loads((out / f"efficiency_{dtype}" / "efficiency.json").read_text())
    assert efficiency["meta"]["platform"] == "cpu" and efficiency["meta"]["device_kind"]
    assert efficiency["meta"]["provenance"]["commit"] == efficiency["meta"]["git_commit"]
    assert {r["variant"] for r in efficiency["records"] if not r.get("error")} == {"softmax_dpa", "primalformer"}
    assert f"'model.dtype', '{dtype}'" in str(efficiency["meta"]["args"]["set"])
