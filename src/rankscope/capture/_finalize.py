"""Turning an exported trace into its final files: compress, summarise, rename atomically.

Runs in a child process (see TraceFinalizer; `main` reads JOB_JSON from argv) so that
parsing and compressing never hold the training process's GIL; falls back to the
worker thread where no child can be started. Imports no torch.

It writes inside RUN_DIR only, never through a link (see `_files`): its temporaries go
in the folder of the raw export (the export's own private folder), and the finished
files are renamed from there into the window's folder, where a link or anything but a
regular file under a final name is refused, not replaced.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import stat
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..rundir._files import Folder, open_folder
from ..rundir._layout import is_temp, temp_name
from ..traces._kineto import summarize_trace

__all__ = ["RAW_NAME", "FinalizeJob", "discard", "finalize", "main"]

RAW_NAME = ".trace.json"
"""The raw export's name in its private folder (hidden: readers never list it)."""

# zlib's default level: most of level 9's ratio on trace JSON at a fraction of its time.
_COMPRESS_LEVEL = 6
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class FinalizeJob:
    """One exported window of one rank."""

    raw: str
    """The plain JSON the profiler exported (a temporary name, under run_dir)."""
    trace: str
    """The trace's final path."""
    summary: str
    """The summary's final path."""
    rank: int
    window: str
    run_dir: str
    """The run directory: nothing is written outside it, nor through a link below it."""
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
    either way, and with it a temporary folder that held it.
    """
    raw, trace, summary = Path(job.raw), Path(job.trace), Path(job.summary)
    tag = str(os.getpid())
    trace_tmp = temp_name(trace, tag).name
    summary_tmp = temp_name(summary, tag).name
    try:
        with (
            open_folder(job.run_dir, trace.parent, create=False) as out,
            open_folder(job.run_dir, raw.parent, create=False) as work,
        ):
            try:
                data = _finish(job, work, out, trace_tmp, summary_tmp)
            finally:
                for leftover in (raw.name, trace_tmp, summary_tmp):
                    with contextlib.suppress(OSError):
                        work.unlink(leftover)
    finally:
        discard(job)
    return data


def _finish(
    job: FinalizeJob, work: Folder, out: Folder, trace_tmp: str, summary_tmp: str
) -> dict[str, Any]:
    """Summarise and compress in `work`, then rename the trace and summary into `out`."""
    raw, trace, summary = Path(job.raw).name, Path(job.trace).name, Path(job.summary).name
    if not stat.S_ISREG(work.lstat(raw).st_mode):
        raise OSError(f"{work.join(raw)} is not a regular file")
    # The stdlib's json, even where msgspec is installed: a job imports no analysis engine.
    data = summarize_trace(work.path_of(raw), use_msgspec=False, window=job.window)
    data["trace"] = trace
    data["rank"] = job.rank
    if job.why is not None:
        data["captured_because"] = job.why
    for final in (trace, summary):  # both or neither: check before either is placed
        out.check_replaceable(final)
    with os.fdopen(work.create(summary_tmp), "wb") as fh:
        fh.write(json.dumps(data, indent=1).encode("utf-8"))
    if trace.endswith(".gz"):
        with (
            os.fdopen(work.read(raw), "rb") as src,
            os.fdopen(work.create(trace_tmp), "wb") as sink,
            gzip.GzipFile(trace[: -len(".gz")], "wb", _COMPRESS_LEVEL, sink) as dst,
        ):
            shutil.copyfileobj(src, dst, _CHUNK)
        work.replace(trace_tmp, trace, into=out)
    else:
        work.replace(raw, trace, into=out)
    work.replace(summary_tmp, summary, into=out)
    return data


def discard(job: FinalizeJob) -> None:
    """Remove what is left of `job`'s raw export: the file, Kineto's partial file beside it,
    and the temporary folder that holds them. Never raises; follows no link."""
    raw = Path(job.raw)
    with contextlib.suppress(OSError):
        if is_temp(raw.parent.name):
            with open_folder(job.run_dir, raw.parent.parent, create=False) as above:
                above.remove_temp(raw.parent.name)
            return
        with open_folder(job.run_dir, raw.parent, create=False) as work:
            for leftover in (raw.name, raw.name + ".tmp"):
                work.unlink(leftover)


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
