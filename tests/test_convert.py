"""Tests of primal_jax.convert: PyTorch-release parity, the verify CLI, synthetic cases, converter errors.

Golden vectors come from shared/reference (PRIMAL_JAX_REFERENCE_DIR overrides
the location). Synthetic cases of other shapes are written in the same file
format with golden outputs from `reference_torch_numpy`, an independent float64
NumPy implementation of the release modules that is itself validated against
the shipped golden vectors first.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import reference_torch_numpy as tref

from primal_jax.convert import cases as convert_cases
from primal_jax.convert import cli, torch_layout
from primal_jax.convert.cases import load_case, relative_errors, run_case
from primal_jax.convert.kinds import module_class

# Compares with float64 NumPy or golden numbers at float32 tolerances: full float32 matmuls on every platform.
pytestmark = pytest.mark.matmul_precision("highest")

REPO = Path(__file__).resolve().parents[1]
TOL = 1e-5  # README: max|jax - golden| <= 1e-5 * max|golden| per array
KSVD_SCALAR_TOL = 2e-5  # README: RL / NLP KSVD scalars (cancellation in J = Le + Lr - T)
CAUSAL_CLASSES = ("Primal_attention", "PrimalMultiheadAttention")
KSVD_SCALARS = ("ksvd_per_sample", "loss_ksvd", "trainer_eta_loss_ksvd", "criterion_ksvd_term")
LAYER_FILE = re.compile(r"_layer\d+\.npz$")


def _reference_dir() -> Path:
  env = os.environ.get("PRIMAL_JAX_REFERENCE_DIR")
  return Path(env) if env else REPO.parent / "shared" / "reference"


REFERENCE_DIR = _reference_dir()
SKIP_REASON = f"reference folder {REFERENCE_DIR} not found (set PRIMAL_JAX_REFERENCE_DIR to the golden vectors)"


def _module_class(meta) -> str:
  return meta["torch_module"]["class"].split(" ")[0]


def _shipped_cases() -> list[str]:
  if not REFERENCE_DIR.is_dir():
    return []
  return sorted(
    p.stem for p in REFERENCE_DIR.glob("*.npz") if not LAYER_FILE.search(p.name) and p.with_suffix(".json").is_file()
  )


# Release module classes whose golden cases arrived before their converter: the open issue that adds it.
PENDING_CLASSES: dict[str, str] = {}


def _case_class(name: str) -> str:
  return _module_class(json.loads((REFERENCE_DIR / f"{name}.json").read_text()))


SHIPPED = [name for name in _shipped_cases() if _case_class(name) not in PENDING_CLASSES]
PENDING = [name for name in _shipped_cases() if _case_class(name) in PENDING_CLASSES]
# One skipped parameter (with the reason) instead of an empty parameter set when the folder is missing.
SHIPPED_PARAMS = SHIPPED or [pytest.param(None, marks=pytest.mark.skip(reason=SKIP_REASON))]
needs_reference = pytest.mark.skipif(not SHIPPED, reason=SKIP_REASON)


def _tolerance(module_class: str, key: str) -> float:
  return KSVD_SCALAR_TOL if module_class in CAUSAL_CLASSES and key in KSVD_SCALARS else TOL


def _assert_case_matches(case, ours) -> None:
  """Every golden output computed; floats within tolerance, integers exact."""
  assert set(ours) == set(case.outputs), (
    f"{case.name}: computed {sorted(ours)} but golden {sorted(case.outputs)}; "
    f"missing {sorted(set(case.outputs) - set(ours))}, extra {sorted(set(ours) - set(case.outputs))}"
  )
  errors = relative_errors(case, ours)
  assert set(errors) == set(case.outputs)
  module_class = _module_class(case.meta)
  for key, golden in case.outputs.items():
    assert ours[key].shape == golden.shape, f"{case.name}/{key}: {ours[key].shape} != {golden.shape}"
    if np.issubdtype(golden.dtype, np.integer):
      np.testing.assert_array_equal(ours[key], golden, err_msg=f"{case.name}/{key}")
      assert errors[key] == 0.0
    else:
      assert np.all(np.isfinite(ours[key])), f"{case.name}/{key}: non-finite"
      tol = _tolerance(module_class, key)
      assert errors[key] <= tol, f"{case.name}/{key}: max rel err {errors[key]:.3e} > {tol:.0e}"


def _load_raw(folder: Path, name: str):
  """The README's loading recipe, independent of primal_jax.convert.load_case."""
  z = np.load(folder / f"{name}.npz")
  meta = json.loads((folder / f"{name}.json").read_text())
  params = {str(k): z[str(k)] for k in z["param_keys"]}
  inputs = {str(k): z[str(k)] for k in z["input_keys"]}
  outputs = {str(k): z[str(k)] for k in z["output_keys"]}
  for key, info in meta["outputs"].items():
    if info["file"] != f"{name}.npz":
      outputs[key] = np.load(folder / info["file"])[info.get("key_in_file", key.split("/")[-1])]
  return meta, params, inputs, outputs


# ============================================================================ parity with the shipped golden vectors


@pytest.mark.parametrize("name", SHIPPED_PARAMS)
def test_shipped_case_parity(name):
  """run_case reproduces every golden output of the authors' PyTorch modules."""
  case = load_case(str(REFERENCE_DIR / f"{name}.npz"))
  _assert_case_matches(case, run_case(case))


