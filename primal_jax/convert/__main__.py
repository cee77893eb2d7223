import sys

from primal_jax.convert.cli import main

if __name__ == "__main__":  # importing it (Sphinx's autosummary imports every module) must not run the CLI
  sys.exit(main())
