"""Which start of the job this process is: its attempt.

A job that runs again into the same output_dir (a torchelastic restart, a resume from a
checkpoint, a person running the script again) writes into the files the earlier
process started. Each process start gets an attempt: a fresh token, its start time, and
what the launcher says (torchelastic's run id and restart count, or SLURM's job id and
restart count). The timer writes it as one line ahead of its records and the meta file
holds it, so the analysis can tell the attempts apart and never sum them. The timer's
line also names the host the process runs on (the meta file, rewritten at each start,
names only the latest start's); the host is no part of the attempt's identity.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from typing import Any

from ..config import _env

__all__ = ["Attempt", "current_attempt"]


@dataclass(frozen=True, slots=True)
class Attempt:
    """One process start of a job."""

    token: str
    """Fresh for each process start: two starts never share it."""
    started_ns: int
    """Wall clock (epoch ns) when this process first asked which attempt it is."""
    launcher: str | None
    """"torchelastic", "slurm", or None when no launcher said."""
    job: str | None
    """The launcher's job id (TORCHELASTIC_RUN_ID, SLURM_JOB_ID); None when unknown."""
    restart: int | None
    """The launcher's restart count (0 for the first start); None when unknown."""
    pid: int
    rendezvous: str | None = None
    """MASTER_ADDR:MASTER_PORT where the launcher set them: shared by the ranks of one
    launch, and two jobs running at once on one host cannot share it (the port is
    bound), so it tells concurrent jobs in one output_dir apart where no job id does."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.token,
            "started_ns": self.started_ns,
            "launcher": self.launcher,
            "job": self.job,
            "restart": self.restart,
            "pid": self.pid,
            "rendezvous": self.rendezvous,
        }

    def same_job(self, earlier: dict[str, Any]) -> bool:
        """Whether `earlier` (an attempt's dict from a meta file) is an earlier start of this job.

        Only a launcher's restart is: this start's restart count is above 0 and above the
        earlier one's, under the same launcher and job id (torchrun without --rdzv-id has
        none: both None). A start with restart count 0, or no launcher, is a new launch
        even when it reuses the directory.
        """
        before = earlier.get("restart")
        return (
            self.launcher is not None
            and self.restart is not None
            and self.restart > 0
            and isinstance(before, int)
            and not isinstance(before, bool)
            and before < self.restart
            and earlier.get("launcher") == self.launcher
            and earlier.get("job") == self.job
        )


_current: Attempt | None = None


def current_attempt() -> Attempt:
    """This process's attempt: made once per process (a forked child makes its own)."""
    global _current  # noqa: PLW0603 - one per process, made on first use
    attempt = _current
    if attempt is None or attempt.pid != os.getpid():
        said = _env.launcher_attempt()
        launcher, job, restart = said if said is not None else (None, None, None)
        attempt = Attempt(
            token=secrets.token_hex(6),
            started_ns=time.time_ns(),
            launcher=launcher,
            job=job,
            restart=restart,
            pid=os.getpid(),
            rendezvous=_env.rendezvous(),
        )
        _current = attempt
    return attempt
