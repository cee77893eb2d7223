r"""Generate text from a trained byte-level language model: `primal-generate`, run from a checkout.

  python -m experiments.generate --workdir=/tmp/lm_primalformer --prompt="Anarchism is" \
    --prompt="The " --max_new_tokens=200 --temperature=0.8 --top_p=0.95 --seed=0

The work is in `primal_jax.cli.generate` (flags: `--help`).
"""

from primal_jax.cli.generate import generate_from_run, main

__all__ = ["generate_from_run", "main"]

if __name__ == "__main__":
  main()
