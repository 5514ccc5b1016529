"""The run directory's contract: every folder and file name, the one rule for a file's
rank, and window names with their tags (docs/run-directory.md says it for users).

Writers build their paths with the `*_path` functions; readers list a run directory
through `RunDir` (_listing.py), which finds each kind of file and says its rank by these
names. No other module spells a name of the run directory.

::

    RUN_DIR/meta/rank-00003.json
    RUN_DIR/timings/rank-00003.jsonl
    RUN_DIR/health/rank-00003.jsonl
    RUN_DIR/traces/<window>/rank-00003.pt.trace.json.gz   (.pt.trace.json without gzip)
    RUN_DIR/traces/<window>/rank-00003.summary.json
    RUN_DIR/triggers/<id>.json, RUN_DIR/triggers/<id>/rank-00003.json
    RUN_DIR/auto/rank-00003.jsonl
    RUN_DIR/nsys/<window>/rank-00003.json
    RUN_DIR/memory/<window>/rank-00003.pickle
    RUN_DIR/live/rank-00003.json
    RUN_DIR/hangs/step-012034-<attempt>/rank-00003.json
    RUN_DIR/report.html
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = [
    "ACK_SUFFIX",
    "AUTO",
    "AUTO_SUFFIX",
    "GZIP_SUFFIX",
    "HANGS",
    "HANG_SUFFIX",
    "HEALTH",
    "HEALTH_SUFFIX",
    "LIVE",
    "LIVE_SUFFIX",
    "MEMORY",
    "MEMORY_SUFFIX",
    "MERGED",
    "META",
    "META_FILES",
    "META_SUFFIX",
    "NSYS",
    "NSYS_SUFFIX",
    "RANK_PREFIX",
    "REPORT",
    "SIGNAL_TAG",
    "SLOW_STEPS_TAG",
    "SUMMARY_SUFFIX",
    "TEMP_SUFFIX",
    "TIMINGS",
    "TIMINGS_FILES",
    "TIMINGS_SUFFIX",
    "TRACES",
    "TRACE_SUFFIX",
    "TRIGGERS",
    "TRIGGER_SUFFIX",
    "ack_path",
    "auto_path",
    "flight_recorder_path",
    "hang_path",
    "health_path",
    "is_temp",
    "is_trace_name",
    "live_path",
    "memory_path",
    "meta_path",
    "nsys_path",
    "phase_window_name",
    "rank_name",
    "rank_of_file",
    "slow_phase_tag",
    "stall_name",
    "step_window_name",
    "summary_of",
    "summary_path",
    "temp_name",
    "timing_path",
    "trace_path",
    "trigger_path",
    "trigger_tag",
    "window_key",
    "window_steps",
]

# -- folders, and the suffix of each kind of file ---------------------------------------

META = "meta"
TIMINGS = "timings"
TRACES = "traces"
TRIGGERS = "triggers"
LIVE = "live"
"""RUN_DIR/live/rank-NNNNN.json: a rank's heartbeat (step, open phases), rewritten while it runs."""
HANGS = "hangs"
"""RUN_DIR/hangs/<stall>/rank-NNNNN.json: what a rank's watchdog saw when its steps stopped."""
HEALTH = "health"
"""RUN_DIR/health/rank-NNNNN.jsonl: the GPU's and the host's health at a rank's sampled steps."""
AUTO = "auto"
"""RUN_DIR/auto/rank-NNNNN.jsonl: one line per anomaly window a rank asked for, with its figures."""
NSYS = "nsys"
MEMORY = "memory"
REPORT = "report.html"
MERGED = "merged.pt.trace.json.gz"
"""The default name of `rankscope merge`'s output."""

META_SUFFIX = ".json"
TIMINGS_SUFFIX = ".jsonl"
TRACE_SUFFIX = ".pt.trace.json"
GZIP_SUFFIX = ".gz"
SUMMARY_SUFFIX = ".summary.json"
AUTO_SUFFIX = ".jsonl"
HEALTH_SUFFIX = ".jsonl"
TRIGGER_SUFFIX = ".json"
ACK_SUFFIX = ".json"
NSYS_SUFFIX = ".json"
MEMORY_SUFFIX = ".pickle"
LIVE_SUFFIX = ".json"
HANG_SUFFIX = ".json"