@needs_reference
def test_shipped_folder_covers_every_release_class():
  """Guards against a silently shrunken folder: at least one case per supported release module class."""
  classes = {_case_class(name) for name in SHIPPED}
  # The release's baseline attentions (its RL Flowformer layer) have their cases in baselines/ (test_baseline_parity).
  baselines = {_module_class(json.loads(p.read_text())) for p in (REFERENCE_DIR / "baselines").glob("*.json")}
  # KEP-SVGP's cases (layer, ViT, metrics) are in kep_svgp/ (tests/test_kep_convert.py).
  kep = {module_class(json.loads(p.read_text())) for p in (REFERENCE_DIR / "kep_svgp").glob("*.json")}
  assert classes | baselines | kep == set(convert_cases.RUNNERS)
  # A case of a class neither supported nor pending (a new release module) fails here, not silently.
  assert {_case_class(name) for name in PENDING} <= set(PENDING_CLASSES)
  for name in PENDING:  # until its converter lands, verify refuses it with a clear error
    with pytest.raises(ValueError, match="unsupported module class"):
      run_case(load_case(str(REFERENCE_DIR / f"{name}.npz")))


@pytest.mark.parametrize("name", SHIPPED_PARAMS)
def test_numpy_reference_reproduces_shipped_golden(name):
  """The independent float64 reference used for synthetic cases matches the official modules."""
  meta, params, inputs, outputs = _load_raw(REFERENCE_DIR, name)
  mine = tref.run(meta["torch_module"]["class"], params, meta["config"], inputs)
  assert set(mine) == set(outputs)
  for key, golden in outputs.items():
    value = np.asarray(mine[key])
    assert value.shape == golden.shape, key
    if np.issubdtype(golden.dtype, np.integer):
      np.testing.assert_array_equal(value, golden, err_msg=key)
    else:
      err = np.max(np.abs(value - golden)) / np.max(np.abs(golden))
      assert err <= TOL, f"{name}/{key}: numpy reference rel err {err:.3e}"


# ============================================================================ the verify CLI


def _cli(*args, cwd=REPO):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
  return subprocess.Popen(
    [sys.executable, "-m", "primal_jax.convert", *args],
    cwd=cwd,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory):
  """Files that are not usable reference cases."""
  if not SHIPPED:
    pytest.skip(SKIP_REASON)
  tmp = tmp_path_factory.mktemp("cli")
  # A side file with a JSON beside it: loads past the JSON check, then must be recognised as no case.
  shutil.copy(REFERENCE_DIR / "ts_primal_layer_layer0.npz", tmp / "side.npz")
  shutil.copy(REFERENCE_DIR / "ts_primal_layer.json", tmp / "side.json")
  # A case npz without its JSON.
  shutil.copy(REFERENCE_DIR / "nlp_causal_layer.npz", tmp / "nojson.npz")
  # A case whose state_dict lacks one parameter.
  z = np.load(REFERENCE_DIR / "nlp_causal_layer.npz")
  arrays = {k: z[k] for k in z.files if k != "concate_weight.bias"}
  arrays["param_keys"] = np.array([k for k in z["param_keys"] if k != "concate_weight.bias"])
  np.savez(tmp / "missing_key.npz", **arrays)
  shutil.copy(REFERENCE_DIR / "nlp_causal_layer.json", tmp / "missing_key.json")
  # Not an npz archive at all.
  (tmp / "garbage.npz").write_text("not a zip archive")
  shutil.copy(REFERENCE_DIR / "nlp_causal_layer.json", tmp / "garbage.json")
  # A case whose token embedding lost columns (its per-layer output files beside it, as the case names them).
  z = np.load(REFERENCE_DIR / "lra_primalformer.npz")
  arrays = {k: z[k] for k in z.files}
  arrays["model.embeddings.word_embeddings.weight"] = arrays["model.embeddings.word_embeddings.weight"][:, :3]
  np.savez(tmp / "wrong_shape.npz", **arrays)
  shutil.copy(REFERENCE_DIR / "lra_primalformer.json", tmp / "wrong_shape.json")
  for layer_file in REFERENCE_DIR.glob("lra_primalformer_layer*.npz"):
    shutil.copy(layer_file, tmp / layer_file.name)
  # A timm state_dict whose first attention projection lost columns.
  z = np.load(REPO / "tests" / "data" / "timm_vit_small.npz")
  arrays = {k: z[k] for k in z.files}
  arrays["blocks.0.attn.qkv.weight"] = arrays["blocks.0.attn.qkv.weight"][:, :10]
  np.savez(tmp / "timm_wrong_shape.npz", **arrays)
  return {
    "side_in_place": (REFERENCE_DIR / "ts_primal_layer_layer0.npz", r"missing .*ts_primal_layer_layer0\.json"),
    "side_with_json": (tmp / "side.npz", r"no 'param_keys' array: not a reference case"),
    "no_json": (tmp / "nojson.npz", r"missing .*nojson\.json"),
    "nonexistent": (tmp / "does_not_exist.npz", r"must be an existing \.npz file.*does_not_exist\.npz"),
    "not_npz": (REFERENCE_DIR / "ts_primal_layer.json", r"must be an existing \.npz file"),
    "missing_key": (tmp / "missing_key.npz", r"no key 'concate_weight\.bias'"),
    "garbage": (tmp / "garbage.npz", r"garbage\.npz is not an \.npz archive"),
    "wrong_shape": (
      tmp / "wrong_shape.npz",
      r"parameter /body/embed/tokens/embedding \(state_dict key model\.embeddings\.word_embeddings\.weight\) has "
      r"shape \(\d+, 3\), but the module its JSON describes expects \(\d+, 64\)",
    ),
    "timm_wrong_shape": (
      tmp / "timm_wrong_shape.npz",
      r"blocks\.0\.attn\.qkv\.weight must be \[3D, D\], got \(\d+, 10\)",
    ),
  }


