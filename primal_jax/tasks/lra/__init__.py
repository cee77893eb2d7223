"""Long Range Arena (paper Table 2): ListOps, Pathfinder, Text, Retrieval and Image as token sequences.

Modules::

  config       `--config=lra:task=...,model=...`
  listops/     our ListOps generator, checker and pipeline (task "listops")
  pathfinder/  our Pathfinder generator and pipeline (task "pathfinder")
  text         byte-level IMDB (task "lra_text"); `retrieval`: byte-level AAN pairs (task "lra_retrieval")
  image        grayscale CIFAR-10 or Fashion-MNIST pixels (task "lra_image")
  catalog      byte tokens and the data_config keys the three catalog tasks share
  tokens       `token_pipeline`, which every LRA task ends in

Its tasks and config name are registered by `primal_jax.tasks` (the one list of families).
"""
