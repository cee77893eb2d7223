r"""Turn pretrained weights into a run workdir (config.json + step-0 checkpoint) that analysis tools read.

  python -m primal_jax.convert timm deit_small_patch16_224-cd65a155.pth /tmp/deit_s --model=deit_small_patch16_224
  python -m experiments.pretrained_run --config=vit:model=deit \
    --config.data.dataset=image_folder --config.data.source=/data/imagenet --config.model.drop_path_rate=0.0 \
    --config.init_from=/tmp/deit_s --workdir=/tmp/deit_s_run
  python -m experiments.spectrum --workdir=/tmp/deit_s_run --out=/tmp/figure1_deit_s --split=test --num_examples=64

redraws Figure 1's panels for DeiT-S/16 (every softmax layer's attention matrix on 64 ImageNet val/ images;
`data.source` holds ImageNet-1k's train/ and val/ folders of 1,000 wnid sub-folders, so the data has the
checkpoint's 1,000 classes and the restore is exact). The work is `primal_jax.training.experiment.write_initial_run`.
"""

from __future__ import annotations


def main() -> None:
  from absl import app, flags, logging

  from primal_jax.cli.train import define_config_flag
  from primal_jax.training.experiment import write_initial_run

  config_flag, _ = define_config_flag("a packaged config's name or a config file, with optional ':ARGS'")
  workdir_flag = flags.DEFINE_string("workdir", None, "New run directory to write.")
  flags.mark_flags_as_required(["config", "workdir"])

  def run(argv) -> None:
    if len(argv) > 1:
      raise app.UsageError(f"unexpected positional arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    print(f"wrote {workdir_flag.value}: {write_initial_run(config_flag.value, workdir_flag.value)}")

  app.run(run)


if __name__ == "__main__":
  main()