# Also checked end to end, in one process.
BAD_IN_PROCESS = ("side_in_place", "no_json", "nonexistent", "garbage", "wrong_shape")


@pytest.fixture(scope="module")
def cli_runs(bad_inputs):
  """End-to-end `python -m primal_jax.convert` runs {run: (exit code, stdout, stderr)}, run concurrently."""
  timm_path = bad_inputs["timm_wrong_shape"][0]
  commands = {
    "ok": ["verify", str(REFERENCE_DIR / "ts_primal_layer.npz")],
    "strict": ["verify", str(REFERENCE_DIR / "nlp_causal_layer.npz"), "--tolerance", "1e-12"],
    "bad": ["verify", *(str(bad_inputs[name][0]) for name in BAD_IN_PROCESS)],
    "timm_wrong_shape": ["timm", str(timm_path), str(timm_path.parent / "timm_out"), "--model=deit_small_patch16_224"],
  }
  procs = {name: _cli(*args) for name, args in commands.items()}
  results = {}
  for name, proc in procs.items():
    out, err = proc.communicate(timeout=120)
    results[name] = (proc.returncode, out, err)
  return results


def test_cli_verify_passes_and_lists_every_output(cli_runs):
  rc, out, err = cli_runs["ok"]
  assert rc == 0, out + err
  case = load_case(str(REFERENCE_DIR / "ts_primal_layer.npz"))
  for key in case.outputs:
    assert re.search(rf"^\s+{re.escape(key)}\s+max rel err \S+\s+ok$", out, re.M), f"{key} not reported ok:\n{out}"
  assert "FAIL" not in out
  assert "all outputs within tolerance" in err


def test_cli_verify_fails_below_float32_accuracy(cli_runs):
  rc, out, err = cli_runs["strict"]
  assert rc == 1, out + err
  assert re.search(r"^\s+out\s+max rel err \S+\s+FAIL$", out, re.M), out
  assert "FAILED" in err


def test_cli_bad_inputs_exit_nonzero(cli_runs, bad_inputs):
  """A side file, a case without JSON, a missing path, a file that is no .npz archive, a weight of the wrong
  shape: exit 2, one clear line each, no traceback."""
  rc, out, err = cli_runs["bad"]
  assert rc == 2, out + err
  assert "Traceback" not in err
  for name in BAD_IN_PROCESS:
    path, message = bad_inputs[name]
    assert re.search(rf"^{re.escape(str(path))}: error: .*{message}", err, re.M), f"{name}:\n{err}"


def test_cli_timm_names_the_wrong_shaped_weight(cli_runs, bad_inputs):
  """A timm state_dict with a weight of the wrong shape: exit 2, one line naming the file and the parameter."""
  rc, out, err = cli_runs["timm_wrong_shape"]
  path, message = bad_inputs["timm_wrong_shape"]
  assert rc == 2, out + err
  assert re.fullmatch(rf"{re.escape(str(path))}: error: {message}\n", err), err


def test_verify_function_reports_to_the_given_stream():
  if not SHIPPED:
    pytest.skip(SKIP_REASON)
  path = str(REFERENCE_DIR / "nlp_causal_layer.npz")
  report = io.StringIO()
  assert cli.verify(path, 1e-12, out=report) is False
  lines = report.getvalue().splitlines()
  assert lines[0].startswith("nlp_causal_layer (PrimalMultiheadAttention")
  assert any(line.rstrip().endswith("FAIL") for line in lines)
  assert cli.verify(path, 1e-4, out=io.StringIO()) is True


@pytest.mark.parametrize("flag, expected", [([], "highest"), (["--precision=default"], "default")])
def test_verify_runs_at_the_precision_it_is_given(monkeypatch, flag, expected):
  """verify runs each case at full float32 matmul precision unless told otherwise (an accelerator's default,
  TF32 or bf16 passes, would miss the golden numbers by ~1e-3 and read as a wrong conversion)."""
  import jax

  if not SHIPPED:
    pytest.skip(SKIP_REASON)
  seen = []
  real_run_case = convert_cases.run_case

  def recording_run_case(case, *args, **kwargs):
    seen.append(jax.config.jax_default_matmul_precision)
    return real_run_case(case, *args, **kwargs)

  monkeypatch.setattr(cli, "run_case", recording_run_case)
  with jax.default_matmul_precision(None):
    status = cli.main(["verify", str(REFERENCE_DIR / "ts_primal_layer.npz"), *flag])
  assert seen == [expected]
  # At the platform's default an accelerator may miss the tolerance (exit 1); at "highest" every platform passes.
  assert status == 0 if expected == "highest" else status in (0, 1)


