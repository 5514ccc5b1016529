"""Turning an exported trace into its final files: compress, summarise, rename atomically.

Runs in a child process (see TraceFinalizer; `main` reads JOB_JSON from argv) so that
parsing and compressing never hold the training process's GIL; falls back to the
worker thread where no child can be started. Imports no torch.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .._layout import temp_name
from ..analysis import summarize_trace

__all__ = ["FinalizeJob", "finalize", "main"]

# zlib's default level: most of level 9's ratio on trace JSON at a fraction of its time.
_COMPRESS_LEVEL = 6
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class FinalizeJob:
    """One exported window of one rank."""

    raw: str
    """The plain JSON the profiler exported (a temporary name)."""
    trace: str
    """The trace's final path."""
    summary: str
    """The summary's final path."""
    rank: int
    window: str
    why: dict[str, Any] | None = None
    """Who asked for the window outside the schedule, with their figures (the summary's
    "captured_because"); None for a scheduled window."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> FinalizeJob:
        return cls(**json.loads(text))


def finalize(job: FinalizeJob) -> dict[str, Any]:
    """Write the trace and its summary under their final names, or nothing at all.

    The raw export is parsed first: a truncated export (the profiler does not report
    a full disk) fails here, before any final name exists. The raw file is removed
    either way.
    """
    raw, trace, summary = Path(job.raw), Path(job.trace), Path(job.summary)
    tag = str(os.getpid())
    trace_tmp = temp_name(trace, tag)
    summary_tmp = temp_name(summary, tag)
    try:
        data = summarize_trace(raw, window=job.window)
        data["trace"] = trace.name
        data["rank"] = job.rank
        if job.why is not None:
            data["captured_because"] = job.why
        summary_tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
        if trace.name.endswith(".gz"):
            with open(raw, "rb") as src, gzip.open(trace_tmp, "wb", _COMPRESS_LEVEL) as dst:
                shutil.copyfileobj(src, dst, _CHUNK)
            os.replace(trace_tmp, trace)
        else:
            os.replace(raw, trace)
        os.replace(summary_tmp, summary)
        return data
    finally:
        for leftover in (raw, trace_tmp, summary_tmp):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        finalize(FinalizeJob.from_json(args[0]))
    except Exception as exc:  # the parent turns this line into its one warning
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
