"""Tests of the benchmarks' harness (`benchmarks.harness`), its tables and a tiny run of its script.

No timing is asserted: the numbers depend on the machine. What is checked is the accounting (FLOPs,
memory, slopes, ratios), the files written, and that the fused-softmax variant computes the same model.
"""

import json
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import train_step
from benchmarks.harness import measure as bm
from benchmarks.harness import process
from experiments.tables import efficiency as tables
from primal_jax.launch import host_allocator
from primal_jax.models.classifier import SequenceClassifier
from primal_jax.models.config import make_config


@pytest.fixture(scope="module")
def efficiency():
  """benchmarks/efficiency.py, the module `python -m benchmarks.efficiency` runs."""
  from benchmarks import efficiency as module

  return module


def test_flops_of_a_matmul_are_2mnk():
  m, k, n = 48, 40, 24
  a, b = jnp.ones((m, k)), jnp.ones((k, n))
  assert bm.jit_flops(jnp.matmul, a, b) == 2 * m * n * k
  compiled = jax.jit(jnp.matmul).lower(a, b).compile()
  assert bm.compiled_flops(compiled) == 2 * m * n * k


def test_memory_analysis_reports_positive_sizes():
  a, b = jnp.ones((64, 32)), jnp.ones((32, 16))
  compiled = jax.jit(lambda x, y: jnp.tanh(x @ y) @ y.T).lower(a, b).compile()
  mem = bm.compiled_memory(compiled)
  assert mem["argument_bytes"] == (64 * 32 + 32 * 16) * 4
  assert mem["output_bytes"] == 64 * 32 * 4
  assert mem["temp_bytes"] >= 0
  assert mem["total_bytes"] >= mem["argument_bytes"] + mem["output_bytes"] > 0


def test_memory_analysis_counts_donated_buffers_once():
  x = jnp.ones((256, 256))
  plain = bm.compiled_memory(jax.jit(lambda v: v * 2).lower(x).compile())
  donated = bm.compiled_memory(jax.jit(lambda v: v * 2, donate_argnums=0).lower(x).compile())
  assert donated["alias_bytes"] == x.nbytes
  assert donated["total_bytes"] == plain["total_bytes"] - x.nbytes


def test_process_memory_helpers():
  assert process.ru_maxrss_bytes() > 0
  assert process.peak_rss_bytes() > 0
  if sys.platform.startswith("linux"):
    assert process.rss_high_water_bytes() >= process.current_rss_bytes() > 0
  assert bm.device_memory(jax.devices("cpu")[0]) is None or isinstance(bm.device_memory(), dict)


@pytest.mark.parametrize("exponent", [1.0, 2.0])
def test_loglog_slope_recovers_the_exponent(exponent):
  x = np.array([1024, 2048, 4096, 8192, 16384], float)
  slope, intercept = tables.fit_loglog_slope(x, 3.5 * x**exponent)
  assert slope == pytest.approx(exponent, abs=1e-12)
  assert intercept == pytest.approx(math.log(3.5), abs=1e-9)


def test_loglog_slope_rejects_bad_input():
  with pytest.raises(ValueError, match="two distinct"):
    tables.fit_loglog_slope([8], [1.0])
  with pytest.raises(ValueError, match="positive"):
    tables.fit_loglog_slope([1, 2], [0.0, 1.0])


def test_interleaved_timings_rotate_the_order():
  calls = []
  runners = {name: (lambda name=name: calls.append(name) or 1.0) for name in "abc"}
  times = bm.interleaved_timings(runners, repeats=3)
  assert calls == list("abcbcacab")
  assert times == {name: [1.0, 1.0, 1.0] for name in "abc"}


def test_roofline():
  assert bm.roofline(2e9, 0.5, 8e9) == {"achieved_flops_per_s": 4e9, "peak_fraction": 0.5}
  assert bm.roofline(None, 0.5, 8e9) == {"achieved_flops_per_s": None, "peak_fraction": None}


def _records():
  recs = []
  for n, t_soft, t_lin in [(1024, 10.0, 5.0), (2048, 40.0, 10.0)]:
    recs.append({"variant": "softmax", "seq_len": n, "sec_per_1k_steps": t_soft, "xla_memory": {"total_bytes": n**2}})
    recs.append({"variant": "linear", "seq_len": n, "sec_per_1k_steps": t_lin, "xla_memory": {"total_bytes": 64 * n}})
  recs.append(
    {"variant": "linear", "seq_len": 4096, "sec_per_1k_steps": 20.0, "xla_memory": {"total_bytes": 64 * 4096}}
  )
  return recs


