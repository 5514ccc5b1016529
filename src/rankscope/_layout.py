"""The run directory: the one place that knows its file names (DESIGN.md, "Run directory")."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = [
    "memory_path",
    "meta_path",
    "nsys_path",
    "phase_window_name",
    "rank_name",
    "step_window_name",
    "summary_path",
    "temp_name",
    "timing_path",
    "trace_path",
    "window_key",
]

_STEP_WINDOW = re.compile(r"step-(\d{6,})-\d{6,}(?:-(.+))?")


def rank_name(rank: int) -> str:
    """`rank-00003`: zero-padded so listings sort."""
    return f"rank-{rank:05d}"


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
    return int(match.group(1)), match.group(2) or ""


def phase_window_name(phase: str, invocation: int) -> str:
    """`phase-actor_update-000003`: invocation 3 (counting from 0) of a phase."""
    return f"phase-{_safe(phase)}-{invocation:06d}"


def _safe(text: str) -> str:
    """`text` with every character a file name should not hold replaced by "_"."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def memory_path(run_dir: str | Path, window: str, rank: int) -> Path:
    """RUN_DIR/memory/<window>/rank-NNNNN.pickle: a CUDA memory snapshot (memory_viz's format)."""
    return Path(run_dir) / "memory" / window / f"{rank_name(rank)}.pickle"


def nsys_path(run_dir: str | Path, window: str, rank: int) -> Path:
    """RUN_DIR/nsys/<window>/rank-NNNNN.json: which steps a cudaProfilerStart/Stop range covered."""
    return Path(run_dir) / "nsys" / window / f"{rank_name(rank)}.json"


def meta_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / "meta" / f"{rank_name(rank)}.json"


def timing_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / "timings" / f"{rank_name(rank)}.jsonl"


def trace_path(run_dir: str | Path, window: str, rank: int, gzip: bool) -> Path:
    suffix = ".pt.trace.json.gz" if gzip else ".pt.trace.json"
    return Path(run_dir) / "traces" / window / f"{rank_name(rank)}{suffix}"


def summary_path(run_dir: str | Path, window: str, rank: int) -> Path:
    return Path(run_dir) / "traces" / window / f"{rank_name(rank)}.summary.json"


def temp_name(final: Path, tag: str) -> Path:
    """A hidden sibling of `final` for writing it: readers skip names starting with a dot."""
    return final.with_name(f".{final.name}.{tag}.tmp")
