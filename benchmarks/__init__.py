"""Speed and memory comparisons that print tables (`python -m benchmarks.efficiency`); not tests.

`benchmarks.harness` holds the measuring helpers (timing, FLOPs, memory, slopes, result files).
"""