def test_ratio_table_against_the_reference():
  table = tables.ratio_table(_records(), "sec_per_1k_steps", reference="softmax")
  lines = table.splitlines()
  assert lines[0] == "| variant | N=1024 | N=2048 | N=4096 | slope |"
  assert lines[2] == "| softmax | 10.00 (1.00x) | 40.00 (1.00x) | - | 2.00 |"
  # No softmax at 4096: the value without a ratio.
  assert lines[3] == "| linear | 5.00 (0.50x) | 10.00 (0.25x) | 20.00 | 1.00 |"
  memory = tables.ratio_table(_records(), "xla_memory.total_bytes", reference="softmax", scale=1024, digits=0)
  assert "| linear | 64 (0.06x) | 128 (0.03x) | 256 | 1.00 |" in memory


def test_a_slope_that_rounds_to_zero_is_0_never_minus_0():
  """A flat series fits a slope of +-1e-17 depending on the host's BLAS; `docs_tables --check` must not depend on
  the host (it printed -0.00 for the decoding state's flat memory on one host, 0.00 on another)."""
  flat = [{"variant": "state", "seq_len": n, "mib": 0.014 * (1 - 1e-9 * i)} for i, n in enumerate((256, 1024, 4096))]
  assert -1e-8 < tables.scaling_slopes(flat, "mib")["state"] < 0  # f"{slope:.2f}" would print -0.00
  assert tables.ratio_table(flat, "mib", reference="state").splitlines()[2].endswith("| 0.00 |")


def test_results_markdown_sections_and_failures():
  records = [*_records(), {"variant": "performer", "seq_len": 1024, "error": "ValueError: boom"}]
  for rec in records[:-1]:
    rec.update(flops_per_step=1e9, **bm.roofline(1e9, rec["sec_per_1k_steps"] / 1000, 1e12))
  peak = {"flops_per_s": 1e12, "size": 64, "dtype": "float32"}
  text = tables.results_markdown({"records": records, "matmul_peak": peak}, reference="softmax")
  assert "### Training time (seconds per 1,000 steps)" in text
  assert "### XLA memory of the step" in text
  assert "Peak RSS" not in text  # no such data
  assert "| softmax | 1024 | 1.000 | 100.00 | 10.0% |" in text
  assert "| performer | 1024 | ValueError: boom |" in text


def test_json_round_trip(tmp_path):
  results = {
    "meta": {"args": {"set": [("model.attention.primal.rank_multi", 2)]}},
    "matmul_peak": {"flops_per_s": np.float32(2.5)},
    "records": [{"variant": "softmax", "seq_len": 64, "sec_per_1k_steps": 1.25, "final_loss": float("nan")}],
  }
  path = bm.save_results(tmp_path / "sub" / "r.json", results)
  loaded = tables.load_results(path)
  assert loaded["records"][0] == {"variant": "softmax", "seq_len": 64, "sec_per_1k_steps": 1.25, "final_loss": None}
  assert loaded["matmul_peak"]["flops_per_s"] == 2.5
  assert loaded["meta"]["args"]["set"] == [["model.attention.primal.rank_multi", 2]]
  assert json.loads(path.read_text()) == loaded
  bm.save_results(path, loaded)
  assert tables.load_results(path) == loaded


def test_plot_scaling_writes_a_png(tmp_path):
  path = bm.plot_scaling({"records": _records()}, tmp_path / "p.png", title="t")
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_call_seconds_times_each_call_after_an_untimed_warm_up():
  calls = []

  def fn(x):
    calls.append(x)
    return jnp.asarray(x) * 2

  samples = bm.call_seconds(fn, 3.0, repeats=4)
  assert len(calls) == 5 and len(samples) == 4 and all(s > 0 for s in samples)


def test_matmul_peak_is_positive():
  peak = bm.measure_matmul_peak(size=128, repeats=2)
  assert peak["flops"] == 2 * 128**3
  assert peak["flops_per_s"] > 0 and len(peak["seconds"]) == 2


