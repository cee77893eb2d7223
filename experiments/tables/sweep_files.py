"""The table files a sweep writes beside its run records (results.md, results.csv, paired.csv:
`experiments.engine.aggregate.write_results`), kept in step with the records and the code as the docs tables are:
`python -m experiments.docs_tables` rewrites them and `--check` names each one out of date. A sweep writes them
only when it runs, so without this a committed file keeps the verdicts of the code that last ran in its folder (the
LRA folder's results.md gave raw 95% verdicts after the docs had moved to Holm-corrected ones).
"""

from __future__ import annotations

from experiments.engine.aggregate import results_files
from experiments.tables.common import RESULTS, ROOT
from experiments.tables.sweeps import docs_sweep

# Record folder (under experiments/results) -> the family whose sweep file wrote its tables; the file is loaded with
# the docs' argument (`experiments.tables.sweeps.DOCS_SWEEP_ARGS`), its broadest grid.
FOLDERS = {
  "d4rl/sweep": "d4rl",
  "lm/sweep": "lm",
  "lra/sweep": "lra",
  "lra_figure1": "lra",
  "uea_table1": "uea",
  "uncertainty/sweep": "uncertainty",
  "vit/sweep": "vit",
  "vit_figure1": "vit",
  "vit_figure1_calibrated": "vit",
}


def update(*, check: bool) -> list[str]:
  """Renders every folder's table files from its records (each folder before any is written) and, unless `check`,
  writes those that differ; returns their paths relative to the repository root."""
  changed = {}
  for folder, family in FOLDERS.items():
    path = RESULTS / folder
    _, texts = results_files(docs_sweep(family), path)
    for name, text in texts.items():
      if not (path / name).is_file() or (path / name).read_text() != text:
        changed[path / name] = text
  if not check:
    for file, text in changed.items():
      file.write_text(text)
  return [str(file.relative_to(ROOT)) for file in changed]
