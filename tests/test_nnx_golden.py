"""Every shipped golden case (shared/reference) verifies through the primal_jax.nnx layers: the Linen models
run with each attention layer substituted by its NNX layer (`primal_jax.nnx.through_nnx`), and
`python -m primal_jax.convert verify --frontend=nnx` says so."""

from __future__ import annotations

import io

import pytest
from test_convert import REFERENCE_DIR, SHIPPED, SHIPPED_PARAMS, _assert_case_matches, _case_class

import primal_jax.nnx as pnnx
from primal_jax.convert import cases as convert_cases
from primal_jax.convert.cases import load_case, run_case
from primal_jax.convert.cli import main, verify

# Compares with float64 NumPy, golden numbers or the Linen layer at float32 tolerances: full float32 matmuls.
pytestmark = pytest.mark.matmul_precision("highest")

# The cases of single layers run in seconds; whole models (LRA, Decision Transformer, ViT) are slow on 2 cores.
LAYER_CLASSES = ("AttentionLayer", "Primal_attention", "PrimalMultiheadAttention")


def _marks(name):
  return () if name is None or _case_class(name) in LAYER_CLASSES else (pytest.mark.slow,)


@pytest.mark.parametrize(
  "name", [p if not isinstance(p, str) else pytest.param(p, marks=_marks(p)) for p in SHIPPED_PARAMS]
)
def test_golden_case_through_the_nnx_layers(name):
  case = load_case(str(REFERENCE_DIR / f"{name}.npz"))
  with pnnx.through_nnx() as substituted:
    ours = run_case(case)
  assert substituted.calls >= 1
  _assert_case_matches(case, ours)


@pytest.mark.skipif(not SHIPPED, reason="no reference folder")
def test_every_release_class_has_a_case_here():
  # The release's baseline attentions have their cases in baselines/ (the RL Flowformer layer's class).
  # KEP-SVGP's cases are in kep_svgp/ (through NNX: tests/test_kep_convert.py).
  kep = {"KEP_SVGPAttention", "ViT", "CIFAR/utils/metrics.py"}
  assert {_case_class(name) for name in SHIPPED} == set(convert_cases.RUNNERS) - {"Flowformer_attention"} - kep


@pytest.mark.skipif(not SHIPPED, reason="no reference folder")
def test_cli_frontend_nnx(capsys):
  out = io.StringIO()
  assert verify(str(REFERENCE_DIR / "ts_primal_layer.npz"), 1e-4, out, frontend="nnx")
  assert "through the nnx layers" in out.getvalue() and "FAIL" not in out.getvalue()
  assert main(["verify", str(REFERENCE_DIR / "rl_causal_layer.npz"), "--frontend=nnx"]) == 0
  with pytest.raises(SystemExit):
    main(["verify", str(REFERENCE_DIR / "rl_causal_layer.npz"), "--frontend=torch"])
  assert "invalid choice: 'torch'" in capsys.readouterr().err
  with pytest.raises(ValueError, match="frontend must be one of"):
    run_case(load_case(str(REFERENCE_DIR / "rl_causal_layer.npz")), "jax")
