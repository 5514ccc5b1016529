"""Which of a record's two times measures a phase's work: the rule both sides read by.

A phase whose device time is at least `GPU_WORK` of its host time keeps its GPU busy
through a real part of it (its kernels, or a wait for a collective on the GPU): device
time measures it. Below that, the GPU passed the phase's two marks back to back, busy
with the step before, and the host's own work is the phase: a loader, a sampler. The
analysis applies it to a phase's medians (analysis/core/_clocks.py), the live figures to each
record (watch/_tails.py).
"""

from __future__ import annotations

__all__ = ["GPU_WORK", "on_device"]

GPU_WORK = 0.5
"""The share of its host time a phase's device time must reach to be read on device time."""


def on_device(device_ms: float, host_ms: float) -> bool:
    """The phase is read on device time."""
    return device_ms >= GPU_WORK * host_ms
