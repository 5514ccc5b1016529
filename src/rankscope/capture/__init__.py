"""Trace capture: torch.profiler windows, their schedule, and background finalisation.

Importing this package does not import torch; creating a TraceCapture does.
"""

from ._capture import TraceCapture
from ._schedule import Action, action_at, last_step, window_start, windows

__all__ = ["Action", "TraceCapture", "action_at", "last_step", "window_start", "windows"]