def test_dot_product_variant_computes_the_einsum_model(efficiency):
  """The softmax_dpa variant's model: same parameters and (without dropout) the same logits as the einsum one."""
  sizes = dict(vocab_size=16, max_len=24, dim=16, hidden_dim=32, num_classes=3)
  options = dict(train_step.FUSED_SOFTMAX)["model.attention.softmax"]
  assert options["impl"] == "dot_product_attention"
  model = SequenceClassifier(make_config("softmax", 2, **sizes))
  fused_model = SequenceClassifier(make_config("softmax", 2, attention={"softmax": options}, **sizes))
  tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 24), 1, 16)
  mask = jnp.arange(24)[None, :] < jnp.array([[24], [17]])
  params = model.init(jax.random.PRNGKey(1), tokens, mask)
  fused_params = fused_model.init(jax.random.PRNGKey(1), tokens, mask)
  assert jax.tree.structure(fused_params) == jax.tree.structure(params)
  np.testing.assert_allclose(fused_model.apply(params, tokens, mask), model.apply(params, tokens, mask), atol=1e-5)


def test_plan_grid_and_overrides(efficiency):
  args = efficiency.parse_args(
    ["--variants=softmax,primalformer", "--set=model.attention.primal.rank_multi=2", "--set=task=x"]
  )
  assert args.set == [("model.attention.primal.rank_multi", 2), ("task", "x")]
  assert [(n, [v.name for v in vs]) for n, vs in efficiency.plan_grid(args)] == [
    (1024, ["softmax", "primalformer"]),
    (2048, ["softmax", "primalformer"]),
    (4096, ["softmax", "primalformer"]),
    (8192, ["primalformer"]),
    (16384, ["primalformer"]),
  ]
  assert {"softmax", "softmax_dpa", "primalformer", "primal_plus"} <= set(train_step.available_variants())
  with pytest.raises(ValueError, match="unknown variants"):
    efficiency.plan_grid(efficiency.parse_args(["--variants=nope"]))


def test_kep_variants_train_on_their_objective_at_primals_rank(efficiency):
  """Issue 56 item 5: both KEP-SVGP forms are variants, configured as their authors train them (task "kep_svgp":
  the KL joins the loss; the release KSVD term) at the s and rank_multi PrimalFormer gets (after `--set`); the next
  test runs a step: finite loss, and the loss is CE + KSVD + KL, far above a CE of ~log(10)."""
  args = efficiency.parse_args(
    ["--set=model.attention.primal.rank_multi=2", "--set=model.attention.primal.low_rank=3", "--steps=1"]
  )
  variants = efficiency.available_variants()
  for name, form in (("kep_svgp", "paper"), ("kep_svgp_release", "release")):
    config = train_step.make_config(variants[name], 64, args)
    kep = config.model.attention.kep_svgp
    assert (config.task, config.ksvd.spec, config.ksvd.eta) == ("kep_svgp", "release_kep", 1.0)
    assert (kep.form, kep.low_rank, kep.rank_multi) == (form, 3, 2) and set(config.model.layers) == {"kep_svgp"}


@pytest.mark.slow  # ~40 s CPU on a shared machine: compiling the KEP-SVGP step
def test_kep_variant_step_adds_its_kl(efficiency):
  args = efficiency.parse_args(
    ["--set=model.attention.primal.rank_multi=2", "--set=model.attention.primal.low_rank=3", "--steps=1"]
  )
  variant = efficiency.available_variants()["kep_svgp"]
  prepared = efficiency.prepare_step(variant, 64, args, jax.devices()[0], warmup_steps=1)
  scalars = jax.device_get(prepared.last_out)
  assert math.isfinite(prepared.loss()) and scalars["kl_loss"] > 10 * math.log(10)
  assert prepared.loss() == pytest.approx(
    scalars["task_loss_sum"] / scalars["count"] + scalars["ksvd_loss"] + scalars["kl_loss"], rel=1e-5
  )


@pytest.mark.slow  # ~40 s CPU: the benchmark script over its grid
def test_script_end_to_end(efficiency, tmp_path, capsys):
  results = efficiency.main(
    [
      "--variants=primalformer,softmax", "--lengths=64", "--long_lengths=", "--steps=1", "--repeats=1",
      "--warmup_steps=1", "--set=model.attention.primal.rank_multi=2", "--no-rss", "--peak_size=128",
      "--peak_repeats=1",
      f"--out={tmp_path}",
    ]
  )  # fmt: skip
  records = {r["variant"]: r for r in results["records"]}
  assert set(records) == {"primalformer", "softmax"}
  for rec in records.values():
    assert "error" not in rec, rec
    assert rec["sec_per_1k_steps"] > 0 and rec["flops_per_step"] > 0 and rec["xla_memory"]["total_bytes"] > 0
    assert math.isfinite(rec["final_loss"])
  saved = tables.load_results(tmp_path / "efficiency.json")
  assert [r["variant"] for r in saved["records"]] == [r["variant"] for r in results["records"]]
  markdown = (tmp_path / "efficiency.md").read_text()
  assert "| softmax | " in markdown and "(1.00x)" in markdown
  assert results["meta"]["allocator"] == host_allocator.loaded_allocator()
  assert f"Host allocator {results['meta']['allocator']}." in markdown
  assert (tmp_path / "efficiency.png").read_bytes()[:4] == b"\x89PNG"
  assert "| primalformer |" in capsys.readouterr().out


