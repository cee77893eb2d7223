"""Speed and memory comparisons that print tables (`python -m benchmarks.efficiency`); not tests.

`benchmarks.harness` holds the measuring helpers (`process`: memory, load, allocator, stdlib only; `measure`: timing,
FLOPs, XLA memory, peaks, result files, plots); the tables of their results are `experiments.tables`.
"""
