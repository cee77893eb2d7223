"""benchmarks/decoding.py on a tiny model: the state sizes it reports are the caches' exact sizes, its tables
and plot are written, every model decodes at every batch size, and the synthetic fill puts every position
counter where a prefill would (no timing is asserted)."""

from __future__ import annotations

import argparse
import json
import os

import jax
import numpy as np
import pytest

from benchmarks import decoding
from primal_jax.models.lm import decode_step, init_cache

EXTRAS = ["--prefill_context=20", "--e2e_prompt=12", "--e2e_new=3", "--scaling_batches=1,2", "--scaling_context=24"]
NO_EXTRAS = ["--prefill_context=0", "--e2e_prompt=0", "--scaling_batches="]


@pytest.mark.parametrize(
  "fill, extras", [pytest.param("synthetic", True, marks=pytest.mark.slow), ("prefill", False)]
)  # fmt: skip
def test_tiny_run_reports_exact_state_sizes(tmp_path, fill, extras):
  decoding.main(["--contexts=24,48", "--layers=2", "--dim=16", "--heads=2", "--low_rank=3", "--batch=2,3",
                 "--steps=20", "--repeats=5", "--prefill_chunk=8", f"--fill={fill}", f"--out={tmp_path}",
                 "--triad_elements=4096", "--peak_size=64", *(EXTRAS if extras else NO_EXTRAS)])  # fmt: skip
  results = json.loads((tmp_path / "decoding.json").read_text())
  records = {(r["model"], r["batch"], r["seq_len"]): r for r in results["records"]}
  assert len(records) == 3 * 2 * 2
  for batch in (2, 3):
    for context in (24, 48):
      # KV cache: keys and values [batch, context, dim] float32 per layer, plus int32 cache indices and the position.
      kv = records["softmax_kv_cache", batch, context]["state_bytes"]
      assert 2 * 2 * batch * context * 16 * 4 <= kv <= 2 * 2 * batch * context * 16 * 4 + 64
      # Primal: running sums of q and k [batch, heads, p] and a count [batch] per layer, whatever the context.
      primal = records["primal_state", batch, context]["state_bytes"]
      assert primal == 2 * (2 * batch * 2 * 8 * 4 + batch * 4) + 4
      # Primal.+Trans. (2 layers): one KV-cache layer and one Primal layer.
      plus = records["primal_plus", batch, context]["state_bytes"]
      assert plus == (kv - 4) // 2 + 4 + (primal - 4) // 2
      assert all(records[v, batch, context]["ms_per_token"] > 0 for v in decoding.VARIANTS)
      assert all(records[v, batch, context]["call_ms"] > 0 for v in decoding.VARIANTS)  # the 1-step loop's call
      cores = len(os.sched_getaffinity(0))  # a process's CPU seconds per wall second cannot exceed its cores
      assert all(0 < records[v, batch, context]["cpu_per_wall"] <= cores + 0.05 for v in decoding.VARIANTS)
    # XLA's temporaries: the Primal step's do not grow with the context.
    temps = {v: [records[v, batch, c]["xla_temp_bytes"] for c in (24, 48)] for v in decoding.VARIANTS}
    assert temps["primal_state"][0] == temps["primal_state"][1] > 0
    # The roofline: a step reads its weights and its whole state; the bound is those bytes at the bandwidth.
    for variant in decoding.VARIANTS:
      for context in (24, 48):
        r = records[variant, batch, context]
        assert r["bytes_per_step"] == r["weight_bytes"] + r["state_bytes"]
        assert r["bound_ms"] == pytest.approx(1e3 * r["bytes_per_step"] / results["meta"]["bandwidth_bytes_per_s"])
        assert r["bound_fraction"] == pytest.approx(r["bound_ms"] / r["ms_per_token"])
        one = results["meta"]["one_thread_bandwidth_bytes_per_s"]
        assert r["one_thread_bound_ms"] == pytest.approx(1e3 * r["bytes_per_step"] / one)
        read = results["meta"]["read_bandwidth_bytes_per_s"]  # the read-only streams' rates and their best
        assert read["best"] == max(v for k, v in read.items() if k != "best")
        assert r["read_bound_ms"] == pytest.approx(1e3 * r["bytes_per_step"] / read["best"])
        # The bound at the step's own size: its bytes at the best stream over a buffer of that many bytes.
        sized = {s["bytes"]: s for s in results["meta"]["read_bandwidth_by_size"]}
        rate = sized[r["bytes_per_step"]]
        assert rate["best"] == max(v for k, v in rate.items() if k not in ("best", "bytes"))
        assert r["sized_read_bound_ms"] == pytest.approx(1e3 * r["bytes_per_step"] / rate["best"])
    # The weights: every parameter but the embedding tables, of which one row per sequence (token and position).
    args = argparse.Namespace(layers=2, dim=16, heads=2, low_rank=3)
    for variant in decoding.VARIANTS:
      params = decoding.build(variant, 48, args)[1]
      tables = (256 + 48) * 16 * 4
      total = sum(x.nbytes for x in jax.tree.leaves(params))
      assert records[variant, batch, 48]["weight_bytes"] == total - tables + batch * 2 * 16 * 4
  sizes = [s["bytes"] for s in results["meta"]["read_bandwidth_by_size"]]  # each step's size once, ascending
  assert sizes == sorted({r["bytes_per_step"] for r in results["records"]})
  text = (tmp_path / "decoding.md").read_text()
  assert text.count(" threads, ") == 2 * 3 * 2  # a cell per batch, model and context
  assert text.count("Fraction of the read-only bound at the step's own size") == 2  # a table per batch
  assert text.count("\n| ", text.index("GB/s of the read-only streams over a buffer")) >= len(sizes) + 1
  assert text.count("Milliseconds of one call of the 1-step loop") == 2  # a table per batch
  assert text.count("(1.00x)") >= 2 * 3 * 2 and "batch 3" in text and (tmp_path / "decoding.png").stat().st_size > 1000
  meta = results["meta"]
  assert meta["platform"] == "cpu" and meta["device_kind"] and meta["softmax_impl"] == "einsum"
  assert meta["bandwidth_bytes_per_s"] == max(meta["bandwidth_start_end"]) > 0
  assert meta["matmul_peak"]["flops_per_s"] > 0
  origin = meta["provenance"]  # what produced the record
  assert origin["commit"] == meta["git_commit"] and origin["devices"]["platform"] == "cpu"
  assert origin["versions"]["jax"] == jax.__version__ and origin["argv"] and origin["date"].endswith("+00:00")
  if not extras:
    assert not {"prefill", "e2e", "scaling"} & set(results) and "Chunked prefill" not in text
    return
  assert [(p["model"], p["tokens"]) for p in results["prefill"]] == [(v, 20) for v in decoding.VARIANTS]
  assert all(p["flops"] > 0 and p["seconds"] > 0 for p in results["prefill"])
  assert [(e["model"], e["prompt"], e["new_tokens"]) for e in results["e2e"]] == [(v, 12, 3) for v in decoding.VARIANTS]
  assert sorted((s["model"], s["batch"]) for s in results["scaling"]) == sorted(
    (v, b) for v in decoding.VARIANTS for b in (1, 2)
  )
  for title in ("Fraction of the bandwidth bound", "Chunked prefill", "End-to-end", "Tokens/s against the batch"):
    assert title in text
  # The batch-scaling roofline: the larger of the bytes at the bandwidth and XLA's FLOPs at the matmul peak.
  peak = meta["matmul_peak"]["flops_per_s"]
  for s in results["scaling"]:
    main = records[s["model"], 2, 24] if s["batch"] == 2 else None
    assert s["flops_per_step"] > 0 and s["bytes_per_step"] > 0
    if main is not None:  # the same model, batch and context as a main-grid record: the same sizes
      assert (s["bytes_per_step"], s["flops_per_step"]) == (main["bytes_per_step"], main["flops_per_step"])
    bound = 1e3 * max(s["bytes_per_step"] / meta["bandwidth_bytes_per_s"], s["flops_per_step"] / peak)
    assert s["bound_ms"] == pytest.approx(bound) and s["bound_fraction"] == pytest.approx(bound / s["ms_per_token"])
  flops = {(s["model"], s["batch"]): s["flops_per_step"] for s in results["scaling"]}
  assert all(flops[v, 2] > flops[v, 1] for v in decoding.VARIANTS)  # twice the tokens: more arithmetic
  assert "The batch-scaling roofline" in text and text.count("(1.0x)") >= 3