def test_single_mode_reports_process_memory(efficiency, capsys):
  out = efficiency.main(["--single=softmax:64", "--set=model.attention.primal.rank_multi=2", "--memory_steps=1"])
  assert out["rss"]["peak_bytes"] >= out["rss"]["baseline_bytes"] > 0
  line = capsys.readouterr().out.strip().splitlines()[-1]
  assert line.startswith(efficiency.SINGLE_MARKER)
  assert json.loads(line[len(efficiency.SINGLE_MARKER) :])["rss"] == out["rss"]


def test_subprocess_memory_is_parsed_from_the_marker_line(efficiency, monkeypatch):
  args = efficiency.parse_args(["--set=model.attention.primal.rank_multi=2", "--single_timeout=5"])
  argv = efficiency.single_argv(args, "softmax", 64)
  assert argv[1:5] == ["-m", "benchmarks.efficiency", "--single=softmax:64", f"--config={args.config}"]
  assert efficiency.parse_args(argv[3:]).set == args.set  # the child parses what the parent was given
  payload = {"rss": {"peak_delta_bytes": 5}, "device_memory": None}
  replies = iter(
    [
      subprocess.CompletedProcess(argv, 0, "log\n" + efficiency.SINGLE_MARKER + json.dumps(payload) + "\n", ""),
      subprocess.CompletedProcess(argv, 1, "", "Traceback ...\nMemoryError: out of memory\n"),
    ]
  )
  monkeypatch.setattr(efficiency.subprocess, "run", lambda *a, **k: next(replies))
  assert efficiency.measure_in_subprocess(args, "softmax", 64) == payload
  assert efficiency.measure_in_subprocess(args, "softmax", 64) == {"memory_error": "exit 1: MemoryError: out of memory"}


def test_budgets_record_what_was_not_run_and_the_docs_table_says_so(efficiency, tmp_path, monkeypatch):
  """A (variant, N) over a budget is a record with `not_run` and its reason, the variant is skipped at larger N
  (recorded too), and the generated docs table names the cell instead of leaving it blank."""
  from experiments.tables import efficiency as tables

  class Fake(efficiency.PreparedStep):
    def run(self, steps=None):
      return 0.01

    def loss(self):
      return 0.0

  def prepare(variant, seq_len, args, device, warmup_steps):
    if variant.name == "softmax" and seq_len == 128:
      raise efficiency.NotRun("memory", "not run: the step needs 24.5 GiB (XLA) > the 10 GiB budget")
    return Fake(None, None, None, 1, 1, 0.0, 1e6 * seq_len, {"total_bytes": seq_len * 1024})

  monkeypatch.setattr(efficiency, "prepare_step", prepare)
  args = efficiency.parse_args(
    ["--variants=softmax,linear", "--lengths=64", "--long_lengths=128,256", "--quadratic=", "--no-rss",
     "--peak_size=64", "--peak_repeats=1", "--steps=1", "--repeats=1"]
  )  # fmt: skip
  results = efficiency.run_grid(args)
  found = {(r["variant"], r["seq_len"]): r for r in results["records"]}
  assert found["softmax", 128]["not_run"] == "memory" and "24.5 GiB" in found["softmax", 128]["error"]
  assert found["softmax", 256] == {
    "variant": "softmax", "seq_len": 256, "error": "not run: over the memory budget at N=128", "not_run": "memory"
  }  # fmt: skip
  assert all("error" not in found["linear", n] for n in (64, 128, 256)) and "error" not in found["softmax", 64]
  efficiency.write_outputs(results, tmp_path / "run")
  monkeypatch.setattr(tables, "BENCHMARK_RESULTS", tmp_path)
  table = tables.docs_table("run", tmp_path)
  softmax_row = next(line for line in table.splitlines() if line.startswith("| softmax |"))
  assert softmax_row.count("over memory budget") == 2


