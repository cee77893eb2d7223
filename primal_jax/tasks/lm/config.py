r"""Byte-level causal language modelling (`text_bytes` task, `CausalLM`) through the one training binary.

  python -m experiments.main --config=lm --workdir=/tmp/lm_primalformer
  python -m experiments.main --config=lm --config.data.source=file \
    --config.data.path=/path/to/enwik8 --workdir=/tmp/lm_enwik8

Data: by default 6 MB of real English Wikipedia XML (enwik8's format) shipped in the gensim 4.4.0 wheel on PyPI
(`primal_jax.data.sources.gensim_enwiki`), split 90/5/5 by byte position as enwik8; any local file with `source=file`.

The release's language model (fairseq `transformer_lm` on WikiText-103, word level): 6 decoder layers, the last
one causal Primal-Attention with data-independent W_e, W_r (s = 30, eta = 0.1), 512-token context; test
perplexity 31.0 against 33.0 for the same Transformer with softmax everywhere. These numbers and settings are
the release's (its README and LM code), not the paper's: the paper has no language-modelling experiment. Not
reproduced here: WikiText-103 is not reachable offline and a 6-layer word-level run does not fit this machine.
This config trains the same kinds of models byte by byte on real Wikipedia XML.

Objective `next_token`: cross-entropy per real target byte, reported as bits per byte (= mean cross-entropy /
ln 2) and perplexity, selected on validation bits per byte (lower is better). Evaluation covers a whole split in
contiguous, non-overlapping windows (each byte predicted once, with the context since its window's start; no
sliding window). The KSVD loss is the release's per-sample one (`release_sequence`, its RL and LM convention).
`python -m experiments.generate --workdir=RUN --prompt=...` samples from a finished run.

Arguments (`--config=lm:model=softmax,short`):
  model: primalformer | primal_plus (last layer Primal) | softmax | any registered attention that trains causally
    and decodes (the registry's metadata, `primal_jax.attention.registry.unsupported`): gpt2, linear, performer,
    flowformer, cosformer (its horizon set to the window, data.seq_len); one without a causal or a decoding form
    (linformer, nystromformer, soft, yoso_e; longformer, reformer) is refused at once, naming the accepted ones.
  eta: the KSVD weight of the Primal layers (-1: 0.1, the release's); 0 trains them without the regulariser.
  short: 4 layers, dim 128, 128-byte windows, batch 16, 1,500 steps, test evaluated once at the best validation
    state. Measured on 2 CPU cores with another job running beside it: 0.45-0.5 s per step and ~20 s per split
    evaluation, about 13-15 minutes a run (experiments/sweeps/lm.py records each run's time).
  smoke: a seconds-long run on a tiny model (tests, CI).
"""

from __future__ import annotations

import ml_collections

from primal_jax.models.config import STACKS, model_layers
from primal_jax.tasks.common import base_config, check_model_arg, optimizer, parse_config_arg, run_controls
from primal_jax.tasks.lm.text_bytes import SOURCES
from primal_jax.training.config_schema import register_data_fields
from primal_jax.training.config_schema.rules import TEXT, integer, one_of


def _text_bytes_checks(config) -> list[str]:
  data = config.data
  if data.get("source") == "file" and not data.get("path"):
    return ["--config.data.path: data.path must be the path of a text file with data.source='file', got ''"]
  return []


# The text_bytes pipeline's own keys, checked by the one validation pass before anything is written.
register_data_fields(
  "text_bytes", {"data.source": one_of(SOURCES), "data.seq_len": integer(1), "data.path": TEXT}, _text_bytes_checks
)

# The options the config gives a mechanism whose decoding needs one (checked with `model=`): cosFormer's horizon,
# the re-weighting's length scale, is the window (set to data.seq_len below; any positive value decodes).
DECODE_OPTIONS = {"primal": {"data_dependent": False}, "cosformer": {"horizon": 256}}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = parse_config_arg(arg, {"model": "primalformer", "eta": -1.0, "short": False, "smoke": False})
  check_model_arg(args["model"], "lm", STACKS, DECODE_OPTIONS)
  config = base_config(task="next_token")  # the task: also the `lm` builder's own; stated so the config reads alone

  config.data = dict(
    task="text_bytes", source="gensim_enwiki", path="", seq_len=256, batch_size=32, eval_batch_size=64, seed=0
  )
  config.model = dict(
    name="lm",
    layers=model_layers(args["model"], 4),
    attention=dict(primal=dict(low_rank=20, data_dependent=False, feature_map="cosine")),
    dim=256,
    hidden_dim=1024,
    num_heads=4,
    dropout_rate=0.1,
    attention_dropout_rate=0.1,
    dtype="float32",
    param_dtype="float32",
  )
  eta = 0.1 if args["eta"] < 0 else args["eta"]
  config.ksvd = dict(eta=eta if "primal" in config.model.layers else 0.0, spec="release_sequence")
  config.optimizer = optimizer(
    "adamw",
    1e-3,
    warmup_steps=500,
    schedule="cosine",
    end_lr_factor=0.1,
    b2=0.98,
    weight_decay=0.01,
    grad_clip_norm=1.0,
  )
  run_controls(
    config,
    num_epochs=1,
    total_steps=20_000,
    log_every_steps=100,
    eval_every_steps=2_000,  # eval_every_epochs is unused while it is set
    checkpoint_every_steps=2_000,
    best_metric="validation/bits_per_byte",
    test_eval="every_eval",
    checkpoint_on_eval=True,
  )

  if args["short"]:
    config.data.update(seq_len=128, batch_size=16)
    config.model.update(dim=128, hidden_dim=512)
    config.optimizer.update(warmup_steps=150)
    config.total_steps = 1_500
    config.eval_every_steps = 500
    config.checkpoint_every_steps = 500
    config.test_eval = "best_validation"  # validation every 500 steps, test once on the best state
  if args["smoke"]:
    config.data.update(seq_len=32, batch_size=8, eval_batch_size=16)
    config.model.update(layers=model_layers(args["model"], 2), dim=32, hidden_dim=64, num_heads=2)
    config.model.attention.primal.update(low_rank=4)
    config.optimizer.update(learning_rate=3e-3, warmup_steps=0, schedule="constant")
    config.update(total_steps=40, log_every_steps=5, eval_every_steps=20, checkpoint_every_steps=20)
  if "cosformer" in config.model.layers:  # decoding needs a fixed horizon: the window, which training sees alike
    config.model.attention.cosformer = dict(horizon=config.data.seq_len)
  return config
