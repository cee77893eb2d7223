"""The step profiler's HLO reading (classes, FLOPs, bytes) on real compiled functions, and its trace join."""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import pytest

from benchmarks import step_profile as sp


def compiled_text(fn, *args) -> str:
  return jax.jit(fn).lower(*args).compile().as_text()


def test_a_matmul_is_classed_with_its_flops_and_bytes():
  x, w = jnp.ones((256, 64), jnp.float32), jnp.ones((64, 32), jnp.float32)
  ops = sp.hlo_ops(compiled_text(lambda x, w: jnp.tanh(x @ w), x, w))
  matmuls = [op for op in ops.values() if op.kind == "matmul"]
  assert sum(op.flops for op in matmuls) == 2 * 256 * 64 * 32  # 2 m n k, counted once
  assert all(op.kind != "matmul" or op.bytes >= 4 * (256 * 64 + 64 * 32 + 256 * 32) for op in ops.values())


def test_transposes_reductions_and_elementwise_are_told_apart():
  x = jnp.ones((128, 96), jnp.float32)
  assert {op.kind for op in sp.hlo_ops(compiled_text(lambda x: jnp.sum(x * 2.0, axis=0), x)).values()} >= {"reduction"}
  kinds = {op.kind for op in sp.hlo_ops(compiled_text(lambda x: (x.T * 3.0).copy(), x)).values()}
  assert "copy/transpose" in kinds and "matmul" not in kinds
  elementwise = sp.hlo_ops(compiled_text(lambda x: jnp.exp(x) + 1.0, x))
  assert elementwise and {op.kind for op in elementwise.values()} == {"elementwise"}


def test_shape_bytes_reads_dtypes_and_tuples():
  assert sp.shape_bytes("f32[8,64]{1,0}") == 8 * 64 * 4
  assert sp.shape_bytes("(bf16[4,4]{1,0}, s32[3]{0}, pred[])") == 32 + 12 + 1


def test_summary_rates_and_roofline():
  ops = {
    "mm": sp.Op("mm", "matmul", flops=2e9, bytes=1e6, source=""),
    "ew": sp.Op("ew", "elementwise", flops=0.0, bytes=4e8, source=""),
  }
  rows = {r["class"]: r for r in sp.summarise(ops, {"mm": 0.04, "ew": 0.02}, peak=1e11, bandwidth=2e10)}
  assert rows["matmul"]["flops_per_s"] == pytest.approx(5e10) and rows["matmul"]["roofline_seconds"] == 0.02
  assert rows["elementwise"]["bytes_per_s"] == pytest.approx(2e10) and rows["elementwise"]["roofline_seconds"] == 0.02
  assert rows["matmul"]["share"] == pytest.approx(2 / 3) and rows["reduction"]["ops"] == 0


def test_trace_events_join_the_ops_by_name():
  ops = {"fusion.1": sp.Op("fusion.1", "elementwise", 0.0, 8.0, "")}
  events = [
    {"ph": "X", "name": "fusion.1", "dur": 1000.0},
    {"ph": "X", "name": "fusion.1", "dur": 3000.0},
    {"ph": "X", "name": "ThunkExecutor::Execute", "dur": 9e6},  # runtime spans are not ops
  ]
  assert sp.op_times(events, ops, steps=2) == {"fusion.1": pytest.approx(0.002)}


@pytest.mark.skipif(importlib.util.find_spec("xprof") is None, reason="xprof reads the trace (pip install xprof)")
def test_a_real_trace_times_the_ops_of_the_compiled_function(tmp_path):
  x = jnp.ones((512, 512), jnp.float32)
  fn = jax.jit(lambda x: jnp.tanh(x @ x))
  ops = sp.hlo_ops(fn.lower(x).compile().as_text())
  fn(x).block_until_ready()
  jax.profiler.start_trace(str(tmp_path))
  fn(x).block_until_ready()
  jax.profiler.stop_trace()
  seconds = sp.op_times(sp.read_trace(str(tmp_path)), ops, steps=1)
  assert seconds and all(t > 0 for t in seconds.values())
  assert any(ops[name].kind == "matmul" for name in seconds)


def test_gemm_rates_time_the_three_forms_of_each_width_and_the_triad_moves_three_arrays():
  rates = sp.gemm_rates(64, widths=((8, 16),), repeats=2)
  assert sorted(rates) == sorted(f"{label}, k=8, n=16" for label in sp.GEMMS)
  assert all(0 < rate < 1e15 for rate in rates.values())
  assert 0 < sp.triad_bandwidth(1024, repeats=2) < 1e13
