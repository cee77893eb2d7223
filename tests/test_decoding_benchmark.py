"""benchmarks/decoding.py on a tiny model: the state sizes it reports are the caches' exact sizes, its tables
and plot are written, every model decodes at every batch size, and the synthetic fill puts every position
counter where a prefill would (no timing is asserted)."""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np
import pytest

from benchmarks import decoding
from primal_jax.models.lm import decode_step, init_cache


@pytest.mark.parametrize("fill", ["synthetic", "prefill"])
def test_tiny_run_reports_exact_state_sizes(tmp_path, fill):
  decoding.main(["--contexts=24,48", "--layers=2", "--dim=16", "--heads=2", "--low_rank=3", "--batch=2,3",
                 "--steps=3", "--repeats=1", "--prefill_chunk=8", f"--fill={fill}", f"--out={tmp_path}"])  # fmt: skip
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
    # XLA's temporaries: the softmax step's grow with the cache, the Primal step's do not and stay below them.
    temps = {v: [records[v, batch, c]["xla_temp_bytes"] for c in (24, 48)] for v in decoding.VARIANTS}
    assert temps["softmax_kv_cache"][1] > temps["softmax_kv_cache"][0] > temps["primal_state"][0] > 0
    assert temps["primal_state"][0] == temps["primal_state"][1]
  text = (tmp_path / "decoding.md").read_text()
  assert text.count("(1.00x)") >= 2 * 3 * 2 and "batch 3" in text and (tmp_path / "decoding.png").stat().st_size > 1000


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
