"""The sweep engine: grids of training runs planned by config hash, run once each, aggregated over seeds.

A sweep file (`experiments/sweeps/uea.py`) defines `get_sweep(arg) -> Sweep`: a list of `Run`s, each a
config with its `:arg`, overrides, a seed, a protocol and the table `Cell` it reports to. Every run's
fully resolved config is hashed (`config_hash`), so the same run listed in several tables (Table 1's
PrimalFormer is also a Table 6 cell) is trained once and reported in each.

Modules: `rows` (a table's `Cell` and its `Row` over seeds), `spec` (runs, sweeps, protocols, config hashing and
planning), `records` (a run's result record, the recorded-command mapping, the JSON records of the one-off
experiment binaries), `lock` (a sweep's lock and its claims on runs), `attempts` (a run's attempts, with those
killed unlogged), `runner` (`run_sweep`: trains the unfinished runs), `aggregate` (rows over seeds, the results.md /
results.csv tables, `stored_rows` from the records alone), `stats` (the paired difference of two rows by seed,
its t interval and verdict) and `paired` (the paired-difference tables against `Sweep.baselines`).

Layout of a sweep directory:
  runs/<hash>/               the run's workdir (config.json, metrics.jsonl, summary.json, train.log, ...)
  runs/<hash>/result.json    written atomically when the run has finished; its presence means "done". Its
                             wall_seconds sums the run's attempts (`attempts`: each one's seconds and outcome)
  runs/<hash>/attempts.json  the attempts that ended without a result (stopped, preempted, failed, and since
                             2026-11-29 "killed": one killed with its sweep, counted by the next from its run.lock
                             start to its last metrics line). Records from sweeps before commit d399517 hold only
                             the last attempt's time; before that, an attempt killed outright is not counted.
  results.md, results.csv    the aggregated tables; plots from `Sweep.plot`
  paired.csv                 the paired differences against the baseline rows (a sweep with `baselines`)
  jax_cache/                 JAX's persistent compilation cache (runs of equal shapes compile once)
  sweep.lock                 held while a sweep runs here (sweep.shardIofN.lock for a shard)
  locks/<hash>.lock          held by the sweep process working on that run, from its check to its result

Of a committed sweep directory (experiments/results/<family>/), git keeps each run's result.json (its command,
config and summary), summary.json and provenance.json; the rest of a workdir is not committed.

Two sweeps on one directory (another `--shard` spec, a second terminal) never share a run: a sweep claims a run
(locks/<hash>.lock) before it looks at its directory, and skips, with one line naming the holder, a run claimed
by another sweep or whose `run.lock` a live training process holds (`workdir_lock`); it never deletes or resets
such a run directory.

Why this survives a kill: nothing but `result.json` marks a run as done, so a killed sweep, started again,
skips every finished run and redoes only the one in progress. That run resumes from its latest checkpoint
when its config checkpoints every evaluation (`checkpoint_on_eval`), otherwise it restarts from scratch in
an emptied workdir (its best-validation state, needed for the honest protocol, was never saved).
"""
