r"""Uncertainty benchmark (issue 56): KEP-SVGP in the last ViT block against softmax ViTs and Primal.+ViT.

  python -m experiments.main --config=uncertainty:model=kep_paper --workdir=/tmp/unc_kep
  python -m experiments.sweep --sweep=experiments/sweeps/uncertainty.py --workdir=/tmp/unc_sweep

Arguments (`:model=...,smoke,cifar10`):
  model: softmax (every block softmax; its MSP, temperature scaling, MC dropout and deep-ensemble members are all
    this model) | primal_plus (the last block the release's CV Primal layer, eta 0.05) | kep_paper | kep_release
    (the last block KEP-SVGP, `form="paper"` or `"release"`, trained with `task="kep_svgp"`).
  smoke: a seconds-long run (tests, CI's wheel stage). cifar10: the KEP-SVGP paper's CIFAR-10 setting (below).

Default (Fashion-MNIST, embedded, a REDUCED size chosen so the whole sweep of experiments/sweeps/uncertainty.py
trains and is evaluated in about an hour on a 2-core machine shared with other jobs): 28 x 28 grayscale, patches 4 x
4 (49 tokens + cls), a 3-block ViT of width 32 (4 heads, MLP 64), dropout 0.1 after attention and MLP (what MC
dropout samples; no drop path, no attention dropout), s = 8 and rank_multi 10 for Primal and KEP-SVGP (n = 50: every
token), batch 64, AdamW lr 1e-3 (weight decay 0.05, cosine to 1e-5 after 100 warm-up steps), `STEPS` steps; the 10%
tail of train is the validation split (temperature scaling is fitted on it), evaluated once at the end (the
checkpoint the uncertainty evaluation reads), the test split once on that state. KEP-SVGP: `kl.scale="dataset"` (the
per-example ELBO's 1/N; the authors' unscaled KL dominates a small model's loss), kl.eta 1, ksvd.eta 1 with the
authors' KSVD term (`release_kep`).

`cifar10` (the KEP-SVGP paper's CIFAR-10 setting, `CIFAR/run/vit_cifar10.sh` and `CIFAR/utils/option.py` of the
authors' code, commit 791e02b): CIFAR-10 through TFDS (`data.dataset="cifar10"`, prepared once as ArrayRecord, see
`primal_jax.data.sources.tfds_catalog`), 7 blocks of width 384, 12 heads, MLP 384, 4 x 4 patches (64 tokens; the
authors' ViT has no cls token, ours pools the cls token: a difference), dropout 0.1, KEP-SVGP with s = 10,
rank_multi 10 in the last block, e + r ("sum"), eta_ksvd 1, eta_kl 1 with the KL unscaled (the authors'), batch 128,
lr 1e-3 with 5 warm-up epochs then cosine to 1e-5 over 300 epochs, weight decay 5e-5 (Adam's L2 there, AdamW's
decoupled decay here), horizontal flips (the authors' pad-4 random crop is not implemented here), 10% of train
held out for validation.
"""

from __future__ import annotations

import math

import ml_collections

from primal_jax.tasks.common import base_config, optimizer, parse_config_arg, run_controls

MODELS = ("softmax", "primal_plus", "kep_paper", "kep_release")
STEPS = 400  # the reduced default's training steps (batch 64: 0.47 epochs of 54,000 images)
CIFAR10_TRAIN = 45_000  # 50,000 less the 10% validation tail


def _layers(model: str, depth: int) -> tuple[str, ...]:
  last = {"softmax": "softmax", "primal_plus": "primal", "kep_paper": "kep_svgp", "kep_release": "kep_svgp"}[model]
  return ("softmax",) * (depth - 1) + (last,)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = parse_config_arg(arg, {"model": "softmax", "smoke": False, "cifar10": False})
  model = args["model"]
  if model not in MODELS:
    raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
  config = base_config()
  config.data = dict(
    task="images",
    dataset="fashion_mnist",
    source="",
    image_size=28,
    crop_pct=1.0,
    channels=1,
    mean=(0.5,),
    std=(0.5,),
    val_fraction=0.1,
    augment=dict(random_resized_crop=False, flip_prob=0.0, rand_augment=False, erase_prob=0.0),
    batch_size=64,
    eval_batch_size=500,
    seed=0,
  )
  depth, dim, heads, hidden, low_rank = 3, 32, 4, 64, 8
  if args["cifar10"]:
    depth, dim, heads, hidden, low_rank = 7, 384, 12, 384, 10
  config.model = dict(
    name="vit",
    layers=_layers(model, depth),
    attention=dict(
      primal=dict(low_rank=low_rank, rank_multi=10, data_dependent=True, init_style="torch"),
      kep_svgp=dict(low_rank=low_rank, rank_multi=10, form="release" if model == "kep_release" else "paper"),
    ),
    patch_size=4,
    dim=dim,
    num_heads=heads,
    hidden_dim=hidden,
    dropout_rate=0.1,
    attention_dropout_rate=0.0,
    drop_path_rate=0.0,
    dtype="float32",
    param_dtype="float32",
  )
  kep = model.startswith("kep")
  config.ksvd = dict(
    eta=0.05 if model == "primal_plus" else 1.0 if kep else 0.0, spec="release_kep" if kep else "release_lra"
  )
  if kep:
    config.task = "kep_svgp"
    config.kl = dict(eta=1.0, scale="dataset")
  config.optimizer = optimizer(
    "adamw", 1e-3, warmup_steps=100, schedule="cosine", end_lr_factor=1e-5 / 1e-3, weight_decay=0.05
  )
  run_controls(
    config,
    num_epochs=0,
    total_steps=STEPS,
    log_every_steps=100,
    eval_every_steps=STEPS,
    checkpoint_every_steps=STEPS,
    best_metric="validation/accuracy",
    test_eval="best_validation",
    checkpoint_on_eval=True,
  )
  if args["cifar10"]:
    config.data.update(dataset="cifar10", image_size=32, channels=3, batch_size=128, eval_batch_size=512)
    config.data.update(mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616))
    config.data.augment.flip_prob = 0.5
    if kep:
      config.kl.scale = "none"  # the authors' unscaled KL
    steps_per_epoch = math.ceil(CIFAR10_TRAIN / config.data.batch_size)
    config.optimizer.update(warmup_steps=5 * steps_per_epoch, weight_decay=5e-5)
    config.update(num_epochs=300, total_steps=0, eval_every_steps=0, checkpoint_every_steps=steps_per_epoch)
  if args["smoke"]:
    config.model.update(dim=16, num_heads=2, hidden_dim=32)
    config.model.attention.primal.low_rank = 4
    config.model.attention.kep_svgp.low_rank = 4
    config.data.update(batch_size=8, eval_batch_size=512)  # divisible by 8 devices (the tests' fake CPUs)
    config.optimizer.update(warmup_steps=0, schedule="constant")
    config.update(num_epochs=0, total_steps=4, log_every_steps=2, eval_every_steps=4, checkpoint_every_steps=4)
  return config