def test_synthetic_cache_sets_every_position_counter_as_a_prefill_does():
  args = argparse.Namespace(layers=2, dim=16, heads=2, low_rank=3)
  for variant in decoding.VARIANTS:
    model, params = decoding.build(variant, 32, args)
    prefilled = decode_step(model, params, init_cache(model, 2), np.zeros((2, 11), np.int32))[1]
    synthetic = decoding.synthetic_cache(init_cache(model, 2), 11)
    counters = (
      lambda cache: {  # noqa: E731
        jax.tree_util.keystr(path): np.asarray(leaf).tolist()
        for path, leaf in jax.tree_util.tree_leaves_with_path(cache)
        if jax.tree_util.keystr(path[-1:]) in ("['position']", "['index']", "['count']")
      }
    )
    assert counters(synthetic) == counters(prefilled) and counters(prefilled)
    assert jax.tree.structure(synthetic) == jax.tree.structure(prefilled)
    others = [leaf for leaf in jax.tree.leaves(synthetic) if leaf.dtype == np.float32 and leaf.ndim > 1]
    assert others and all(float(np.abs(leaf).max()) > 0 for leaf in others)


def test_the_fused_softmax_impl_decodes_in_the_benchmark(tmp_path):
  """`--softmax_impl=dot_product_attention` (the accelerator command's second decoding run) builds and decodes:
  the benchmark's models carry no dropout, which the fused impl refuses (it failed that way on an H200)."""
  decoding.main(["--contexts=24", "--layers=2", "--dim=16", "--heads=2", "--low_rank=3", "--batch=1", "--steps=20",
                 "--repeats=5", "--fill=synthetic", "--softmax_impl=dot_product_attention", f"--out={tmp_path}",
                 "--triad_elements=4096", "--peak_size=64", *NO_EXTRAS])  # fmt: skip
  results = json.loads((tmp_path / "decoding.json").read_text())
  assert results["meta"]["softmax_impl"] == "dot_product_attention"
  assert {r["model"] for r in results["records"]} == set(decoding.VARIANTS)


