"""Training machinery shared by every experiment: state, sharded steps, checkpoints, metrics, the loop.

Import the submodules you need (`primal_jax.training.loop.train_and_evaluate`
is the entry point); this package imports nothing heavy by itself.
"""
