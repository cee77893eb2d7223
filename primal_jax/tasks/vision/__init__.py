"""Image classification with ViTs (paper Table 5): DeiT vs Primal.+DeiT, and a Fashion-MNIST `short` variant.

Modules::

  config          `--config=vit[:arg]`
  input_pipeline  `make_image_pipeline` (task "images"): Fashion-MNIST, the TFDS catalog, image folders, ImageNet-100
  augment         DeiT's training augmentation; `rand_augment`: RandAugment; `label_mixing`: Mixup / CutMix

Its tasks and config name are registered by `primal_jax.tasks` (the one list of families).
"""