META_FILES = f"{META}/rank-*{META_SUFFIX}"
"""How the meta files are named, for messages."""
TIMINGS_FILES = f"{TIMINGS}/rank-*{TIMINGS_SUFFIX}"
"""How the timing files are named, for messages."""

# -- window names and their tags ---------------------------------------------------------

SIGNAL_TAG = "sigusr2"
"""The tag of a window SIGUSR2 asked for: `step-000120-000121-sigusr2`."""
SLOW_STEPS_TAG = "slow-steps"
"""The tag of a window a rank's own slow steps asked for (trace.auto)."""

_STEP_WINDOW = re.compile(r"step-(\d{6,})-(\d{6,})(?:-(.+))?")


def trigger_tag(trigger_id: str) -> str:
    """The tag of a window `rankscope trigger` asked for: `trigger-<id>`."""
    return f"trigger-{trigger_id}"


def slow_phase_tag(phase: str) -> str:
    """The tag of a window a slow phase asked for (trace.auto.phase): `slow-<phase>`."""
    return f"slow-{phase}"


def step_window_name(first: int, last: int, why: str | None = None) -> str:
    """`step-000120-000121`: a window over global steps first..last.

    A window the schedule did not plan says who asked for it: `step-000120-000121-sigusr2`,
    `-slow-steps`, `-slow-forward` (a phase that turned slow), `-trigger-<id>`.
    """
    name = f"step-{first:06d}-{last:06d}"
    return name if why is None else f"{name}-{_safe(why)}"


def window_key(name: str) -> tuple[int, str] | None:
    """(first step, who asked: "" for the schedule) of a step window's name; None for another
    name. A window that stop() cut short is named with the step it ended at, not the one
    announced for it; the key matches the two."""
    match = _STEP_WINDOW.fullmatch(name)
    if match is None:
        return None
    return int(match.group(1)), match.group(3) or ""


def window_steps(name: str) -> tuple[int, int] | None:
    """(first, last) step a step window's name says it holds; None for another name."""
    match = _STEP_WINDOW.fullmatch(name)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


def phase_window_name(phase: str, invocation: int) -> str:
    """`phase-actor_update-000003`: invocation 3 (counting from 0) of a phase."""
    return f"phase-{_safe(phase)}-{invocation:06d}"


def _safe(text: str) -> str:
    """`text` with every character a file name should not hold replaced by "_"."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


# -- a file's rank -----------------------------------------------------------------------

_RANK_FILE = re.compile(r"rank-(\d+)(\..+)")
# Other tools' names: rank3_trace.json, trace-rank_12.json.gz, worker.RANK-7.json.
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d+)(?![0-9])", re.IGNORECASE)


RANK_PREFIX = "rank-"
"""What every rank's file name starts with."""


def rank_name(rank: int) -> str:
    """`rank-00003`: zero-padded so listings sort."""
    return f"{RANK_PREFIX}{rank:05d}"


def rank_of_file(name: str, suffix: str | None = None) -> int | None:
    """The rank a file's name gives; None when it gives none.

    With `suffix` the name must be one rankscope writes, `rank-<digits><suffix>`.
    Without, a name from elsewhere is read too: the digits after the last "rank",
    "rank-" or "rank_" that starts a word (`rank3_trace.json` is rank 3).
    """
    named = _RANK_FILE.fullmatch(name)
    if suffix is not None:
        return int(named.group(1)) if named is not None and named.group(2) == suffix else None
    if named is not None:
        return int(named.group(1))
    found = _RANK_IN_NAME.findall(name)
    return int(found[-1]) if found else None


def is_temp(name: str) -> bool:
    """A file still being written (hidden: see `temp_name`), which readers leave alone."""
    return name.startswith(".")


TEMP_SUFFIX = ".tmp"
"""What a hidden file being written ends with (`temp_name`)."""


def temp_name(final: Path, tag: str) -> Path:
    """A hidden sibling of `final` for writing it: readers skip names starting with a dot."""
    return final.with_name(f".{final.name}.{tag}{TEMP_SUFFIX}")


def is_trace_name(name: str) -> bool:
    """A name a Kineto trace may have (`*.json`, `*.json.gz`), not a summary, not being written."""
    if is_temp(name) or name.endswith(SUMMARY_SUFFIX):
        return False
    return name.endswith((".json", ".json" + GZIP_SUFFIX))


