"""Trace capture: torch.profiler windows, their schedule, and background finalisation.

One object per concern: `_capture` (TraceCapture: lifecycle, phases, faults),
`_schedule` (the pure plan of steps), `_requests` (the one door for windows asked for at
run time), `_ondemand` (who asks: triggers, SIGUSR2, slow steps), `_anomaly` (the anomaly
detector), `_profile` (making profilers), `_export` (saving windows), `_nsys`, `_memory`,
and `_trigger` (the poller that reads the trigger files and answers them; the files'
format is `rundir/_trigger`, and the client that writes them, `rankscope trigger`, is
`cli/_trigger_client`).

Importing this package does not import torch; creating a TraceCapture does.
"""

from ._capture import TraceCapture
from ._schedule import Action, action_at, last_step, window_start, windows

__all__ = ["Action", "TraceCapture", "action_at", "last_step", "window_start", "windows"]