def test_fewer_than_two_steps_is_refused(capsys):
  """The time per token is the difference of a --steps and a 1-step loop, so --steps=1 cannot give one."""
  with pytest.raises(SystemExit):
    decoding.parse_args(["--steps=1", "--contexts=24"])
  assert "--steps must be >= 2" in capsys.readouterr().err


def test_an_existing_record_is_never_overwritten(tmp_path):
  (tmp_path / "decoding.json").write_text("{}")
  with pytest.raises(SystemExit, match="never overwritten"):
    decoding.main(["--contexts=24", "--steps=2", f"--out={tmp_path}"])
  assert (tmp_path / "decoding.json").read_text() == "{}"


def _runner(samples, rounds):
  """A runner that records the next (1-step, many-step) seconds of `rounds`, as prepared_runner's run() does."""
  pending = iter(rounds)

  def run():
    one, many = next(pending)
    samples["one"].append(one)
    samples["many"].append(many)
    return (many - one) / 3

  return run


def test_marginal_step_is_the_difference_of_the_best_repeats():
  """(best 4-step loop - best 1-step loop) / 3 on known seconds; a difference lost in noise gets more repeats."""
  args = argparse.Namespace(steps=4, repeats=2)
  clean = {"one": [], "many": []}
  noisy = {"one": [], "many": []}  # its first two repeats: the 1-step loop lost a time slice, the 4-step one not
  runners = {
    "clean": _runner(clean, [(1.0, 1.9), (1.1, 1.6), (1.0, 1.6), (1.0, 1.6)]),
    "noisy": _runner(noisy, [(2.0, 1.9), (2.1, 1.95), (1.0, 1.6), (1.2, 1.7)]),
  }
  out = decoding.marginal_times(runners, {"clean": clean, "noisy": noisy}, args, "test")
  assert len(clean["one"]) == 4  # a second round ran, for the noisy runner
  assert out["clean"] == pytest.approx((1.6 - 1.0) / 3) and out["noisy"] == pytest.approx((1.6 - 1.0) / 3)
  stuck = {"one": [], "many": []}
  with pytest.raises(RuntimeError, match="stuck B=1: the 4-step loop was not slower than the 1-step loop after 8"):
    decoding.marginal_times({"stuck": _runner(stuck, [(1.0, 1.0)] * 8)}, {"stuck": stuck}, args, "B=1")


