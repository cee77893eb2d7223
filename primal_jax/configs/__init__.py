"""The experiment configs, one module per task, named on the command line: `primal-train --config=uea:smoke`.

Each module defines `get_config(arg) -> ml_collections.ConfigDict` (big_vision style: `arg` is the text
after the colon) and opens with a docstring giving the command, the hardware, the runtime and the metric it
should reach. They live inside the package, not beside it, so that a plain `pip install` can run them from
any directory; `primal_jax.training.config_args.load_config` finds one by name (`uea`) or loads any
config file by path (`path/to/my_config.py`), and `primal-train --list_configs` lists them.

Importing this package imports none of the configs (they need `ml_collections`, from the `train` extra).
"""
