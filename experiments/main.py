"""Train and evaluate one config: the binary behind every experiment.

  python -m experiments.main --config=uea --workdir=/tmp/run

Also installed as `primal-train`; `--help` says how to name a config (a packaged one by name, `--list_configs`,
or any config file by path). The work is in `primal_jax.training`.
"""

from primal_jax.cli.train import run

if __name__ == "__main__":
  run()
