"""benchmarks/gemv_chain.py: the step's weight products in order, every formulation computing the same chain as a
float64 NumPy reference, the record's table, and the refusals. No timings are asserted."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from benchmarks import gemv_chain as gc
from benchmarks.decoding import build, weight_bytes
from experiments.tables.gemv_chain import record_markdown

SMALL = {"layers": 2, "dim": 32, "heads": 2, "low_rank": 4}


@pytest.fixture(scope="module")
def mats():
  return gc.weight_matrices(**SMALL)


def reference(mats, steps: int) -> np.ndarray:
  x = np.ones((mats[0].shape[0],), np.float64)
  for _ in range(steps):
    y = x
    for w in mats:
      y = np.tanh(y @ w.astype(np.float64))
    x = np.full_like(x, 1.0 + y.mean())
  return x


def test_the_products_are_the_steps_weights_in_order(mats):
  d = SMALL["dim"]
  per_block = [(d, d), (d, d), (d, d), (d, 4 * d), (4 * d, d)]
  assert [w.shape for w in mats] == per_block * SMALL["layers"] + [(d, 256)]
  assert all(w.dtype == np.float32 for w in mats)
  # Everything the step reads but these products: biases, norms, Primal's head weights, the embedding rows.
  _, params = build("primal_state", 1024, type("A", (), {**SMALL, "softmax_impl": "einsum"})())
  rest = weight_bytes(params, 1) - sum(w.nbytes for w in mats)
  assert 0 < rest < 0.1 * weight_bytes(params, 1)


@pytest.mark.parametrize("formulation", ["xla", "xla_split2", "xla_transposed", gc.TP])
def test_every_xla_formulation_computes_the_reference_chain(mats, formulation):
  loop, args = gc.xla_runner(formulation, mats, steps=3)
  out = np.asarray(jax.block_until_ready(loop(*args))).reshape(-1)
  # The chain's value is 1 + the mean of the last products (about 0.02): compared without the 1, float32 to float64.
  np.testing.assert_allclose(out - 1.0, reference(mats, 3) - 1.0, rtol=1e-3, atol=1e-6)


def test_the_numpy_chain_computes_the_reference(mats):
  loop, args = gc.numpy_runner(mats, steps=2)
  np.testing.assert_allclose(loop(*args)[0] - 1.0, reference(mats, 2) - 1.0, rtol=1e-3, atol=1e-6)


def test_an_unknown_formulation_and_an_even_chain_are_refused(mats):
  with pytest.raises(ValueError, match="formulation must be one of"):
    gc.xla_runner("eigen", mats, steps=1)
  with pytest.raises(ValueError, match="odd number of products"):
    gc.tensor_parallel(mats[:-1])


@pytest.mark.parametrize("flag", ["--steps=1", "--repeats=0", "--dim=0", "--widths=", "--widths=64,x", "--widths=0"])
def test_counts_below_one_are_refused(flag):
  with pytest.raises(SystemExit):
    gc.parse_args([flag])


def test_the_worker_records_every_formulation_against_one_bound():
  args = gc.parse_args(["--layers=1", "--dim=32", "--heads=2", "--low_rank=4", "--steps=8", "--repeats=3"])
  args.formulations, args.sized_repeats, args.widths = "xla,numpy,step,sizes", 1, "32,64"
  record = gc.worker(args)
  # The square products alone: about the chain's bytes in [K, K] matrices of each width.
  assert [(r["width"], r["products"]) for r in record["sizes"]] == [(32, 19), (64, 4)]
  assert all(r["us_per_product"] > 0 and r["bytes_per_s"] > 0 for r in record["sizes"])
  assert [r["formulation"] for r in record["rows"]] == ["xla", "numpy", "step"]
  assert record["products"] == 6 and record["bytes"] == 4 * (3 * 32 * 32 + 2 * 32 * 128 + 32 * 256)
  chain, _, step = record["rows"]
  assert chain["bytes"] == record["bytes"]
  assert chain["bound_ms"] == pytest.approx(1e3 * record["bytes"] / record["read_bandwidth"]["best"])
  # The step reads every weight (biases, norms, Primal's head weights, one embedding row each) and its state.
  _, params = build("primal_state", 1024, type("A", (), {**SMALL, "layers": 1, "softmax_impl": "einsum"})())
  assert step["bytes"] > weight_bytes(params, 1) > record["bytes"]
  for row in record["rows"]:
    assert row["ms_per_chain"] > 0 and row["bound_fraction"] == pytest.approx(row["bound_ms"] / row["ms_per_chain"])


@pytest.mark.parametrize("name", ["gemv_chain", "gemv_chain_widths"])
def test_the_committed_records_render_their_tables(name):
  from experiments.tables.common import BENCHMARK_RESULTS

  results = json.loads((BENCHMARK_RESULTS / name / "gemv_chain.json").read_text())
  text = record_markdown(results)
  rows = [line for line in text.splitlines() if line.startswith("| `")]
  assert len(rows) == sum(len(c["rows"]) for c in results["configurations"])
  widths = [r["width"] for c in results["configurations"] for r in c.get("sizes", [])]
  assert [int(line.split("|")[1].replace(",", "")) for line in text.splitlines() if line[2:3].isdigit()] == widths
  assert {c["cores"] for c in results["configurations"]} == {1, 2}
  assert results["meta"]["git_commit"][:12] in text
  with pytest.raises(ValueError, match="no configurations"):
    record_markdown({**results, "configurations": []})


def test_the_configurations_are_all_cores_then_one_then_two_devices():
  assert gc.configurations(16) == [(16, 1, (*gc.FORMULATIONS, gc.SIZES)), (1, 1, gc.FORMULATIONS), (16, 2, (gc.TP,))]
  assert gc.configurations(1) == [(1, 1, (*gc.FORMULATIONS, gc.SIZES))]  # nothing to compare on one core
