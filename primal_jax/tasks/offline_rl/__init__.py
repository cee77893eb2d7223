"""Offline-RL support: SAC behaviour policies and D4RL-layout datasets generated in the MuJoCo -v4 envs."""
