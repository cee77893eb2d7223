"""The absl entry point of `experiments/main.py` and the `primal-train` console script.

Flags are defined inside `run()`, not at import, so importing the library never
touches absl's global flag registry.
"""

from __future__ import annotations

import sys


def run(argv: list[str] | None = None) -> None:
  """Parse `--config=FILE[:arg]`, `--config.x=y` overrides and `--workdir`, then train."""
  from absl import app, flags, logging
  from ml_collections import config_flags

  from primal_jax.launch import host_allocator
  from primal_jax.training.loop import train_and_evaluate

  config_flag = config_flags.DEFINE_config_file(
    "config", None, "Config file (with optional ':arg'), e.g. experiments/configs/uea.py:smoke", lock_config=True
  )
  workdir_flag = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and config.json.")
  allocator_flag = flags.DEFINE_enum(
    "allocator", "system", list(host_allocator.ALLOCATORS),
    "Host malloc (CPU runs): tcmalloc or jemalloc re-executes the command with the library preloaded.",
  )  # fmt: skip
  flags.mark_flags_as_required(["config", "workdir"])
  flags.register_validator("workdir", bool, message="--workdir must name a directory (it is created if missing)")

  def main(args: list[str]) -> None:
    if len(args) > 1:
      raise app.UsageError(f"unexpected positional arguments: {args[1:]}")
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO; -v 0 brings it back
    allocator = allocator_flag.value
    if not from_command_line and allocator not in ("system", host_allocator.loaded_allocator()):
      raise app.UsageError(f"--allocator={allocator} needs a fresh process (run(argv) cannot re-execute)")
    try:
      host_allocator.ensure_allocator(allocator)  # re-executes the command unless nothing has to change
    except ValueError as err:
      raise app.UsageError(str(err)) from err
    summary = train_and_evaluate(config_flag.value, workdir_flag.value)
    if summary.get("preempted"):
      sys.exit(143)  # 128 + SIGTERM: the state was saved; rerunning resumes

  from_command_line = argv is None
  argv = list(sys.argv if argv is None else argv)
  try:  # a bad --config.x=y raises AttributeError/TypeError inside ml_collections, not a flags.Error
    remaining = flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as err:
    message = str(err).strip("'\"").replace("\\n", " ").replace("\n", " ")
    sys.stderr.write(f"FATAL Flags parsing error: {message}\nPass --helpshort or --helpfull to see help on flags.\n")
    sys.exit(2)
  app.run(main, argv=argv, flags_parser=lambda _: remaining)  # parsed once: overrides define flags


if __name__ == "__main__":  # `python -m primal_jax.training.cli`: the sweep runner's child processes
  run()
