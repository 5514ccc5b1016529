"""rankscope: safe, cheap profiling for distributed PyTorch training.

Importing rankscope does not import torch; capture imports it when a rank profiles.
Names load on first use, so `rankscope.analysis` (on a laptop, over a run directory)
never pays for the profiler's configuration and hooks.
"""

import importlib as _importlib
import typing as _typing

from ._version import __version__

if _typing.TYPE_CHECKING:
    from ._errors import ConfigError, RankscopeError, TraceError
    from ._profiler import Profiler, annotate, current
    from .config._args import add_arguments
    from .config._config import HangConfig, MemoryConfig, ProfileConfig, TimerConfig
    from .config._ranks import RankInfo, detect_rank_info
    from .config._trace import AutoTrigger, Schedule, TraceConfig

__all__ = [
    "AutoTrigger",
    "ConfigError",
    "HangConfig",
    "MemoryConfig",
    "ProfileConfig",
    "Profiler",
    "RankInfo",
    "RankscopeError",
    "Schedule",
    "TimerConfig",
    "TraceConfig",
    "TraceError",
    "__version__",
    "add_arguments",
    "annotate",
    "current",
    "detect_rank_info",
]

_WHERE = {
    "add_arguments": "config._args",
    "AutoTrigger": "config._trace",
    "HangConfig": "config._config",
    "MemoryConfig": "config._config",
    "ProfileConfig": "config._config",
    "Schedule": "config._trace",
    "TimerConfig": "config._config",
    "TraceConfig": "config._trace",
    "ConfigError": "_errors",
    "RankscopeError": "_errors",
    "TraceError": "_errors",
    "Profiler": "_profiler",
    "annotate": "_profiler",
    "current": "_profiler",
    "RankInfo": "config._ranks",
    "detect_rank_info": "config._ranks",
}


def __getattr__(name: str) -> _typing.Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