@pytest.mark.parametrize(
  "run",
  ["side_in_place", "side_with_json", "no_json", "nonexistent", "not_npz", "missing_key", "garbage", "wrong_shape"],
)
def test_cli_each_bad_input_exits_nonzero_with_message(bad_inputs, capsys, run):
  """`main` (what `python -m primal_jax.convert` exits with) on one bad file: 2 and one line naming the file (and
  the parameter, for a weight of the wrong shape), no traceback."""
  path, message = bad_inputs[run]
  assert cli.main(["verify", str(path)]) == 2
  err = capsys.readouterr().err
  assert re.search(rf"^{re.escape(str(path))}: error: .*{message}", err, re.M), f"/{message}/ not in:\n{err}"
  assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
  "args,message",
  [
    (["--tolerance", "0"], "--tolerance must be > 0"),
    (["--tolerance=-1e-3"], "--tolerance must be > 0"),
    (["--tolerance", "-0.5"], "--tolerance must be > 0"),
    (["--tolerance", "small"], "invalid float value"),
  ],
)
def test_cli_bad_tolerance_exits_2(capsys, args, message):
  with pytest.raises(SystemExit) as exc:
    cli.main(["verify", "case.npz", *args])
  assert exc.value.code == 2
  err = capsys.readouterr().err
  assert "usage:" in err and message in err


def test_cli_needs_a_command_and_a_case(capsys):
  for argv in ([], ["verify"]):
    with pytest.raises(SystemExit) as exc:
      cli.main(argv)
    assert exc.value.code == 2
  assert "usage:" in capsys.readouterr().err


# ============================================================================ synthetic cases of other shapes


def _torch_linear(rng, sd, name, fan_in, fan_out):
  bound = 1.0 / np.sqrt(fan_in)  # nn.Linear default init
  sd[name + ".weight"] = rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32)
  sd[name + ".bias"] = rng.uniform(-bound, bound, (fan_out,)).astype(np.float32)


def _torch_layer_norm(rng, sd, name, dim):
  sd[name + ".weight"] = (1.0 + 0.1 * rng.standard_normal(dim)).astype(np.float32)
  sd[name + ".bias"] = (0.1 * rng.standard_normal(dim)).astype(np.float32)


def _primal_params(rng, sd, prefix, layout, dim, heads, rows, low_rank):
  """One primal layer in torch layout: We/Wr [H, rows, s] (rows = n or p)."""
  keys, p = tref.LAYOUTS[layout], dim // heads
  _torch_linear(rng, sd, prefix + keys["q"], dim, dim)
  _torch_linear(rng, sd, prefix + keys["k"], dim, dim)
  _torch_linear(rng, sd, prefix + keys["out"], dim, dim)
  _torch_linear(rng, sd, prefix + keys["combine"], 2 * low_rank, p)
  for name in ("We", "Wr"):
    sd[prefix + keys[name]] = (rng.standard_normal((heads, rows, low_rank)) / np.sqrt(rows)).astype(np.float32)
  sd[prefix + keys["Lambda"]] = rng.uniform(0.0, 1.0, (heads, low_rank)).astype(np.float32)


def _write_case(folder: Path, name: str, module_class: str, config: dict, sd: dict, inputs: dict) -> Path:
  """Writes <name>.npz / .json (+ <name>_layer<i>.npz) in the reference folder's format."""
  golden = tref.run(module_class, sd, config, inputs)
  outputs = {
    k: np.asarray(v).astype(np.int64 if np.issubdtype(np.asarray(v).dtype, np.integer) else np.float32)
    for k, v in golden.items()
  }
  main = {k: v for k, v in outputs.items() if "/" not in k}
  assert not (set(sd) & set(inputs)) and not (set(sd) & set(main)) and not (set(inputs) & set(main))
  files, meta_outputs = [f"{name}.npz"], {}
  for key, value in outputs.items():
    meta_outputs[key] = {"shape": list(value.shape), "dtype": str(value.dtype), "file": f"{name}.npz"}
  layer_ids = sorted({k.split("/")[0] for k in outputs if "/" in k})
  for layer in layer_ids:
    file = f"{name}_{layer}.npz"
    np.savez_compressed(folder / file, escore=outputs[f"{layer}/escore"], rscore=outputs[f"{layer}/rscore"])
    files.append(file)
    for what in ("escore", "rscore"):
      meta_outputs[f"{layer}/{what}"].update(file=file, key_in_file=what)
  np.savez_compressed(
    folder / f"{name}.npz",
    **sd,
    **inputs,
    **main,
    param_keys=np.array(list(sd)),
    input_keys=np.array(list(inputs)),
    output_keys=np.array(list(main)),
  )
  meta = {
    "case": name,
    "set": "synthetic",
    "torch_module": {"class": module_class},
    "config": config,
    "outputs": meta_outputs,
    "files": files,
  }
  (folder / f"{name}.json").write_text(json.dumps(meta, indent=1))
  return folder / f"{name}.npz"


