"""Summarises the per-test times tests/conftest.py records with PRIMAL_JAX_TEST_TIMES=FILE.

  PRIMAL_JAX_TEST_TIMES=/tmp/times.jsonl python -m pytest -n 2 --dist worksteal -m "not slow"
  python tools/test_times.py /tmp/times.jsonl [--top 10] [--compare OLD.jsonl]

Prints the slowest tests by CPU seconds (load-independent on a shared machine, unlike wall time), the files by
their total, and the sum of CPU seconds over 2 cores: the least wall time the fast suite can take on CI's
2-core machine (worker start-up and collection not counted). With --compare, each of the new file's slowest
tests is shown beside its CPU seconds in OLD.
"""

from __future__ import annotations

import argparse
import collections
import json
import signal


def load(path: str) -> dict[str, dict]:
  """test id -> its last record {"wall": s, "cpu": s}."""
  with open(path) as f:
    return {r["test"]: r for r in map(json.loads, filter(str.strip, f))}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("times")
  parser.add_argument("--top", type=int, default=10)
  parser.add_argument("--compare", help="an earlier times file: show each slow test's CPU seconds there")
  args = parser.parse_args(argv)
  signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # piped into head: stop quietly
  times = load(args.times)
  old = load(args.compare) if args.compare else {}
  cpu = sum(r["cpu"] for r in times.values())
  print(f"{len(times)} tests, {cpu:.0f} CPU s in all: {cpu / 2 / 60:.1f} min on 2 cores")
  if old:
    common = times.keys() & old.keys()
    before, after = sum(old[t]["cpu"] for t in common), sum(times[t]["cpu"] for t in common)
    print(f"the {len(common)} tests in both: {before:.0f} -> {after:.0f} CPU s")
  print(f"\nthe {args.top} slowest tests (CPU s{', before' if old else ''}):")
  for name, r in sorted(times.items(), key=lambda kv: -kv[1]["cpu"])[: args.top]:
    was = f"  (was {old[name]['cpu']:.1f})" if name in old else ""
    print(f"  {r['cpu']:7.1f}{was}  {name}")
  files = collections.defaultdict(lambda: [0, 0.0])
  for name, r in times.items():
    entry = files[name.split("::")[0]]
    entry[0] += 1
    entry[1] += r["cpu"]
  print(f"\nthe {args.top} costliest files (tests, CPU s):")
  for name, (n, total) in sorted(files.items(), key=lambda kv: -kv[1][1])[: args.top]:
    print(f"  {total:7.1f}  {n:4d}  {name}")


if __name__ == "__main__":
  main()
