"""Run a grid of training runs and aggregate them: the binary behind `experiments/sweeps/*.py`.

  python -m experiments.sweep --sweep=experiments/sweeps/uea.py --workdir=/tmp/uea_sweep

Finished runs are skipped (a second invocation only rewrites the tables); a killed sweep, started again,
redoes only the run it was in. A run another process holds (another sweep, another shard spec) is skipped
with one line. The work is in `experiments.engine`.

  python -m experiments.sweep --sweep=experiments/sweeps/vit.py --only=fashion_mnist \
    --unclean_in=experiments/results/vit/sweep --workdir=experiments/results/vit/rerun

trains again, at the checkout's clean commit, only the runs whose finished record in the sweep directory
`--unclean_in` is legacy (no commit) or from a dirty tree, under the same run keys, into its rerun folder
(`experiments.engine.records.rerun_folder`); the tables then read the rerun's record in place of the original's,
which stays as it was.

A mistake in what the command names (a sweep file that does not parse, an override of a key the config lacks,
an unknown protocol or table, a workdir where the same shard is running) ends in one line on stderr,
`experiments.sweep: error: ...`, with exit status 2 (`--debug` shows the traceback above it).
"""

from __future__ import annotations

import sys
import time
import traceback


def run(argv: list[str] | None = None) -> None:
  from absl import app, flags, logging

  sweep_flag = flags.DEFINE_string("sweep", None, "Sweep file with optional ':arg', e.g. experiments/sweeps/uea.py")
  workdir_flag = flags.DEFINE_string("workdir", None, "Sweep directory: runs/<hash>/, results.md, results.csv.")
  mode_flag = flags.DEFINE_enum(
    "mode", "inline", ["inline", "subprocess", "aggregate"],
    "inline: every run in this process (compiled programs shared through the persistent cache); subprocess: one "
    "process per run; aggregate: run nothing, rewrite the tables from the finished runs.",
  )  # fmt: skip
  only_flag = flags.DEFINE_list("only", [], "Run only the runs of these tables (all tables are aggregated).")
  shard_flag = flags.DEFINE_string(
    "shard", "0/1", "I/N: run only the I-th of N interleaved slices of the runs (N processes share one sweep)."
  )
  echo_flag = flags.DEFINE_bool("echo", False, "Print every run's output (always in runs/<hash>/train.log).")
  debug_flag = flags.DEFINE_bool("debug", False, "Print the traceback above a one-line error.")
  unclean_flag = flags.DEFINE_string(
    "unclean_in", None,
    "A sweep directory: train only the runs whose finished record there is legacy or dirty, into --workdir, which "
    "must be its rerun folder (<family>/rerun for <family>/sweep); needs a clean checkout.",
  )  # fmt: skip
  from primal_jax.launch import host_allocator

  allocator_flag = flags.DEFINE_enum(
    "allocator", "auto", list(host_allocator.CHOICES),
    "Host allocator of the processes that train (inline: this one, re-executed with it preloaded; subprocess: "
    "each run's): auto = tcmalloc where installed (CPU steps ran 1.5-1.9x faster with it, docs/benchmarks.md).",
  )  # fmt: skip
  flags.mark_flags_as_required(["sweep", "workdir"])

  def main(args: list[str]) -> None:
    if len(args) > 1:
      raise app.UsageError(f"unexpected positional arguments: {args[1:]}")
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)
    if mode_flag.value == "inline" and argv is None:  # this process trains: give it the allocator (run(argv) can't)
      try:  # re-executes the command with the allocator preloaded unless nothing has to change
        host_allocator.ensure_allocator(allocator_flag.value)
      except ValueError as err:
        print(f"experiments.sweep: error: --allocator={allocator_flag.value}: {err}", file=sys.stderr)
        sys.exit(2)
    from primal_jax.provenance import checkout

    checkout()  # every record names the commit this process loaded, however long the sweep runs
    import jax

    from experiments.engine.runner import run_sweep
    from experiments.engine.spec import load_sweep
    from primal_jax.atomic_files import DamagedFileError
    from primal_jax.errors import ConfigError

    if mode_flag.value == "inline":  # a process setting, so set here and not by the library
      jax.config.update("jax_compilation_cache_dir", f"{workdir_flag.value}/jax_cache")
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    index, _, count = shard_flag.value.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
      raise app.UsageError(f"--shard must be I/N with 0 <= I < N, got {shard_flag.value!r}")
    start = time.monotonic()
    try:
      sweep = load_sweep(sweep_flag.value)
      report = run_sweep(
        sweep,
        workdir_flag.value,
        mode=mode_flag.value,
        only=only_flag.value or None,
        shard=(int(index), int(count)),
        echo=echo_flag.value,
        allocator=allocator_flag.value,
        unclean_in=unclean_flag.value,
      )
    except (ConfigError, DamagedFileError) as err:  # a damaged run record names its file
      if debug_flag.value:
        traceback.print_exc()
      print(f"experiments.sweep: error: {err}", file=sys.stderr)
      sys.exit(2)
    busy = f"{len(report['busy'])} in use by another process (skipped), " if report["busy"] else ""
    busy += f"{len(report['pilot'])} left to their table's pilot (skipped), " if report["pilot"] else ""
    print(
      f"{len(report['ran'])} run(s) trained, {len(report['skipped'])} already finished, {busy}"
      f"{len(report['failed'])} failed, in {time.monotonic() - start:.0f}s; tables in {workdir_flag.value}/results.md"
    )
    for key, error in report["failed"].items():
      print(f"FAILED {key}: {error}", file=sys.stderr)
    if report["preempted"]:
      sys.exit(143)
    if report["failed"]:
      sys.exit(1)

  app.run(main, argv=list(sys.argv if argv is None else argv))


if __name__ == "__main__":
  run()
