"""The benchmarks' one harness: `process` (stdlib only: process memory, machine load, allocator, threads, commit;
importable where JAX is not, as by the release's side of vs_release) and `measure` (with JAX: XLA accounting,
timing, peaks, persistence, plots)."""