def _lra_case(folder, name, *, seed, layers, dim, heads, hidden, vocab, max_len, classes, s, rank_multi, mask, **cfg):
  """A release LRA `ModelForSC` with the given per-layer attention ("primal" / "softmax")."""
  rng = np.random.default_rng(seed)
  batch, length = mask.shape
  n = s * rank_multi
  sd = {
    "model.embeddings.word_embeddings.weight": (0.5 * rng.standard_normal((vocab, dim))).astype(np.float32),
    "model.embeddings.position_embeddings.weight": (0.5 * rng.standard_normal((max_len, dim))).astype(np.float32),
  }
  for i, kind in enumerate(layers):
    prefix = f"model.transformer_{i}."
    _torch_layer_norm(rng, sd, prefix + "norm1", dim)
    if kind == "primal":
      _primal_params(rng, sd, prefix + "mha.", "lra", dim, heads, n, s)
    else:
      for role in ("W_q", "W_k", "W_v", "ff"):
        _torch_linear(rng, sd, prefix + "mha." + role, dim, dim)
    _torch_layer_norm(rng, sd, prefix + "norm2", dim)
    _torch_linear(rng, sd, prefix + "mlpblock.0", dim, hidden)
    _torch_linear(rng, sd, prefix + "mlpblock.3", hidden, dim)
  _torch_layer_norm(rng, sd, "model.norm", dim)
  _torch_linear(rng, sd, "seq_classifer.mlpblock.0", dim, hidden)
  _torch_linear(rng, sd, "seq_classifer.mlpblock.2", hidden, classes)
  config = dict(
    learn_pos_emb=True,
    tied_weights=False,
    embedding_dim=dim,
    transformer_dim=dim,
    transformer_hidden_dim=hidden,
    head_dim=dim // heads,
    num_head=heads,
    num_layers=len(layers),
    vocab_size=vocab,
    max_seq_len=max_len,
    dropout_prob=0.1,
    attention_dropout=0.1,
    num_classes=classes,
    mixed_precision=False,
    attention_grad_checkpointing=False,
    attn_type="primal_cos" if "primal" in layers else "softmax",
    low_rank=s,
    rank_multi=rank_multi,
    **cfg,
  )
  inputs = {
    "input_ids": (rng.integers(1, vocab, (batch, length)) * mask).astype(np.int64),
    "mask": mask.astype(np.float32),
    "label": rng.integers(0, classes, batch).astype(np.int64),
  }
  return _write_case(folder, name, "ModelForSC", config, sd, inputs)


def _trailing_padding(length, pads):
  return np.stack([np.arange(length) < length - k for k in pads]).astype(np.float32)


def _ts_case(folder, name, *, seed, layers, batch, length, dim, heads, max_len, s, rank_multi, classes, eta):
  rng = np.random.default_rng(seed)
  n = min(max_len, s * rank_multi)
  sd = {}
  for i in range(layers):
    _primal_params(rng, sd, f"layer{i}." if i else "", "timeseries", dim, heads, n, s)
  config = dict(
    max_seq_len=max_len,
    attn_type="primal_cos",
    d_model=dim,
    n_heads=heads,
    low_rank=s,
    rank_multi=rank_multi,
    nb_features=dim,
    attention_dropout=0.1,
    d_keys=None,
    d_values=None,
    eta=eta,
  )
  inputs = {
    "x": rng.standard_normal((batch, length, dim)).astype(np.float32),
    "logits": rng.standard_normal((batch, classes)).astype(np.float32),
    "targets": rng.integers(0, classes, (batch, 1)).astype(np.int64),
  }
  return _write_case(folder, name, "AttentionLayer (inner_attention = PrimalCosAttention)", config, sd, inputs)


