"""Causal language modelling.

Modules::

  config      `--config=lm[:arg]`
  text_bytes  byte-level windows of Wikipedia XML (`data.sources.gensim_enwiki`) or any file (task "text_bytes")
  text_words  word-level WikiText-103-style windows (task "text_words")

Its tasks and config name are registered by `primal_jax.tasks` (the one list of families).
"""
