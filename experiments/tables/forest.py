"""Forest plots of a table's paired differences, as text the docs can hold and `docs_tables --check` can compare.

`forest:<family>:<table>[@every_seed][:<label>]` draws the comparisons of `paired:<same>` on one axis:
per row, the Holm-corrected interval as `=`, the raw 95% interval over it as `-`, the mean as `o`, and zero as a
`|` line through every row, so a reader sees at a glance which intervals leave zero. Text, not an image: it is
deterministic, diffs in review and needs no plotting library where the docs are checked.
"""

from __future__ import annotations

from experiments.engine.paired import comparisons
from experiments.tables.paired_docs import docs_rows, paired_target
from experiments.tables.text_plot import forest_table


def forest_sweep(arg: str, base) -> str:
  """`forest:<family>:<table>[@every_seed][:<label>]`: the forest plot of the docs table `paired:<same>`."""
  folder, sweep, table = paired_target(arg)
  found = comparisons(sweep, docs_rows(folder, sweep, table), table)
  if not found:
    raise ValueError(f"forest:{arg}: no finished row of table {table!r} in {folder / 'runs'}")
  _, reference = sweep.baselines[table]
  return forest_table(found, sweep.digits, reference)
