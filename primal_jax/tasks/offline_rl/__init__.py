"""Offline RL with the Decision Transformer (paper Tables 4 and 7): data, rollouts and the behaviour policies.

Modules::

  config          `--config=d4rl[:arg]`
  input_pipeline  DT segments and rollout evaluation (task "d4rl")
  trajectories    episodes from D4RL HDF5 files, Minari or the embedded datasets
  datasets        the embedded D4RL-style datasets, regenerated from the behaviour policies in `policies/`
                  (package data) in the MuJoCo -v4 envs
  rollouts        batched episodes of a policy; `policy`: the SAC actor's numpy form
  behaviour, sac  training the behaviour policies (SAC; experiments/train_behaviour.py)

Its tasks and config name are registered by `primal_jax.tasks` (the one list of families).
"""
