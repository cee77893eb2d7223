"""Whether a run converged, read from its validation curve (summary `validation_curve`, [[step, value], ...]).

Issue 55: a run whose best validation evaluation is its last compares learning speed, not trained models. The
stated criterion: a run has *plateaued* when the best validation value in the last quarter of its schedule (the
evaluations after 3/4 of the last evaluated step) beats the best value before it by less than `margin` (0.002:
0.2 points of accuracy). Its best evaluation can still be its last (a flat curve), which is why the best step alone
is no criterion. Pure functions: the tables call them, tests feed them hand-made curves.
"""

from __future__ import annotations

from collections.abc import Sequence

MARGIN = 0.002  # 0.2 points of accuracy
TAIL = 0.25  # the last quarter of the schedule


def convergence(curve: Sequence[Sequence[float]], higher_is_better: bool = True, margin: float = MARGIN) -> dict:
  """{"best_step", "last_step", "tail_gain", "plateaued"} of one validation curve.

  best_step: the step of the best value, the latest on ties (the checkpointer's rule). tail_gain: the best value
  after 3/4 of the last step minus the best value up to it, signed so that positive is an improvement (the curve
  still rising); plateaued: tail_gain < margin. Refuses (ValueError, one line) a curve with fewer than two
  evaluations before the last quarter and one in it, rather than call a one-point curve converged.
  """
  points = sorted((int(step), float(value)) for step, value in curve)
  if not points:
    raise ValueError("curve: no evaluations; a run records its validation_curve from 2026-12-06 on")
  sign = 1.0 if higher_is_better else -1.0
  last = points[-1][0]
  cut = (1.0 - TAIL) * last
  head = [v for s, v in points if s <= cut]
  tail = [v for s, v in points if s > cut]
  if len(head) < 2 or not tail:
    raise ValueError(
      f"curve: {len(head)} evaluations up to step {cut:g} and {len(tail)} after; need >= 2 and >= 1 to judge a plateau"
    )
  best = max(sign * v for _, v in points)
  best_step = max(s for s, v in points if sign * v == best)
  gain = max(sign * v for v in tail) - max(sign * v for v in head)
  return {"best_step": best_step, "last_step": last, "tail_gain": gain, "plateaued": gain < margin}


def describe(results: Sequence[dict], scale: float = 100.0) -> str:
  """A table cell for several runs' `convergence` results: '2 of 3 plateaued; best at 9,000-12,000 of 12,000; last
  quarter +0.1 to +0.4' (gains times `scale`, points of accuracy by default); '-' for no runs."""
  if not results:
    return "-"
  done = sum(r["plateaued"] for r in results)
  steps = sorted(r["best_step"] for r in results)
  lasts = sorted({r["last_step"] for r in results})
  gains = sorted(r["tail_gain"] * scale for r in results)
  where = f"{steps[0]:,}" if steps[0] == steps[-1] else f"{steps[0]:,}-{steps[-1]:,}"
  of = "/".join(f"{s:,}" for s in lasts)
  span = f"{gains[0]:+.1f}" if len(gains) == 1 else f"{gains[0]:+.1f} to {gains[-1]:+.1f}"
  return f"{done} of {len(results)} plateaued; best at {where} of {of}; last quarter {span}"
