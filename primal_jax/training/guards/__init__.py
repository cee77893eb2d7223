"""What keeps a run one run: one writer per workdir, one config across resumes, a clean stop on SIGTERM.

workdir_lock  `lock_workdir`: a second writer of a workdir is refused at once (`flock` on `run.lock`)
run_config    config continuity on resume: `config.json` kept, changes refused or recorded
preemption    `PreemptionGuard`: SIGTERM becomes a flag the loop polls (save, then exit)
"""

from primal_jax.training.guards.preemption import PreemptionGuard
from primal_jax.training.guards.run_config import check_fallback, check_resume, record_changes
from primal_jax.training.guards.workdir_lock import lock_workdir

__all__ = ["PreemptionGuard", "check_fallback", "check_resume", "lock_workdir", "record_changes"]
