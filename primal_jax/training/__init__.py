"""Training machinery shared by every experiment and task (the binaries are in `primal_jax.cli`).

  loop             `train_and_evaluate(config, workdir)`: the entry point of every binary
  experiment       `build_experiment`, `load_state`, `evaluate`: what a config determines, for analysis too
  evaluation       test protocols, the history of evaluations, the best state, the summary
  objectives       task losses and metrics: classification, regression, next_token
  steps            the jitted train and eval steps (task loss + eta * KSVD); host-side normalisation
  state            the train state pytree and its sharded initialisation
  sharding         device mesh, logical-axis rules, global batches
  optimizers       optax optimizers and schedules from a config
  checkpointing/   a run's persistence: `Checkpointer` (orbax), format, checksums, resume, warm_start (init_from)
  guards/          one run per workdir: workdir_lock, run_config (config continuity on resume), preemption
  metrics          metrics.jsonl / TensorBoard writer, progress lines, tables

Import the submodules you need; this package imports nothing heavy by itself.
"""
