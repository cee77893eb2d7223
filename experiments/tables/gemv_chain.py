"""The record of benchmarks/gemv_chain.py (`gemv_chain.json`) as Markdown; also the docs table `gemv_chain:<dir>`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from experiments.tables.common import BENCHMARK_RESULTS
from experiments.tables.efficiency import load_results
from primal_jax import markdown


def _cores(configuration: Mapping) -> str:
  devices = configuration["host_devices"]
  return f"{configuration['cores']} core{'s' * (configuration['cores'] > 1)}" + (
    f", {devices} host devices" if devices > 1 else ""
  )


def record_markdown(results: Mapping) -> str:
  """One row per (formulation, cores): ms per chain, the bound at that many cores, the fraction and the threads."""
  configurations = results["configurations"]
  if not configurations:
    raise ValueError("the record has no configurations")
  first = configurations[0]
  body = []
  for configuration in configurations:
    for row in configuration["rows"]:
      body.append([
        f"`{row['formulation']}`", _cores(configuration), f"{row.get('bytes', first['bytes']) / 2**20:.2f}",
        f"{row['ms_per_chain']:.3f}", f"{row['bound_ms']:.3f}",
        f"{100 * row['bound_fraction']:.0f}%", f"{row['cpu_per_wall']:.2f}",
      ])  # fmt: skip
  header = ["formulation", "cores", "MiB read", "ms per chain (step: per token)", "read bound ms", "fraction of bound"]
  header.append("CPU s / wall s")
  rates = "; ".join(
    f"{_cores(c)}: {c['read_bandwidth']['best'] / 1e9:.1f} GB/s" for c in configurations if c["host_devices"] == 1
  )
  meta = results["meta"]
  parts = []
  for c in configurations:
    if c.get("sizes"):
      size_body = [
        [f"{r['width']:,}", f"{r['mib_each']:.2f}", r["products"], f"{r['us_per_product']:.1f}",
         f"{r['bytes_per_s'] / 1e9:.1f}", f"{r['cpu_per_wall']:.2f}"]
        for r in c["sizes"]
      ]  # fmt: skip
      parts.append(
        f"Square [K, K] products alone, chained over distinct weights of about the same bytes, {_cores(c)}:\n\n"
        + markdown.table(["K", "MiB each", "products", "us per product", "GB/s", "CPU s / wall s"], size_body)
      )
  return "\n\n".join([
    f"The decode step's {first['products']} weight products ({first['bytes'] / 2**20:.2f} MiB), chained, "
    "batch 1, and the whole decode step (`step`: ms per token, its weights and state); each bound is a row's bytes "
    f"at the best read-only stream over a buffer of that size on the same cores ({rates}).",
    markdown.table(header, body, aligns=["l", "l", "r", "r", "r", "r", "r"]),
    *parts,
    f"Commit {(meta.get('git_commit') or '?')[:12]}, {meta['date']}; `{meta['command']}`.",
  ])  # fmt: skip


def docs_table(name: str, base: Path) -> str:
  """The docs table `gemv_chain:<dir>`: the table of benchmarks/results/<dir>/gemv_chain.json."""
  del base
  return record_markdown(load_results(BENCHMARK_RESULTS / name / "gemv_chain.json"))
