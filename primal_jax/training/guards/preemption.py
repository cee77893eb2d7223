"""`PreemptionGuard`: SIGTERM (a scheduler's preemption notice) becomes a flag the train loop polls.

The loop then saves a checkpoint and exits cleanly; rerunning the same command resumes from it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable
from typing import Any


class PreemptionGuard:
  """Turns SIGTERM (and optionally SIGINT) into a flag the train loop polls: save, then exit cleanly.

  The handler only sets the flag, so it is safe whatever the main thread is doing; previous handlers
  are restored on exit. A second SIGINT raises KeyboardInterrupt, so Ctrl-C twice still stops a hung run.

  Multi-host: processes may see the signal at different steps, and a save is collective, so they
  must agree on the step. With `jax.distributed` initialised (its preemption service on), use
  `Checkpointer.reached_preemption(step)` (orbax, via `multihost_utils.reached_preemption_sync_point`),
  which becomes True on every process at the same step; otherwise all-reduce `requested` across
  processes before acting on it.

  Usage::

    with PreemptionGuard() as guard:
      for step in ...:
        ...
        if guard.requested:
          ckpt.save(step, state, force=True); ckpt.wait_until_finished(); break
  """

  def __init__(self, signals: Iterable[int] = (signal.SIGTERM,)):
    self._signals = tuple(signal.Signals(s) for s in signals)
    if not self._signals:
      raise ValueError("PreemptionGuard needs at least one signal, e.g. (signal.SIGTERM,)")
    self._previous: dict[signal.Signals, Any] = {}
    self._received: signal.Signals | None = None

  @property
  def requested(self) -> bool:
    """Whether one of the signals arrived since entering."""
    return self._received is not None

  @property
  def received_signal(self) -> signal.Signals | None:
    """The first signal received, or None."""
    return self._received

  def _handle(self, signum, frame) -> None:
    if signum == signal.SIGINT and self._received is not None:
      raise KeyboardInterrupt
    if self._received is None:
      self._received = signal.Signals(signum)

  def __enter__(self) -> PreemptionGuard:
    if threading.current_thread() is not threading.main_thread():
      raise RuntimeError("PreemptionGuard must be entered on the main thread (Python runs signal handlers there)")
    if self._previous:
      raise RuntimeError("PreemptionGuard is already active; it cannot be entered twice")
    self._received = None
    for sig in self._signals:
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for sig, previous in self._previous.items():
      signal.signal(sig, signal.SIG_DFL if previous is None else previous)
    self._previous.clear()
