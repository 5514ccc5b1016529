"""rankscope: safe, cheap profiling for distributed PyTorch training.

Importing rankscope does not import torch; capture imports it when a rank profiles.
"""

from ._config import ProfileConfig, Schedule, TimerConfig, TraceConfig
from ._errors import ConfigError, RankscopeError, TraceError
from ._profiler import Profiler, annotate, current
from ._ranks import RankInfo, detect_rank_info
from ._version import __version__

__all__ = [
    "ConfigError",
    "ProfileConfig",
    "Profiler",
    "RankInfo",
    "RankscopeError",
    "Schedule",
    "TimerConfig",
    "TraceConfig",
    "TraceError",
    "__version__",
    "annotate",
    "current",
    "detect_rank_info",
]
