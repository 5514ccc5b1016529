"""The sampled phase timer: host and device time per phase, one JSONL file per rank.

Importing this package does not import torch; creating a PhaseTimer does.
"""

from ._clock import CudaEventClock, DeviceClock
from ._record import RECORD_VERSION
from ._sampling import is_sampled, sampled_steps
from ._timer import PhaseTimer

__all__ = [
    "RECORD_VERSION",
    "CudaEventClock",
    "DeviceClock",
    "PhaseTimer",
    "is_sampled",
    "sampled_steps",
]