def summary_of(trace: Path) -> Path | None:
    """The capture's summary beside a trace it wrote; None for another trace's name."""
    for suffix in (TRACE_SUFFIX + GZIP_SUFFIX, TRACE_SUFFIX):
        rank = rank_of_file(trace.name, suffix)
        if rank is not None:
            return trace.with_name(f"{rank_name(rank)}{SUMMARY_SUFFIX}")
    return None


# -- paths the writers write -------------------------------------------------------------


def meta_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / META / f"{rank_name(rank)}{META_SUFFIX}"


def timing_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / TIMINGS / f"{rank_name(rank)}{TIMINGS_SUFFIX}"


def health_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / HEALTH / f"{rank_name(rank)}{HEALTH_SUFFIX}"


def trace_path(run_dir: str | os.PathLike[str], window: str, rank: int, gzip: bool) -> Path:
    suffix = TRACE_SUFFIX + GZIP_SUFFIX if gzip else TRACE_SUFFIX
    return Path(run_dir) / TRACES / window / f"{rank_name(rank)}{suffix}"


def summary_path(run_dir: str | os.PathLike[str], window: str, rank: int) -> Path:
    return Path(run_dir) / TRACES / window / f"{rank_name(rank)}{SUMMARY_SUFFIX}"


def auto_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """RUN_DIR/auto/rank-NNNNN.jsonl: why a rank asked for windows itself."""
    return Path(run_dir) / AUTO / f"{rank_name(rank)}{AUTO_SUFFIX}"


def trigger_path(run_dir: str | os.PathLike[str], trigger_id: str) -> Path:
    """RUN_DIR/triggers/<id>.json: what `rankscope trigger` asks for."""
    return Path(run_dir) / TRIGGERS / f"{trigger_id}{TRIGGER_SUFFIX}"


def ack_path(run_dir: str | os.PathLike[str], trigger_id: str, rank: int) -> Path:
    """RUN_DIR/triggers/<id>/rank-NNNNN.json: a rank's answer to a trigger."""
    return Path(run_dir) / TRIGGERS / trigger_id / f"{rank_name(rank)}{ACK_SUFFIX}"


def nsys_path(run_dir: str | os.PathLike[str], window: str, rank: int) -> Path:
    """RUN_DIR/nsys/<window>/rank-NNNNN.json: which steps a cudaProfilerStart/Stop range covered."""
    return Path(run_dir) / NSYS / window / f"{rank_name(rank)}{NSYS_SUFFIX}"


def live_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """RUN_DIR/live/rank-NNNNN.json: the rank's heartbeat."""
    return Path(run_dir) / LIVE / f"{rank_name(rank)}{LIVE_SUFFIX}"


def stall_name(step: int, attempt: str | None = None) -> str:
    """The folder of a stall's hang files: the step the rank was in and its attempt's
    token, `step-012034-4f0c2a9e1b7d` (a restart that stalls at that step again keeps the
    earlier attempt's files)."""
    return f"step-{step:06d}" if attempt is None else f"step-{step:06d}-{attempt}"


def hang_path(
    run_dir: str | os.PathLike[str], step: int, rank: int, attempt: str | None = None
) -> Path:
    """RUN_DIR/hangs/step-NNNNNN-<attempt>/rank-NNNNN.json: what the rank's watchdog saw."""
    return Path(run_dir) / HANGS / stall_name(step, attempt) / f"{rank_name(rank)}{HANG_SUFFIX}"


def flight_recorder_path(
    run_dir: str | os.PathLike[str], step: int, rank: int, attempt: str | None = None
) -> Path:
    """Beside a hang file: torch's Flight Recorder dump (any backend), as torch pickled it."""
    folder = Path(run_dir) / HANGS / stall_name(step, attempt)
    return folder / f"{rank_name(rank)}.flight-recorder.pickle"


def memory_path(run_dir: str | os.PathLike[str], window: str, rank: int) -> Path:
    """RUN_DIR/memory/<window>/rank-NNNNN.pickle: a CUDA memory snapshot (memory_viz's format)."""
    return Path(run_dir) / MEMORY / window / f"{rank_name(rank)}{MEMORY_SUFFIX}"
