"""UEA multivariate time-series classification (paper Table 1).

Modules::

  config          `--config=uea[:arg]`
  input_pipeline  `make_uea_pipeline` (task "uea"): standardised, padded series; stratified validation split
  tfds_dataset    the problems as a TFDS dataset in ArrayRecord files (`prepare_uea`)
  archive         the `Multivariate2018_ts` archive layout; `ts_format`: the `.ts` parser and padding
  aeon_wheel      JapaneseVowels and BasicMotions from the `aeon` wheel on PyPI, pinned by SHA-256

Its tasks and config name are registered by `primal_jax.tasks` (the one list of families).
"""