def _rl_case(folder, name, *, seed, batch, length, dim, heads, s, eta):
  rng = np.random.default_rng(seed)
  sd = {}
  _primal_params(rng, sd, "", "rl", dim, heads, dim // heads, s)
  config = dict(d_model=dim, n_heads=heads, seq_len=length, low_rank=s, rank_multi=10, drop_out=0.05, eta=eta)
  inputs = {"x": rng.standard_normal((batch, length, dim)).astype(np.float32)}
  return _write_case(folder, name, "Primal_attention", config, sd, inputs)


def _fairseq_case(folder, name, *, seed, time, batch, dim, heads, s):
  rng = np.random.default_rng(seed)
  sd = {}
  _primal_params(rng, sd, "", "fairseq", dim, heads, dim // heads, s)
  config = dict(embed_dim=dim, num_heads=heads, seq_len=512, low_rank=s, rank_multi=10, self_attention=True)
  inputs = {"x": rng.standard_normal((time, batch, dim)).astype(np.float32)}
  return _write_case(folder, name, "PrimalMultiheadAttention", config, sd, inputs)


def _internal_padding(seed, batch, length):
  mask = (np.random.default_rng(seed).uniform(size=(batch, length)) > 0.25).astype(np.float32)
  mask[:, 0] = 1.0  # no sequence is all padding
  return mask


# The LRA cases share B = 3, N = 55 and the model sizes (and so most compiled ops); they differ from the
# shipped cases (B = 4, N = 300, D = 64, H = 2) everywhere.
LRA_SIZES = dict(dim=32, heads=4, hidden=40, vocab=19, max_len=64, classes=3)

SYNTHETIC = {
  # PrimalFormer tree, 3 layers primal / softmax / primal, n = 64 > N = 55 (repeated rows), trailing padding.
  "lra_mixed3": lambda d: _lra_case(
    d,
    "lra_mixed3",
    seed=1,
    layers=("primal", "softmax", "primal"),
    s=8,
    rank_multi=8,
    mask=_trailing_padding(55, [0, 4, 19]),
    pooling_mode="MEAN",
    eta=0.07,
    trace_no_x=True,
    **LRA_SIZES,
  ),
  # Primal.+Trans. tree: softmax then primal, n = 27 < N = 55 (a pair where torch's integer linspace
  # differs from floor(i (N-1)/(n-1))), padding inside sequences, data-dependent trace (trace_no_x False).
  "lra_plus_trans": lambda d: _lra_case(
    d,
    "lra_plus_trans",
    seed=2,
    layers=("softmax", "primal"),
    s=9,
    rank_multi=3,
    mask=_internal_padding(2, 3, 55),
    pooling_mode="MEAN",
    eta=0.2,
    trace_no_x=False,
    **LRA_SIZES,
  ),
  # CLS pooling: the release prepends token vocab_size-1 and drops the last token (append_cls).
  "lra_cls": lambda d: _lra_case(
    d,
    "lra_cls",
    seed=3,
    layers=("primal", "primal"),
    s=8,
    rank_multi=8,
    mask=_trailing_padding(55, [0, 6, 2]),
    pooling_mode="CLS",
    eta=0.1,
    trace_no_x=True,
    **LRA_SIZES,
  ),
  # Time series, 3 layers, n = 34 < L = 46 (a subset of rows; torch linspace != floor for this pair).
  "ts_stack3": lambda d: _ts_case(
    d,
    "ts_stack3",
    seed=4,
    layers=3,
    batch=3,
    length=46,
    dim=32,
    heads=4,
    max_len=46,
    s=17,
    rank_multi=2,
    classes=5,
    eta=0.3,
  ),
  # Causal layers: H = 2 (shipped RL: 1), T = 17, B = 3 (shipped NLP: T = 50, B = 2, H = 4); same sizes for both
  # so they share compiled ops.
  "rl_two_heads": lambda d: _rl_case(d, "rl_two_heads", seed=6, batch=3, length=17, dim=24, heads=2, s=5, eta=0.02),
  "nlp_small": lambda d: _fairseq_case(d, "nlp_small", seed=7, time=17, batch=3, dim=24, heads=2, s=5),
}


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory):
  folder = tmp_path_factory.mktemp("synthetic_cases")
  for build in SYNTHETIC.values():
    build(folder)
  return folder


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_case_matches_independent_reference(synthetic_dir, name):
  """The converter works for other shapes/layer patterns of the same module classes."""
  case = load_case(str(synthetic_dir / f"{name}.npz"))
  _assert_case_matches(case, run_case(case))


def test_synthetic_cases_exercise_what_they_claim(synthetic_dir):
  """The synthetic files really have the shapes the generality tests rely on."""
  mixed = load_case(str(synthetic_dir / "lra_mixed3.npz"))
  assert {"layer0/escore", "layer2/escore"} <= set(mixed.outputs) and "layer1/escore" not in mixed.outputs
  assert mixed.params["model.transformer_0.mha.We"].shape[1] > mixed.inputs["mask"].shape[1]  # n > N
  assert len(np.unique(mixed.outputs["sampled_indices"])) < len(mixed.outputs["sampled_indices"])
  plus = load_case(str(synthetic_dir / "lra_plus_trans.npz"))
  n, length = plus.params["model.transformer_1.mha.We"].shape[1], plus.inputs["mask"].shape[1]
  floor = np.floor(np.arange(n) * (length - 1) / (n - 1)).astype(np.int64)
  assert np.any(plus.outputs["sampled_indices"] != floor)  # torch's rule, not floor
  ts = load_case(str(synthetic_dir / "ts_stack3.npz"))
  assert {"out", "layer1_out", "layer2_out", "layer2/escore"} <= set(ts.outputs)
  assert ts.outputs["sampled_indices"].shape[0] < ts.inputs["x"].shape[1]  # n < L
  assert load_case(str(synthetic_dir / "rl_two_heads.npz")).params["We"].shape[0] == 2


def test_relative_errors_metric_and_shape_check(synthetic_dir):
  case = load_case(str(synthetic_dir / "nlp_small.npz"))
  ours = {k: v.astype(np.float64) for k, v in case.outputs.items()}
  assert all(err == 0.0 for err in relative_errors(case, ours).values())
  scale = np.max(np.abs(case.outputs["out"]))
  ours["out"] = ours["out"] + 1e-3 * scale
  assert relative_errors(case, ours)["out"] == pytest.approx(1e-3, rel=1e-6)
  assert set(relative_errors(case, {"out": ours["out"]})) == {"out"}  # only what was computed
  ours["escore"] = ours["escore"][:, :, :-1]
  with pytest.raises(ValueError, match="escore"):
    relative_errors(case, ours)


# ============================================================================ converter errors


def _nlp_state_dict():
  rng = np.random.default_rng(0)
  sd = {}
  _primal_params(rng, sd, "", "fairseq", 12, 3, 4, 2)
  return sd


@pytest.mark.parametrize("missing", ["Lambda", "q_proj.bias", "concate_weight.weight", "out_proj.weight"])
def test_attention_params_missing_key_names_it(missing):
  sd = _nlp_state_dict()
  del sd[missing]
  with pytest.raises(KeyError, match=re.escape(f"'{missing}'")):
    torch_layout.attention_params(sd, "", "fairseq")


def test_attention_params_layout_and_values():
  """Flax layout: kernels W.T with an explicit head axis (head a owns channels a*p:(a+1)*p)."""
  sd = _nlp_state_dict()
  params = torch_layout.attention_params(sd, "", "fairseq")
  assert set(params) == {"We", "Wr", "Lambda", "combine", "query", "key", "out"}
  w_q, b_q = sd["q_proj.weight"], sd["q_proj.bias"]
  np.testing.assert_array_equal(params["query"]["kernel"][:, 1, :], w_q[4:8].T)
  np.testing.assert_array_equal(params["query"]["bias"][2], b_q[8:12])
  np.testing.assert_array_equal(params["out"]["kernel"][1], sd["out_proj.weight"][:, 4:8].T)
  np.testing.assert_array_equal(params["combine"]["kernel"], sd["concate_weight.weight"].T)
  np.testing.assert_array_equal(params["We"], sd["We"])


def test_lra_missing_key_names_it(synthetic_dir):
  case = load_case(str(synthetic_dir / "lra_mixed3.npz"))
  for missing in ("model.transformer_2.mha.attn.concate_weight.bias", "model.transformer_1.mha.W_v.weight"):
    sd = dict(case.params)
    del sd[missing]
    with pytest.raises(KeyError, match=re.escape(f"'{missing}'")):
      torch_layout.lra_classifier_params(sd, case.meta["config"]["num_head"])


def test_softmax_layer_needs_num_heads(synthetic_dir):
  case = load_case(str(synthetic_dir / "lra_mixed3.npz"))
  with pytest.raises(ValueError, match="num_heads"):
    torch_layout.attention_params(case.params, "model.transformer_1.mha.", "lra")
  params = torch_layout.attention_params(case.params, "model.transformer_1.mha.", "lra", num_heads=4)
  assert set(params) == {"query", "key", "value", "out"}
  assert params["value"]["kernel"].shape == (32, 4, 8)


def test_head_projection_rejects_indivisible_heads():
  sd = _nlp_state_dict()
  with pytest.raises(ValueError, match="num_heads=5"):
    torch_layout.head_projection(sd, "q_proj", 5)


def test_lra_classifier_params_rejects_other_state_dicts():
  with pytest.raises(ValueError, match="not an LRA ModelForSC"):
    torch_layout.lra_classifier_params(_nlp_state_dict(), 2)


def test_run_case_rejects_unknown_module_class(synthetic_dir):
  case = load_case(str(synthetic_dir / "nlp_small.npz"))
  case.meta = dict(case.meta, torch_module={"class": "Linformer"})
  with pytest.raises(ValueError, match="unsupported module class 'Linformer'"):
    run_case(case)


def test_load_case_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="existing .npz"):
    load_case(str(tmp_path / "nothing.npz"))
  np.savez(tmp_path / "plain.npz", a=np.zeros(2))
  with pytest.raises(FileNotFoundError, match="plain.json"):
    load_case(str(tmp_path / "plain.npz"))
  (tmp_path / "plain.json").write_text("{}")
  with pytest.raises(ValueError, match="param_keys"):
    load_case(str(tmp_path / "plain.npz"))


