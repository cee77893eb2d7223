import sys

from primal_jax.convert.cli import main

sys.exit(main())
