"""The binaries: the only package that imports both the families (`primal_jax.tasks`) and `primal_jax.training`.

Modules::

  train          `primal-train` (and `python -m experiments.main`): the absl training binary
  generate       `primal-generate`: sampling from an LM run's checkpoint
  config_lookup  `--config=NAME[:arg]|path.py[:arg]`: the one place that looks configs up; `list_configs`

`primal_jax.training` never imports this package.
"""
