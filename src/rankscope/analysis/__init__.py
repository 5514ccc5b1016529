"""Analysis of run directories and traces. Imports no torch."""

from ._kineto import load_trace, scan_trace, summarize_events, summarize_trace
from ._timings import RankTimings, RunTimings, read_rank_timings, read_timings

__all__ = [
    "RankTimings",
    "RunTimings",
    "load_trace",
    "read_rank_timings",
    "read_timings",
    "scan_trace",
    "summarize_events",
    "summarize_trace",
]
