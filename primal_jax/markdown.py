"""Markdown tables: the one writer behind every generated table (docs, sweep results, benchmark records, logs)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def rule(aligns: Sequence[str], widths: Sequence[int] | None = None) -> str:
  """The separator line of a table: "l" -> `---`, "r" -> `---:`; with `widths`, as wide as padded columns."""
  if any(a not in ("l", "r") for a in aligns):
    raise ValueError(f"column alignments are 'l' or 'r', got {list(aligns)}")
  if widths is None:
    return "|" + "|".join("---" if a == "l" else "---:" for a in aligns) + "|"
  return (
    "|"
    + "|".join("-" * (w + 2) if a == "l" else "-" * (w + 1) + ":" for a, w in zip(aligns, widths, strict=True))
    + "|"
  )


def fixed(x: float, digits: int = 2, sign: str = "") -> str:
  """`x` to `digits` decimals (`sign="+"`: always signed), a value that rounds to zero as 0, never -0: a fitted
  slope or a difference that is zero up to rounding comes out +-1e-17 depending on the host's BLAS, and a
  generated table must not depend on the host."""
  return f"{round(x, digits) + 0.0:{sign}.{digits}f}"


def row(cells: Iterable[object]) -> str:
  """One table line of `cells` (each shown with `str`)."""
  return "| " + " | ".join(str(cell) for cell in cells) + " |"


def table(
  header: Sequence[str],
  rows: Iterable[Sequence[object]],
  *,
  numeric_from: int = 1,
  aligns: Sequence[str] | None = None,
  pad: bool = False,
) -> str:
  """A Markdown table (no trailing newline). Columns from `numeric_from` on are right-aligned, unless `aligns`
  ("l"/"r" per column) says otherwise. `pad`: cells padded to their column's width (at least 3), so the table
  also reads as plain text."""
  aligns = list(aligns) if aligns is not None else ["l" if i < numeric_from else "r" for i in range(len(header))]
  if len(aligns) != len(header):
    raise ValueError(f"{len(aligns)} alignments for {len(header)} columns")
  body = [[str(cell) for cell in cells] for cells in rows]
  if not pad:
    return "\n".join([row(header), rule(aligns), *(row(cells) for cells in body)])
  widths = [max([len(h), 3] + [len(cells[i]) for cells in body]) for i, h in enumerate(header)]

  def padded(cells: Sequence[str]) -> str:
    return row(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(cells, widths, aligns, strict=True))

  return "\n".join([padded(list(header)), rule(aligns, widths), *(padded(cells) for cells in body)])