def test_relative_table_states_each_variants_cost_over_the_reference_and_the_bound(tmp_path, monkeypatch):
  """`benchmark_vs:<dir>:<variant>` (KEP-SVGP over PrimalFormer, issue 56 item 5): time, memory and FLOPs as ratios at
  the same N, and both steps' fraction of the in-process matmul peak; a failed record and N the reference lacks
  are left out; an unknown reference is refused."""

  def rec(variant, n, seconds, mib, gflop, frac):
    return {"variant": variant, "seq_len": n, "sec_per_1k_steps": seconds, "xla_memory": {"total_bytes": mib * 2**20},
            "flops_per_step": gflop * 1e9, "peak_fraction": frac}  # fmt: skip

  results = {
    "meta": {"device_kind": "cpu", "platform": "cpu", "date": "2026-12-05T22:00:00", "git_commit": "abc",
             "args": {"steps": 3, "repeats": 3, "batch_size": 8}},  # fmt: skip
    "matmul_peak": {"flops_per_s": 40e9, "size": 2048, "dtype": "float32"},
    "records": [
      rec("primalformer", 1024, 600.0, 100.0, 4.0, 0.2), rec("kep_svgp", 1024, 2400.0, 300.0, 8.0, 0.1),
      rec("primalformer", 2048, 800.0, 200.0, 8.0, 0.25), rec("kep_svgp", 2048, 3200.0, 700.0, 16.0, 0.125),
      rec("kep_svgp", 4096, 1.0, 1.0, 1.0, 0.1),  # no reference at this N
      {"variant": "kep_svgp_release", "seq_len": 1024, "error": "boom"},
    ],
  }  # fmt: skip
  lines = tables.relative_table(results, "primalformer").splitlines()
  assert lines[2:] == [
    "| kep_svgp | 1024 | 2,400 (4.00x) | 300 (3.00x) | 8.00 (2.00x) | 10.0% (20.0%) |",
    "| kep_svgp | 2048 | 3,200 (4.00x) | 700 (3.50x) | 16.00 (2.00x) | 12.5% (25.0%) |",
  ]
  with pytest.raises(ValueError, match="reference 'softmax' has no successful record; variants: kep_svgp, primal"):
    tables.relative_table(results, "softmax")
  (tmp_path / "run").mkdir()
  bm.save_results(tmp_path / "run" / "efficiency.json", results)
  monkeypatch.setattr(tables, "BENCHMARK_RESULTS", tmp_path)
  table = tables.docs_relative_table("run:primalformer", tmp_path)
  assert table.startswith("\n".join(lines)) and "matmul peak of that process: 40.0 GFLOP/s" in table
  with pytest.raises(ValueError, match="benchmark_vs takes <dir>:<reference variant>"):
    tables.docs_relative_table("run", tmp_path)


def test_memory_budget_refuses_before_running(efficiency):
  args = efficiency.parse_args(["--set=model.attention.primal.rank_multi=2", "--memory_budget_gib=1e-6"])
  variant = efficiency.available_variants()["softmax"]
  with pytest.raises(efficiency.NotRun, match="the step needs .* GiB \\(XLA\\) > the 1e-06 GiB budget") as err:
    efficiency.prepare_step(variant, 64, args, jax.devices()[0], warmup_steps=1)
  assert err.value.kind == "memory"


def test_read_bandwidth_at_a_size_streams_that_many_bytes_and_refuses_less_than_a_row(monkeypatch):
  seen = []
  monkeypatch.setattr(bm, "read_bandwidth", lambda elements, repeats: seen.append((elements, repeats)) or {})
  bm.read_bandwidth_at(10_000, repeats=2)  # 2,500 float32 -> 39 whole rows of 64
  bm.read_bandwidth_at(256)
  assert seen == [(39 * 64, 2), (64, 5)]
  with pytest.raises(ValueError, match="nbytes must be at least 256"):
    bm.read_bandwidth_at(255)
  monkeypatch.undo()
  with pytest.raises(ValueError, match="elements must be a positive multiple of 64"):
    bm.read_bandwidth(100)


def test_read_bandwidth_times_four_read_only_streams_on_the_host():
  rates = bm.read_bandwidth(1 << 16, repeats=3)
  assert set(rates) == {"xla_sum", "xla_gemv", "numpy_sum", "blas_gemv", "best"}  # JAX on the CPU: NumPy's too
  assert all(v > 0 for v in rates.values()) and rates["best"] == max(v for k, v in rates.items() if k != "best")
