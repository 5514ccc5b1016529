"""rankscope for lmms-engine: inside its trainers (``install()``, or the launcher
``python -m rankscope.integrations.lmms_engine`` in place of ``python -m
lmms_engine.launch.cli``), and on the timings its CUDA-event profiler already wrote
(``import_cuda_events``, ``rankscope import lmms-engine``). The one needs lmms-engine
installed; the other reads its files alone."""

from __future__ import annotations

from ._events import EVENTS_FOLDER, ImportedRun, import_cuda_events
from ._trainer import GAP, LmmsTimer, config_from_args, install

__all__ = [
    "EVENTS_FOLDER",
    "GAP",
    "ImportedRun",
    "LmmsTimer",
    "config_from_args",
    "import_cuda_events",
    "install",
]