def test_runners_cover_the_release_classes():
  # The release's RL Flowformer layer (a baseline) has its float64 reference in tests/test_reformer_flowformer.py.
  # KEP-SVGP's float64 references: tests/reference_kep_numpy.py and the golden cases (tests/test_kep_svgp.py).
  kep = {"KEP_SVGPAttention", "ViT", "CIFAR/utils/metrics.py"}
  assert set(convert_cases.RUNNERS) - {"Flowformer_attention"} - kep == set(tref.RUNNERS)


# ============================================================================ issue 54.8: inputs verify cannot read


def _tiny_ts_case(folder: Path) -> Path:
  """A one-layer time-series case with its per-layer file `ts_layer0.npz` beside it (outputs layer0/escore, rscore)."""
  return _ts_case(
    folder, "ts", seed=9, layers=1, batch=2, length=6, dim=8, heads=2, max_len=6, s=3, rank_multi=2, classes=3, eta=0.1
  )


def _damage(path: Path, member: str) -> None:
  """Flips a byte in the middle of `member`'s (compressed) data inside the zip archive at `path`."""
  import zipfile

  with zipfile.ZipFile(path) as zf:
    info = zf.getinfo(member)
  data = bytearray(path.read_bytes())
  name_len, extra_len = (
    int.from_bytes(data[info.header_offset + k : info.header_offset + k + 2], "little") for k in (26, 28)
  )
  start = info.header_offset + 30 + name_len + extra_len
  data[start + info.compress_size // 2] ^= 0xFF
  path.write_bytes(bytes(data))


def _verify_one_line(path: Path, capsys) -> tuple[int, str]:
  status = cli.main(["verify", str(path)])
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith(f"{path}: error: "), err  # one line naming the file, no traceback
  return status, err


@pytest.mark.parametrize("member", ["x.npy", "param_keys.npy"])
def test_verify_refuses_a_damaged_archive_with_exit_2(tmp_path, capsys, member):
  """Issue 54.8: a CRC-damaged .npz ended in a zipfile traceback (exit 1, the status of a wrong conversion)."""
  path = _tiny_ts_case(tmp_path)
  load_case(str(path))  # readable before the damage
  _damage(path, member)
  status, err = _verify_one_line(path, capsys)
  assert status == 2
  assert f"array {member[:-4]!r} cannot be read (" in err and "the archive is damaged" in err, err


def test_timm_refuses_a_damaged_state_dict_with_exit_2(tmp_path, capsys):
  z = np.load(REPO / "tests" / "data" / "timm_vit_small.npz")
  np.savez_compressed(tmp_path / "sd.npz", **{k: z[k] for k in z.files})
  _damage(tmp_path / "sd.npz", "blocks.0.mlp.fc1.weight.npy")
  status = cli.main(["timm", str(tmp_path / "sd.npz"), str(tmp_path / "out"), "--model=deit_small_patch16_224"])
  err = capsys.readouterr().err
  assert status == 2 and "array 'blocks.0.mlp.fc1.weight' cannot be read" in err and err.count("\n") == 1, err
  assert not (tmp_path / "out").exists()


BAD_JSON = {
  # (what to do to the parsed JSON, the message's tail)
  "a_list": (lambda meta: [meta], r"ts\.json must hold a JSON object \(a reference case's description\), got a list"),
  "eta_string": (
    lambda meta: {**meta, "config": {**meta["config"], "eta": "0.1"}},
    r"ts\.json: config\.eta must be a finite number, got '0\.1' \(a string\)",
  ),
  "eta_nan": (
    lambda meta: {**meta, "config": {**meta["config"], "eta": float("nan")}},
    r"ts\.json: config\.eta must be a finite number, got nan \(a float\)",
  ),
  "config_list": (lambda meta: {**meta, "config": [1]}, r"ts\.json: config must be an object, got \[1\] \(a list\)"),
  "outputs_list": (lambda meta: {**meta, "outputs": ["out"]}, r"ts\.json: outputs must be an object, got \['out'\]"),
  "class_number": (
    lambda meta: {**meta, "torch_module": {"class": 3}},
    r"ts\.json: torch_module\.class must be a string, got 3 \(a int\)",
  ),
  "heads_bool": (
    lambda meta: {**meta, "torch_module": {"class": "Flowformer_attention"}, "config": {"n_heads": True}},
    r"ts\.json: config\.n_heads must be an integer, got True \(true/false\)",
  ),
  "heads_missing": (
    lambda meta: {**meta, "torch_module": {"class": "Flowformer_attention"}, "config": {}},
    r"ts\.json: config has no 'n_heads' \(an integer\), which a Flowformer_attention case needs",
  ),
  "not_json": (None, r"ts\.json is not valid JSON \(Expecting value: line 1 column 1 \(char 0\)\)"),
}


@pytest.mark.parametrize("name", sorted(BAD_JSON))
def test_verify_refuses_a_case_json_of_the_wrong_shape_with_exit_2(tmp_path, capsys, name):
  """Issue 54.8: a JSON list, or a field of the wrong type, ended in a traceback (exit 1) from inside the runner."""
  _tiny_ts_case(tmp_path)
  change, message = BAD_JSON[name]
  json_path = tmp_path / "ts.json"
  json_path.write_text("nope" if change is None else json.dumps(change(json.loads(json_path.read_text()))))
  status, err = _verify_one_line(tmp_path / "ts.npz", capsys)
  assert status == 2 and re.search(message, err), err


def test_verify_names_a_missing_per_layer_file(tmp_path, capsys):
  """Issue 54.8: a per-layer output file the JSON names but that is absent read "not an .npz archive"."""
  _tiny_ts_case(tmp_path)
  case = load_case(str(tmp_path / "ts.npz"))
  with np.load(tmp_path / "ts_layer0.npz") as side:
    np.testing.assert_array_equal(case.outputs["layer0/escore"], side["escore"])  # read from the side file
  (tmp_path / "ts_layer0.npz").unlink()
  status, err = _verify_one_line(tmp_path / "ts.npz", capsys)
  assert status == 2
  assert f"output 'layer0/escore' is in ts_layer0.npz, which is missing beside {tmp_path / 'ts.npz'}" in err, err
  assert "not an .npz archive" not in err


def test_a_registered_case_kind_has_its_fields_checked(tmp_path, capsys):
  """A kind added to `kinds.CASE_KINDS` (what H6's KEP-SVGP kind does) gets the same JSON check: its declared field
  of the wrong type is one line; once the block ends the class is unknown again."""
  from primal_jax.convert.kinds import CASE_KINDS, INT, CaseKind, Field

  path = _tiny_ts_case(tmp_path)
  meta = json.loads((tmp_path / "ts.json").read_text())
  meta["torch_module"]["class"] = "MyLayer"
  meta["config"]["d_model"] = "8"
  (tmp_path / "ts.json").write_text(json.dumps(meta))
  with pytest.raises(ValueError, match="a lazy entry must be 'module:attribute'"):
    CaseKind("run_my_layer")
  kind = CaseKind("primal_jax.convert.cases:run_timeseries_layers", {"d_model": Field(INT)})
  with CASE_KINDS.registered("MyLayer", kind):
    status, err = _verify_one_line(path, capsys)
    assert status == 2 and "ts.json: config.d_model must be an integer, got '8' (a string)" in err, err
  case = load_case(str(path))  # the kind's fields are not checked once it is gone; the class is then unknown
  with pytest.raises(ValueError, match="unsupported module class 'MyLayer'"):
    run_case(case)
