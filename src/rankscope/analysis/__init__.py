"""Analysis of run directories and traces: stragglers, kernels, merged timelines, reports.

The flow: `read/` turns files into columns and events (the run directory is listed
through `rankscope.rundir._layout.RunDir`); each analysis takes one options object
(`_options`) and has one entry that runs read -> matrices -> findings (`_analyse` for
the stragglers; `_kernels`, `_hangs`, `_collectives`, `_hosts`, `_diff`, `_report`,
`merge/`); `render/` draws the HTML pages. `_parallel` is the one way they read files
in parallel.

Imports no torch: analysis runs anywhere. Names load on first use, so `import
rankscope.analysis` never pays for numpy. The job side never imports this package: the
trace summaries it writes come from `rankscope.traces._kineto`, which both sides share.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..traces._kineto import load_trace, scan_trace, summarize_events, summarize_trace
    from ._report import build_report
    from .collectives._collectives import CollectiveReport, find_collectives
    from .core._options import (
        CollectiveOptions,
        DiffOptions,
        HangOptions,
        HostOptions,
        KernelOptions,
        StragglerOptions,
    )
    from .diff._diff import RunDiff, diff_runs
    from .hangs._hang_model import HangFinding, HangReport
    from .hangs._hangs import find_hangs
    from .hosts._host_model import HostRecord, HostReport
    from .hosts._hosts import find_recurring_hosts
    from .kernels._kernels import KernelReport, KernelTable, find_traces, kernel_report
    from .merge import MergeResult, merge_traces
    from .read._engine import RunRecords, read_run_records
    from .read._matrix import PhaseMatrices, matrices_of, phase_matrices
    from .read._rank_timings import RankTimings
    from .read._run import RunMeta, read_run_meta
    from .read._timed import TimedRun, read_timed_run
    from .read._timings import RunTimings, read_rank_timings, read_timings
    from .render._html import render_html
    from .stragglers._analyse import StragglerAnalysis, analyse_stragglers, stragglers_in
    from .stragglers._stragglers import StragglerFinding, StragglerReport, find_stragglers

__all__ = [
    "CollectiveOptions",
    "CollectiveReport",
    "DiffOptions",
    "HangFinding",
    "HangOptions",
    "HangReport",
    "HostOptions",
    "HostRecord",
    "HostReport",
    "KernelOptions",
    "KernelReport",
    "KernelTable",
    "MergeResult",
    "PhaseMatrices",
    "RankTimings",
    "RunDiff",
    "RunMeta",
    "RunRecords",
    "RunTimings",
    "StragglerAnalysis",
    "StragglerFinding",
    "StragglerOptions",
    "StragglerReport",
    "TimedRun",
    "analyse_stragglers",
    "build_report",
    "diff_runs",
    "find_collectives",
    "find_hangs",
    "find_recurring_hosts",
    "find_stragglers",
    "find_traces",
    "kernel_report",
    "load_trace",
    "matrices_of",
    "merge_traces",
    "phase_matrices",
    "read_rank_timings",
    "read_run_meta",
    "read_run_records",
    "read_timed_run",
    "read_timings",
    "render_html",
    "scan_trace",
    "stragglers_in",
    "summarize_events",
    "summarize_trace",
]

_WHERE = {
    "StragglerOptions": "core._options",
    "HostOptions": "core._options",
    "DiffOptions": "core._options",
    "KernelOptions": "core._options",
    "CollectiveOptions": "core._options",
    "HangOptions": "core._options",
    "StragglerAnalysis": "stragglers._analyse",
    "TimedRun": "read._timed",
    "analyse_stragglers": "stragglers._analyse",
    "read_timed_run": "read._timed",
    "stragglers_in": "stragglers._analyse",
    "RunDiff": "diff._diff",
    "diff_runs": "diff._diff",
    "HostRecord": "hosts._host_model",
    "HostReport": "hosts._host_model",
    "find_recurring_hosts": "hosts._hosts",
    "CollectiveReport": "collectives._collectives",
    "find_collectives": "collectives._collectives",
    "render_html": "render._html",
    "HangFinding": "hangs._hang_model",
    "HangReport": "hangs._hang_model",
    "find_hangs": "hangs._hangs",
    "KernelReport": "kernels._kernels",
    "KernelTable": "kernels._kernels",
    "find_traces": "kernels._kernels",
    "kernel_report": "kernels._kernels",
    "load_trace": "rankscope.traces._kineto",
    "scan_trace": "rankscope.traces._kineto",
    "summarize_events": "rankscope.traces._kineto",
    "summarize_trace": "rankscope.traces._kineto",
    "PhaseMatrices": "read._matrix",
    "phase_matrices": "read._matrix",
    "matrices_of": "read._matrix",
    "RunRecords": "read._engine",
    "read_run_records": "read._engine",
    "MergeResult": "merge",
    "merge_traces": "merge",
    "build_report": "_report",
    "RunMeta": "read._run",
    "read_run_meta": "read._run",
    "StragglerFinding": "stragglers._stragglers",
    "StragglerReport": "stragglers._stragglers",
    "find_stragglers": "stragglers._stragglers",
    "RankTimings": "read._rank_timings",
    "RunTimings": "read._timings",
    "read_rank_timings": "read._timings",
    "read_timings": "read._timings",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # The trace readers live in rankscope.traces._kineto, which the job side imports too.
    path = module if module.startswith("rankscope.") else f"{__name__}.{module}"
    value = getattr(importlib.import_module(path), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
