"""Analysis of run directories and traces. Imports no torch."""

from ._kineto import load_trace, scan_trace, summarize_events, summarize_trace

__all__ = ["load_trace", "scan_trace", "summarize_events", "summarize_trace"]