def test_the_scaling_docs_table_renders_a_record_and_refuses_one_without_scaling(tmp_path, monkeypatch):
  from experiments.tables import decoding as tables

  meta = {"bandwidth_bytes_per_s": 50e9, "bandwidth_start_end": [41e9, 50e9], "matmul_peak": {"flops_per_s": 100e9}}
  meta |= {"git_commit": "abc", "date": "d"}
  scaling = [
    {"model": "m", "batch": 1, "seq_len": 64, "ms_per_token": 0.5, "bound_ms": 0.25, "bound_fraction": 0.5},
    {"model": "m", "batch": 8, "seq_len": 64, "ms_per_token": 1.0, "bound_ms": 0.5, "bound_fraction": 0.5},
  ]
  for name, record in (("with", {"meta": meta, "records": [], "scaling": scaling}), ("without", {"meta": meta})):
    (tmp_path / name).mkdir()
    (tmp_path / name / "decoding.json").write_text(json.dumps(record))
  monkeypatch.setattr(tables, "BENCHMARK_RESULTS", tmp_path)
  text = tables.docs_scaling_table("with", tmp_path)
  # Tokens/s: 2,000 at batch 1 and 8,000 at batch 8 (4.0x); the bound allows 8 / 0.5 over 1 / 0.25 = 4.0x.
  assert "| m | 2,000 (1.0x) | 8,000 (4.0x) |" in text
  assert "| m | 0.25 ms, 50% (1.0x) | 0.50 ms, 50% (4.0x) |" in text
  assert "Bandwidth 50.0 GB/s (in-place triad, the better of 41.0, 50.0 GB/s before and after the grid)" in text
  with pytest.raises(ValueError, match="no batch-scaling records"):
    tables.docs_scaling_table("without", tmp_path)


def test_the_sized_bound_table_renders_a_committed_record_and_refuses_one_without_it():
  """`decoding_sized:<dir>` (docs/benchmarks.md): the fraction of each step's own-size bound, from the record."""
  from experiments.tables import decoding as tables

  text = tables.docs_sized_table("decoding_sized_bound_2", None)
  record = json.loads((tables.BENCHMARK_RESULTS / "decoding_sized_bound_2" / "decoding.json").read_text())
  kv = next(r for r in record["records"] if (r["model"], r["batch"], r["seq_len"]) == ("softmax_kv_cache", 1, 65536))
  cell = f"{100 * kv['sized_read_bound_ms'] / kv['ms_per_token']:.0f}% ({kv['sized_read_bound_ms']:.2f} / "
  assert cell in text and text.count("Fraction of the read-only bound at the step's own size") == 2
  with pytest.raises(ValueError, match="decoding_quiet/decoding.json has no read bound at each step's size"):
    tables.docs_sized_table("decoding_quiet", None)


@pytest.mark.parametrize("flag", ["--batch=", "--contexts="])
def test_an_empty_grid_is_refused(capsys, flag):
  """No batch size or no context: nothing to time (and no grid point's caches to free before the bounds)."""
  with pytest.raises(SystemExit):
    decoding.parse_args([flag] + (["--contexts=24"] if flag == "--batch=" else []))
  assert f"{flag[:-1]} must name at least one value, got none" in capsys.readouterr().err
