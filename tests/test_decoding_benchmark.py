"""benchmarks/decoding.py on a tiny model: the state sizes it reports are the caches' exact sizes, its tables
and plot are written, and both models decode the same number of tokens (no timing is asserted)."""

from __future__ import annotations

import json

from benchmarks import decoding


def test_tiny_run_reports_exact_state_sizes(tmp_path):
  decoding.main(["--contexts=24,48", "--layers=2", "--dim=16", "--heads=2", "--low_rank=3", "--batch=2",
                 "--steps=3", "--repeats=1", "--prefill_chunk=8", f"--out={tmp_path}"])  # fmt: skip
  results = json.loads((tmp_path / "decoding.json").read_text())
  records = {(r["variant"], r["seq_len"]): r for r in results["records"]}
  for context in (24, 48):
    # KV cache: keys and values [batch, context, dim] float32 per layer, plus int32 cache indices and the position.
    kv = records["softmax_kv_cache", context]["state_bytes"]
    assert 2 * 2 * 2 * context * 16 * 4 <= kv <= 2 * 2 * 2 * context * 16 * 4 + 64
    # Primal: running sums of q and k [batch, heads, p] per layer, whatever the context.
    assert 2 * 2 * 2 * 2 * 8 * 4 <= records["primal_state", context]["state_bytes"] <= 2 * 2 * 2 * 2 * 8 * 4 + 64
    assert all(records[v, context]["ms_per_token"] > 0 for v in decoding.VARIANTS)
  assert records["primal_state", 24]["state_bytes"] == records["primal_state", 48]["state_bytes"]
  assert "(1.00x)" in (tmp_path / "decoding.md").read_text() and (tmp_path / "decoding.png").stat().st_size > 1000
