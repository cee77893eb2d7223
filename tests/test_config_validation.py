"""One validation pass of the resolved config before anything is written (issue 54, items 1, 4, 5 and 6).

Before: `--config.ksvd.eta=-0.5` (or NaN) and `--config.ksvd.spec=nope` wrote config.json, metrics.jsonl and
checkpoints/, then died with a traceback, and the corrected rerun was refused (the bad value was the run's
recorded config); `low_rank=0`, `data.batch_size=0`, `total_steps=-5`, `model.dropout_rate=2.0` ended in
tracebacks (exit 1) after the workdir was created; `--config=lm:model=yoso_e` was accepted and died at init, and
a sweep override of the wrong type was a traceback. Now each is one line naming `--config.KEY`, the value and
what is accepted, exit status 2, with the workdir never created; the corrected rerun trains.

The binaries are run as subprocesses (each a fresh Python importing JAX), four at a time in one fixture; the
schema itself is checked in-process on every recorded config and on bad values of every section.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from experiments.engine.runner import run_sweep
from experiments.engine.spec import Cell, Run, Sweep
from primal_jax.attention.registry import ATTENTIONS, MODEL_NEEDS, capabilities, unsupported
from primal_jax.cli.config_lookup import load_config
from primal_jax.dotted import set_dotted
from primal_jax.errors import ConfigError
from primal_jax.training.config_schema import check_config, problems

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
MAIN = [sys.executable, "-m", "experiments.main"]
PREFIX = "python -m experiments.main: error: "
SNAPSHOT = json.loads((ROOT / "tests" / "data" / "config_snapshots.json").read_text())["sha256"]

# {try: (override, the line's expected text after the prefix)}: each names --config.KEY, the value, what is accepted.
BAD = {
  "eta_negative": ("ksvd.eta=-0.5", "--config.ksvd.eta: ksvd.eta must be a finite number >= 0, got -0.5"),
  "spec": ("ksvd.spec=nope", "--config.ksvd.spec: ksvd.spec must be one of paper, release_lra, release_sequence, "
           "release_kep, got 'nope'"),  # fmt: skip
  "low_rank": ("model.attention.primal.low_rank=0", "--config.model.attention.primal.low_rank: attention 'primal': "
               "low_rank must be an integer >= 1, got 0"),  # fmt: skip
  "batch_size": ("data.batch_size=0", "--config.data.batch_size: data.batch_size must be an integer >= 1, got 0"),
  "total_steps": ("total_steps=-5", "--config.total_steps: total_steps must be an integer >= 0 (0: num_epochs "
                  "epochs), got -5"),  # fmt: skip
  "dropout": ("model.dropout_rate=2.0", "--config.model.dropout_rate: model.dropout_rate must be a finite number "
              "in [0, 1), got 2.0"),  # fmt: skip
}  # fmt: skip


def _tries(tmp: Path) -> dict[str, list[str]]:
  tries = {
    name: [*MAIN, "--config=lm:smoke", f"--config.{o}", f"--workdir={tmp / name}"] for name, (o, _) in BAD.items()
  }
  tries["lm_model_yoso"] = [*MAIN, "--config=lm:smoke,model=yoso_e", f"--workdir={tmp / 'lm_model_yoso'}"]
  return tries


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("validation")
  tries = _tries(tmp)

  def run(item):
    name, command = item
    return name, subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)

  with ThreadPoolExecutor(max_workers=4) as pool:
    return tmp, dict(pool.map(run, tries.items()))


def _line(result) -> str:
  assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
  assert "Traceback" not in result.stderr
  (line,) = result.stderr.strip().splitlines()
  assert line.startswith(PREFIX), line
  return line.removeprefix(PREFIX)


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_value_is_one_line_and_nothing_is_written(runs, name):
  tmp, results = runs
  line = _line(results[name])
  assert line.startswith(BAD[name][1]), line
  assert not (tmp / name).exists()  # not even the workdir: nothing of the refused run is recorded


def test_the_corrected_rerun_trains_in_the_same_workdir(runs):
  """The workdir of the refused `ksvd.eta=-0.5` is not poisoned: the same command with a good eta trains."""
  tmp, _ = runs
  workdir = tmp / "eta_negative"
  text = tmp / "text.txt"  # a small local file (source=file, split 90/5/5): evaluations of a few windows
  text.write_text(" ".join(f"word{i % 97}" for i in range(800)))
  data = ["--config.data.source=file", f"--config.data.path={text}"]
  command = [
    *MAIN,
    "--config=lm:smoke",
    *data,
    "--config.ksvd.eta=0.5",
    "--config.total_steps=2",
    f"--workdir={workdir}",
  ]
  result = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert json.loads((workdir / "config.json").read_text())["ksvd"]["eta"] == 0.5
  assert json.loads((workdir / "summary.json").read_text())["steps"] == 2


def test_lm_config_refuses_a_mechanism_it_cannot_train_and_decode(runs):
  name, model = "lm_model_yoso", "yoso_e"
  line = _line(runs[1][name])
  assert line.startswith(f"--config=lm:smoke,model={model}: config argument model='{model}': a 'lm' model trains "
                         "causally and decodes, and attention"), line  # fmt: skip
  accepted = line.rpartition("accepted: ")[2].split(", ")
  assert {"primalformer", "primal_plus", "softmax", "linear", "cosformer"} <= set(accepted)
  assert not {"yoso_e", "nystromformer", "soft", "linformer", "longformer", "reformer"} & set(accepted)


# --- the schema, in-process


@pytest.mark.parametrize("name", sorted(SNAPSHOT))
def test_every_recorded_config_passes(name):
  for arg in SNAPSHOT[name]:
    config = load_config(f"{name}:{arg}" if arg else name)
    assert problems(config) == [], (name, arg)


CASES = [  # (config, key, value, expected fragment of the refusal)
  (
    "lm:smoke",
    "model.layers",
    (("primal", {"low_rank": 0}),),
    "--config.model.layers: attention 'primal': low_rank must be an integer >= 1, got 0",
  ),  # fmt: skip
  (
    "lm:smoke",
    "model.layers",
    ("softmax", 5),
    "--config.model.layers: model.layers must be a non-empty list of "
    "registered attention names or [name, {option: value}] pairs, got the entry 5",
  ),  # fmt: skip
  ("lm:smoke", "model.attention.primal", None, "--config.model.attention.primal: its options must be a mapping"),
  ("lm:smoke", "mesh_shape", 5, "--config.mesh_shape: mesh_shape must be a list of integers >= 1"),
  ("lm:smoke", "data.seq_len", 0, "--config.data.seq_len: data.seq_len must be an integer >= 1, got 0"),
  ("lm:smoke", "data.source", "nope", "--config.data.source: data.source must be one of file, gensim_enwiki, got"),
  ("lm:smoke", "data.source", "file", "--config.data.path: data.path must be the path of a text file"),
  ("lra:smoke", "data.num_train", 0, "--config.data.num_train: data.num_train must be an integer >= 1, got 0"),
  (
    "lra:smoke",
    "data.min_length",
    500,
    "--config.data.max_length: data.max_length must be >= data.min_length + 2 "
    "= 502 (kept lengths lie strictly between them), got 200",
  ),  # fmt: skip
  (
    "lra:task=pathfinder,smoke",
    "data.difficulty",
    "expert",
    "--config.data.difficulty: data.difficulty must be one of easy, intermediate, hard, got 'expert'",
  ),  # fmt: skip
  ("lm:smoke", "ksvd.eta", float("nan"), "--config.ksvd.eta: ksvd.eta must be a finite number >= 0, got nan"),
  (
    "lm:smoke",
    "model.attention_dropout_rate",
    1.0,
    "--config.model.attention_dropout_rate: model.attention_dropout_rate must be a finite number in [0, 1), got 1.0",
  ),  # fmt: skip
  (
    "lm:smoke",
    "model.layers",
    ("yoso_e", "primal"),
    "--config.model.layers: model.name='lm' trains causally and "
    "decodes, and attention 'yoso_e' has no causal form; attentions it can use: ",
  ),  # fmt: skip
  (
    "lm:smoke",
    "model.layers",
    ("longformer",),
    "--config.model.layers: model.name='lm' trains causally and "
    "decodes, and attention 'longformer' has no incremental decoding form",
  ),  # fmt: skip
  ("uea:smoke", "seed", -1, "--config.seed: seed must be an integer in [0, 4294967295], got -1"),
  (
    "uea:smoke",
    "mesh_shape",
    (-1, -1),
    "--config.mesh_shape: mesh_shape must be a list of integers >= 1 with at most one -1",
  ),  # fmt: skip
  ("uea:smoke", "log_every_steps", 0, "--config.log_every_steps: log_every_steps must be an integer >= 1, got 0"),
  ("uea:smoke", "max_to_keep", 0, "--config.max_to_keep: max_to_keep must be None or an integer >= 1, got 0"),
  ("uea:smoke", "test_eval", "always", "--config.test_eval: test_eval must be one of"),
  ("uea:smoke", "best_metric", "validation/acc", "--config.best_metric: best_metric must be '' or 'SPLIT/METRIC'"),
  (
    "uea:smoke",
    "data.val_fraction",
    1.0,
    "--config.data.val_fraction: data.val_fraction must be a finite number in [0, 1), got 1.0",
  ),  # fmt: skip
  ("uea:smoke", "data.batch_size", True, "--config.data.batch_size: data.batch_size must be an integer >= 1, got True"),
  ("uea:smoke", "model.num_heads", 3, "--config.model.num_heads: model.dim=32 must be divisible by model.num_heads=3"),
  (
    "vit",
    "model.drop_path_rate",
    -0.1,
    "--config.model.drop_path_rate: model.drop_path_rate must be a finite number in [0, 1), got -0.1",
  ),  # fmt: skip
  ("lra:smoke", "model.dtype", "bf16", "--config.model.dtype: model.dtype must be one of"),
  ("lra:smoke", "optimizer.b2", 1.0, "--config.optimizer.b2: optimizer.b2 must be a finite number in [0, 1), got 1.0"),
  (
    "lra:smoke",
    "optimizer.warmup_steps",
    100,
    "--config.optimizer.warmup_steps: optimizer.warmup_steps must be in [0, total_steps=4], got 100",
  ),  # fmt: skip
  (
    "lra:smoke",
    "optimizer.learning_rate",
    float("inf"),
    "optimizer.learning_rate must be a finite number > 0, got inf",
  ),
  (
    "lra:smoke",
    "optimizer.grad_clip_norm",
    -1.0,
    "--config.optimizer.grad_clip_norm: optimizer.grad_clip_norm must "
    "be a finite number >= 0 (0: no clipping), got -1.0",
  ),  # fmt: skip
  ("lra:smoke", "ksvd.eta", None, "--config.ksvd.eta: ksvd.eta must be a finite number >= 0, got None"),
  ("lra:smoke", "model.layers", ("nope",), "--config.model.layers: model.layers names attention 'nope'; registered:"),
  (
    "uea:smoke",
    "model.attention.primal.feature_map",
    "x",
    "--config.model.attention.primal.feature_map: attention 'primal': feature_map must be one of",
  ),  # fmt: skip
  (
    "d4rl:smoke",
    "model.layers",
    ("gpt2", "linformer"),
    "--config.model.layers: model.name='decision_transformer' "
    "trains causally, and attention 'linformer' has no causal form",
  ),  # fmt: skip
  (
    "lm:smoke",
    "model.layers",
    ("cosformer",),
    "attention 'cosformer' with options {} in the causal+decode form: "
    "CosformerAttention: decode=True needs a fixed horizon",
  ),  # fmt: skip
]


@pytest.mark.parametrize(("spec", "key", "value", "expected"), CASES, ids=[f"{c[1]}={c[2]!r}" for c in CASES])
def test_a_bad_value_of_every_section_is_named(spec, key, value, expected):
  config = load_config(spec, lock=False)
  with config.ignore_type():  # a config file may hold any value; an override's type is checked before (ml_collections)
    set_dotted(config, key, value)
  with pytest.raises(ConfigError) as err:
    check_config(config)
  assert "\n" not in str(err.value) and expected in str(err.value), str(err.value)


def test_a_missing_section_or_key_is_named():
  config = load_config("uea:smoke", lock=False)
  del config["ksvd"]
  assert problems(config) == ["--config.ksvd: the config has no 'ksvd' section; every training config needs one"]
  config = load_config("uea:smoke", lock=False)
  del config.optimizer["learning_rate"]
  assert problems(config) == [
    "--config.optimizer.learning_rate: the config has no 'optimizer.learning_rate'; every training config needs it "
    "(a finite number > 0)"
  ]


# --- the mechanisms' metadata (item 6)


def test_capabilities_are_the_classes_attributes():
  for name in ATTENTIONS:
    cls, can = ATTENTIONS[name], capabilities(name)
    assert can.causal == cls.supports_causal and can.decode == (cls.supports_decode and cls.supports_causal), name
  assert unsupported("yoso_e", needs=("causal",)) == "attention 'yoso_e' has no causal form"
  assert "horizon" in unsupported("cosformer", needs=("causal", "decode"))
  assert unsupported("cosformer", {"horizon": 16}, needs=("causal", "decode")) is None
  assert unsupported("primal", {"data_dependent": False}, needs=MODEL_NEEDS["lm"]) is None
  with pytest.raises(ValueError, match="needs must hold only causal, decode"):
    unsupported("softmax", needs=("bidirectional",))


def test_every_mechanism_the_lm_config_accepts_trains_and_decodes():
  """Each `lm:model=NAME` the config accepts builds a CausalLM whose full call and decoding step trace (every layer
  check runs at trace time; `eval_shape` runs nothing); every other registered name is refused by the config."""
  from primal_jax.models.lm import decode_step, init_cache
  from primal_jax.models.registry import build_model
  from primal_jax.tasks.lm.config import DECODE_OPTIONS

  info = type("Info", (), {"vocab_size": 16, "seq_len": 8, "num_classes": 0})()
  accepted = []
  for name in sorted(ATTENTIONS):
    if unsupported(name, DECODE_OPTIONS.get(name), needs=MODEL_NEEDS["lm"]) is not None:
      with pytest.raises(ConfigError, match=f"config argument model='{name}'"):
        load_config(f"lm:smoke,model={name}")
      continue
    accepted.append(name)
    config = load_config(f"lm:smoke,model={name}", lock=False)
    config.model.update(layers=(name,), dim=8, hidden_dim=16, num_heads=1)
    assert problems(config) == [], name
    model = build_model(config.model, info).module
    tokens = jnp.zeros((1, 8), jnp.int32)
    params = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]  # traces the full (training) call
    cache = jax.eval_shape(lambda: init_cache(model, 1))  # noqa: B023
    logits, _ = jax.eval_shape(lambda p, c: decode_step(model, p, c, tokens[:, :1]), params, cache)  # noqa: B023
    assert logits.shape == (1, 1, 16), name
  assert {"softmax", "linear", "performer", "cosformer", "flowformer", "gpt2", "primal"} <= set(accepted)


# --- the sweep binary (item 5: a sweep override of the wrong type)


def test_a_sweep_refuses_a_bad_run_before_it_writes(tmp_path):
  cell = Cell("t", (("model", "x"),))
  for overrides, expected in [
    (
      {"total_steps": "ten"},
      "override 'total_steps'='ten': total_steps takes a value of type int (the config's 40), got one of type str",
    ),
    ({"ksvd.eta": -1.0}, "run t {'model': 'x'} seed 0 (lm:smoke): --config.ksvd.eta: ksvd.eta must be a finite"),
  ]:
    sweep = Sweep((Run("lm:smoke", cell, overrides=overrides),))
    with pytest.raises(ConfigError) as err:
      run_sweep(sweep, tmp_path / "sweep", print_fn=lambda _: None)
    assert expected in str(err.value), str(err.value)
    assert not (tmp_path / "sweep").exists()


def test_sweep_binary_answers_a_bad_override_in_one_line(tmp_path):
  sweep_file = tmp_path / "bad.py"
  sweep_file.write_text(
    "from experiments.engine.spec import Cell, Run, Sweep\n\n\ndef get_sweep(arg):\n"
    "  return Sweep((Run('lm:smoke', Cell('t', (('model', 'x'),)), overrides={'ksvd.spec': 3}),))\n"
  )
  command = [sys.executable, "-m", "experiments.sweep", f"--sweep={sweep_file}", f"--workdir={tmp_path / 'w'}"]
  result = subprocess.run(command + ["--allocator=system"], cwd=ROOT, env=ENV, capture_output=True, text=True)
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
  (line,) = result.stderr.strip().splitlines()
  assert line == (
    "experiments.sweep: error: override 'ksvd.spec'=3: ksvd.spec takes a value of type str (the config's "
    "'release_sequence'), got one of type int"
  )
  assert not (tmp_path / "w" / "runs").exists()


@pytest.mark.parametrize("family", ["uea", "lra", "lm", "d4rl", "vit"])
def test_every_paper_sweep_run_passes(family):
  """No run of the paper's sweeps is refused: each planned config passes the validation the engine runs first."""
  from experiments.engine.runner import check_planned
  from experiments.engine.spec import load_sweep, plan

  check_planned(plan(load_sweep(ROOT / "experiments" / "sweeps" / f"{family}.py").runs))
