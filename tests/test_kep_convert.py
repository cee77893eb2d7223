"""`primal-convert verify` on KEP-SVGP cases: every case of shared/reference/kep_svgp through the CLI (Linen and
NNX layers), and a synthetic case of other shapes and options (three heads, batch 1, row sampling, other etas) whose
golden numbers come from the float64 NumPy reference of the release form (`reference_kep_numpy`), so the runner
reads every shape and option from the case."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import reference_kep_numpy as ref

from primal_jax.convert import cli

REPO = Path(__file__).resolve().parents[1]
FOLDER = Path(os.environ.get("PRIMAL_JAX_REFERENCE_DIR", REPO.parent / "shared" / "reference")) / "kep_svgp"
CASES = sorted(p.stem for p in FOLDER.glob("*.npz")) if FOLDER.exists() else []

pytestmark = pytest.mark.matmul_precision("highest")


def _params(case: str) -> list:
  if not CASES:
    return [pytest.param(None, marks=pytest.mark.skip(reason=f"no golden cases in {FOLDER}"))]
  return [pytest.param(c, marks=(pytest.mark.slow,) if c == "kep_vit" else ()) for c in CASES]


@pytest.mark.parametrize("name", _params("linen"))
def test_verify_accepts_every_shipped_case(name, capsys):
  assert cli.main(["verify", str(FOLDER / f"{name}.npz")]) == 0
  printed = capsys.readouterr().out
  assert "FAIL" not in printed and printed.count(" ok") >= 30


@pytest.mark.parametrize("name", [c for c in CASES if c.startswith("kep_layer")])
def test_verify_layer_cases_through_the_nnx_layers(name, capsys):
  assert cli.main(["verify", "--frontend=nnx", str(FOLDER / f"{name}.npz")]) == 0
  assert "through the nnx layers" in capsys.readouterr().out


def _synthetic_case(folder: Path, eta_ksvd=0.5, eta_kl=0.1) -> Path:
  rng = np.random.default_rng(1234)
  batch, length, width, heads, s, multi = 1, 6, 12, 3, 2, 2  # n = 4 < embed_len 6: rows sampled
  n, p = s * multi, width // heads
  sd = {
    "we": rng.standard_normal((heads, n, s)) / np.sqrt(n * s),
    "wr": rng.standard_normal((heads, n, s)) / np.sqrt(n * s),
    "log_lambda_sqrt_inv_diag": rng.uniform(0, 1, (heads, s)),
    "m_u": rng.standard_normal((1, heads, s, s)),
    "s_sqrt_low_triangle": rng.standard_normal((1, heads, s, s, s)),
    "log_ssqrt": rng.standard_normal((1, heads, s, s)),
    "qk.weight": rng.standard_normal((2 * width, width)) / np.sqrt(width),
    "proj.weight": np.zeros((width, width)),
    "proj.bias": np.zeros(width),
    "final_weight.weight": rng.standard_normal((p, s)),
    "final_weight.bias": rng.standard_normal(p),
  }
  sd = {k: v.astype(np.float32) for k, v in sd.items()}
  x = rng.standard_normal((batch, length, width)).astype(np.float32)
  probe = rng.standard_normal((4, width)).astype(np.float32)
  targets = rng.integers(0, 4, batch)
  eps = rng.standard_normal((batch, heads, length, s, 1)).astype(np.float32)
  params = {
    "We": sd["we"],
    "Wr": sd["wr"],
    "log_lambda": sd["log_lambda_sqrt_inv_diag"],
    "m_u": sd["m_u"][0],
    "s_sqrt_low_triangle": sd["s_sqrt_low_triangle"][0],
    "log_ssqrt": sd["log_ssqrt"][0],
    "final_kernel": sd["final_weight.weight"].T,
    "final_bias": sd["final_weight.bias"],
  }
  attn_out, kl = ref.kep_release_forward(x, sd["qk.weight"], params, eps[..., 0])
  preds = attn_out.mean(1) @ probe.T.astype(np.float64)
  shifted = preds - preds.max(1, keepdims=True)
  ce = np.mean(np.log(np.exp(shifted).sum(1)) - shifted[np.arange(batch), targets])
  outputs = {"attn_out": attn_out, "kl": kl, "loss_kl": kl, "preds": preds, "loss_ce": ce}
  outputs = {k: np.asarray(v, np.float32) for k, v in outputs.items()}
  inputs = {"x": x, "probe": probe, "targets": targets, "noise/eps_layer0": eps}
  np.savez(
    folder / "twin.npz",
    **sd,
    **inputs,
    **outputs,
    param_keys=np.array(list(sd)),
    input_keys=np.array(list(inputs)),
    output_keys=np.array(list(outputs)),
  )
  config = dict(
    dim=width,
    num_heads=heads,
    embed_len=length,
    low_rank=s,
    rank_multi=multi,
    concate=False,
    eta_ksvd=eta_ksvd,
    eta_kl=eta_kl,
  )
  meta = {"case": "twin", "torch_module": {"class": "KEP_SVGPAttention"}, "config": config}
  (folder / "twin.json").write_text(json.dumps(meta))
  return folder / "twin.npz"


def test_verify_reads_shapes_and_options_from_the_case(tmp_path, capsys):
  path = _synthetic_case(tmp_path)
  assert cli.main(["verify", str(path)]) == 0
  printed = capsys.readouterr().out
  for key in ("attn_out", "kl", "preds", "loss_ce", "loss_kl"):
    assert f"  {key} " in printed or f"  {key}  " in printed, key
  assert "FAIL" not in printed


def test_verify_fails_a_wrong_golden_and_refuses_a_missing_field(tmp_path, capsys):
  path = _synthetic_case(tmp_path)
  with np.load(path) as z:
    arrays = dict(z)
  arrays["attn_out"] = arrays["attn_out"] * 1.01
  np.savez(path, **arrays)
  assert cli.main(["verify", str(path)]) == 1
  meta = json.loads(path.with_suffix(".json").read_text())
  del meta["config"]["eta_kl"]
  path.with_suffix(".json").write_text(json.dumps(meta))
  assert cli.main(["verify", str(path)]) == 2
  assert "eta_kl" in capsys.readouterr().err
