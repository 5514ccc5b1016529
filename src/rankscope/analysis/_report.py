"""The run at a glance: one JSON-safe dict that the terminal, `--json` and the HTML report share."""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import TraceError
from .._text import format_ranks, format_steps
from ..rundir._layout import SIGNAL_TAG, window_key
from ..rundir._listing import RunDir, leftovers
from .collectives._collective_clocks import host_clock_offsets
from .collectives._collectives import collectives_of_run
from .core._clocks import clock_words
from .core._options import StragglerOptions
from .hangs._hangs import hangs_of
from .kernels._kernels import find_traces, kernel_report
from .read._matrix import STEP, PhaseMatrices, nanmedian, quiet
from .read._run import read_run_meta
from .read._timed import TimedRun, read_timed_run
from .stragglers._analyse import analyse_stragglers

__all__ = ["REPORT_VERSION", "build_report"]

REPORT_VERSION = 1
# What the pictures hold at most, whatever the run's size. Columns (heatmap) and points
# (charts): sampled steps, or the means of bins of consecutive steps beyond this many.
_MAX_COLUMNS = 120
# Heatmap rows: every rank up to this many; beyond, the flagged ranks on rows of their
# own, then groups of consecutive ranks, each row the slowest of its group at each step.
_MAX_ROWS = 64
_MAX_PHASES = 40  # phases the report shows (the step, those with a finding, the longest)
_MAX_FLAGGED = 8  # flagged ranks given their own heatmap row, or drawn bold in a chart
_FAINT_LINES = 8  # other ranks drawn as faint lines in a chart (evenly spaced by rank)
_BAND = (10, 90)  # the percentiles of all ranks a chart's band spans
_TOP_KERNELS = 15

Progress = Callable[[str, int, int], None]


def build_report(
    run_dir: str | os.PathLike[str],
    options: StragglerOptions | None = None,
    *,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Read a run directory's timings, meta, traces, heartbeats and hang files and say
    what they show.

    A run with timings but no traces (or the other way round) is reported with what it
    has; a TraceError when it has none of them. "hangs" (`find_hangs`) is there when the
    run has heartbeats or hang files. What could not be read is listed under
    "skipped", never dropped silently. A run that restarted into its directory uses the
    latest record of each step, or the options' `attempt`, and says so under "attempts".
    """
    options = StragglerOptions() if options is None else options
    meta = read_run_meta(run_dir)
    root = meta.root.resolve()
    report: dict[str, Any] = {
        "v": REPORT_VERSION,
        "run_dir": str(root),
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    skipped = list(meta.skipped)
    timings_error = None
    try:
        run = read_timed_run(meta, options, progress=_stage(progress, "timings"))
    except TraceError as exc:
        run, timings_error = None, str(exc)
    present = sorted(run.records.ranks) if run is not None else sorted(meta.meta)
    missing = meta.missing(present)
    report["ranks"] = {
        "world_size": meta.world_size
        if meta.world_size is not None
        else len(present) + len(missing),
        "present": present,
        "missing": missing,
        "hosts": {str(r): h for r, h in meta.hosts.items()},
    }
    offsets = None
    if run is not None:
        offsets = _add_timings(report, skipped, run, options)
    kernels_error = None
    try:
        report["kernels"] = _kernels(root, progress)
    except TraceError as exc:
        kernels_error = str(exc)
    else:
        if not report["kernels"]["windows"]:
            kernels_error = "; ".join(report["kernels"]["skipped"]) or "none readable"
    report["captures"] = _other_captures(root, skipped)
    # The step order the hangs need is read on the default clocks: the report's own read,
    # where it was one of every latest record on those clocks.
    plain = run if options.time == "auto" and options.attempt is None else None
    hangs = hangs_of(meta, time.time_ns(), run=plain)
    if hangs.files_listed:  # a run that had the watch on: heartbeats or hang files
        report["hangs"] = hangs.to_dict()
        said = set(skipped)
        skipped.extend(line for line in report["hangs"].pop("skipped") if line not in said)
    other = report["captures"]["nsys"] or report["captures"]["memory"] or hangs.files_read
    if timings_error is not None and kernels_error is not None and not other:
        raise TraceError(
            f"{root}: nothing to report (no timings: {timings_error}; no traces: {kernels_error})"
        )
    if "kernels" in report:
        skipped.extend(report["kernels"].pop("skipped"))
    report["collectives"] = collectives_of_run(root, skipped, offsets=offsets)  # None: no window
    skipped.extend(
        f"{path}: a temporary, not read (a write in progress, or one a killed process left: "
        "its rank removes it when it starts again)"
        for path in leftovers(root)
    )
    report["skipped"] = skipped
    return report


def _add_timings(
    report: dict[str, Any], skipped: list[str], run: TimedRun, options: StragglerOptions
) -> Any:
    """The report's parts from the timings (steps, phases, stragglers, heatmaps, ...);
    each host's clock offset, for the collectives section."""
    report["attempts"] = run.records.attempts.to_dict()
    skipped.extend(run.records.skipped)
    skipped.extend(run.meta.say_missing(sorted(run.records.ranks)))
    skipped.extend(run.apart)
    m = run.matrices
    stragglers = analyse_stragglers(run, options).report
    report["steps"] = {"sampled": m.steps, "first": m.steps[0], "last": m.steps[-1]}
    report["time"] = m.time
    report["clock"] = clock_words(dict(zip(m.phases, m.clocks, strict=True)), m.untimed)
    strag = stragglers.to_dict(table=False)
    drawn = _drawn(m, strag)
    report["phases"] = [row for p, row in enumerate(_phase_stats(m)) if p in drawn]
    report["phases_left_out"] = len(m.phases) - len(drawn)
    for finding in strag["findings"]:
        del finding["ratios"]  # per step, per finding: the heatmap shows them
    report["heatmaps"] = _heatmaps(m, strag["findings"], drawn)
    report["over_steps"] = _over_steps(m, strag["findings"], drawn)
    report["breakdown"] = _breakdown(m, drawn)
    report["stragglers"] = strag
    return host_clock_offsets(m, run.meta.hosts)


def _stage(progress: Progress | None, stage: str) -> Callable[[int, int], None] | None:
    if progress is None:
        return None
    return lambda done, total: progress(stage, done, total)


def _round(value: float) -> float | None:
    """Four significant digits, None for NaN: the HTML embeds every value."""
    if not math.isfinite(value):
        return None
    return float(f"{value:.4g}")


def _phase_stats(m: PhaseMatrices) -> list[dict[str, Any]]:
    out = []
    for phase, kind, clock, ms in zip(m.phases, m.kinds, m.clocks, m.ms, strict=True):
        cells = ms[np.isfinite(ms)]
        out.append(
            {
                "name": phase,
                "kind": kind,
                "clock": clock,
                "records": int(cells.size),
                "median_ms": _round(float(np.median(cells))) if cells.size else None,
                "p90_ms": _round(float(np.percentile(cells, 90))) if cells.size else None,
            }
        )
    return out


def _flagged(
    m: PhaseMatrices, findings: list[dict[str, Any]], phase: str | None = None
) -> list[int]:
    """Row indexes of the ranks the findings name (in `phase`, or slow in any), in their order."""
    row_of = {rank: i for i, rank in enumerate(m.ranks)}
    out: list[int] = []
    for f in findings:
        wanted = f["phase"] == phase if phase is not None else f["role"] == "slow"
        if wanted and f["rank"] in row_of and row_of[f["rank"]] not in out:
            out.append(row_of[f["rank"]])
    return out[:_MAX_FLAGGED]


def _drawn(m: PhaseMatrices, strag: dict[str, Any]) -> set[int]:
    """The phases the report shows, at most _MAX_PHASES: the step, those a finding names,
    then the rest by their median time a step, the longest first. 5,000 phase names made
    a 20 MB page; `rankscope sql` holds every phase."""
    named = {f["phase"] for f in strag["findings"]}
    named |= {u["phase"] for u in strag.get("imbalance", [])}
    named |= {p for g in strag.get("groups", []) for p in g["phases"]}
    with quiet():  # a phase no rank ran at a step
        typical = [float(np.nansum(nanmedian(ms, 0))) for ms in m.ms]
    ranked = sorted(
        range(len(m.phases)),
        key=lambda p: (m.phases[p] != STEP, m.phases[p] not in named, -typical[p], p),
    )
    return set(ranked[:_MAX_PHASES])


def _heatmaps(m: PhaseMatrices, findings: list[dict[str, Any]], drawn: set[int]) -> dict[str, Any]:
    """Per metric (step time, then each phase) a rows x columns matrix of ms, bounded by
    _MAX_ROWS and _MAX_COLUMNS: `rows` says which ranks each row holds."""
    bins = _bins(len(m.steps))
    n_r = len(m.ranks)
    groups: list[list[int]]
    if n_r <= _MAX_ROWS:
        groups = [[i] for i in range(n_r)]
        row_is = "rank"
    else:
        own = _flagged(m, findings)
        size = math.ceil(n_r / (_MAX_ROWS - len(own)))
        groups = [[i] for i in own] + [
            list(range(i, min(i + size, n_r))) for i in range(0, n_r, size)
        ]
        row_is = "slowest"
    order = [m.index(STEP)] if STEP in m.phases else []
    order += [p for p, name in enumerate(m.phases) if name != STEP and p in drawn]
    metrics = []
    for p in order:
        values = m.ms[p]
        if row_is == "slowest":
            with np.errstate(invalid="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a group with no record
                values = np.stack([np.nanmax(values[g], axis=0) for g in groups])
        if bins > 1:
            values = _bin_columns(values, bins)
        label = "step time" if m.phases[p] == STEP else f"{m.phases[p]} ({m.kinds[p]})"
        metrics.append(
            {
                "name": m.phases[p],
                "label": label,
                "unit": "ms",
                "values": _rows(values),
            }
        )
    return {
        "ranks": m.ranks,
        "rows": [[m.ranks[i] for i in g] for g in groups],
        "row_is": row_is,
        "steps": m.steps[::bins],
        "steps_per_column": bins,
        "metrics": metrics,
    }


def _bins(n_steps: int) -> int:
    """Steps per column or point, so that there are at most _MAX_COLUMNS."""
    return math.ceil(n_steps / _MAX_COLUMNS) if n_steps > _MAX_COLUMNS else 1


def _over_steps(
    m: PhaseMatrices, findings: list[dict[str, Any]], drawn: set[int]
) -> dict[str, Any]:
    """Per phase, its time over the sampled steps: the ranks the findings name in it, a
    band of the other ranks (the 10th to 90th percentile and the median), and a few of them."""
    bins = _bins(len(m.steps))
    n_r = len(m.ranks)
    phases = []
    for p, (phase, kind) in enumerate(zip(m.phases, m.kinds, strict=True)):
        if p not in drawn:
            continue
        values = _bin_columns(m.ms[p], bins) if bins > 1 else m.ms[p]
        flagged = _flagged(m, findings, phase)
        others = [i for i in range(n_r) if i not in flagged]
        if len(others) > _FAINT_LINES:
            picks = np.linspace(0, len(others) - 1, _FAINT_LINES).round().astype(int)
            others = [others[k] for k in sorted(set(picks.tolist()))]
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a step no rank sampled
            rest = np.delete(values, flagged, axis=0) if len(flagged) < n_r else values
            lo, mid, hi = np.nanpercentile(rest, [_BAND[0], 50, _BAND[1]], axis=0)
        said = [f for f in findings if f["phase"] == phase]
        phases.append(
            {
                "name": phase,
                "kind": kind,
                "band": {"lo": _line(lo), "median": _line(mid), "hi": _line(hi)},
                "lines": [{"rank": m.ranks[i], "values": _line(values[i])} for i in others],
                "flagged": [
                    {
                        "rank": m.ranks[i],
                        "role": next(f["role"] for f in said if f["rank"] == m.ranks[i]),
                        "since_step": next(
                            f["since_step"] for f in said if f["rank"] == m.ranks[i]
                        ),
                        "values": _line(values[i]),
                    }
                    for i in flagged
                ],
                "flagged_of": len({f["rank"] for f in said}),
            }
        )
    return {
        "steps": m.steps[::bins],
        "steps_per_point": bins,
        "ranks": n_r,
        "band": list(_BAND),
        "phases": phases,
    }


def _line(values: np.ndarray) -> list[float | None]:
    return [_round(v) for v in values.tolist()]


def _rows(values: np.ndarray) -> list[list[float | None]]:
    """Microsecond precision (short JSON numbers), None for NaN."""
    return [[None if math.isnan(v) else v for v in row] for row in np.round(values, 3).tolist()]


def _bin_columns(values: np.ndarray, bins: int) -> np.ndarray:
    """Mean of each run of `bins` consecutive columns (NaN ignored)."""
    n_r, n_s = values.shape
    padded = np.full((n_r, math.ceil(n_s / bins) * bins), np.nan)
    padded[:, :n_s] = values
    shaped = padded.reshape(n_r, -1, bins)
    with np.errstate(invalid="ignore"):
        count = np.sum(np.isfinite(shaped), axis=2)
        total = np.nansum(shaped, axis=2)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _breakdown(m: PhaseMatrices, drawn: set[int]) -> dict[str, Any]:
    """Per rank, the median time of each top-level phase shown over sampled steps."""
    chosen = [
        p
        for p, (name, depth) in enumerate(zip(m.phases, m.depths, strict=True))
        if name != STEP and depth == 0 and p in drawn
    ]
    columns = []
    for p in chosen:
        ms = m.ms[p]
        with np.errstate(invalid="ignore"):
            present = np.isfinite(ms).any(axis=1)
            median = np.full(len(m.ranks), np.nan)
            if present.any():
                median[present] = nanmedian(ms[present], 1)
        columns.append(median)
    rows = np.stack(columns, axis=1) if columns else np.zeros((len(m.ranks), 0))
    return {
        "ranks": m.ranks,
        "phases": [m.phases[p] for p in chosen],
        "kinds": [m.kinds[p] for p in chosen],
        "median_ms": [[_round(v) for v in row] for row in rows.tolist()],
    }


def _kernels(root: Path, progress: Progress | None) -> dict[str, Any]:
    skipped: list[str] = []  # with what looked like a trace and is not (a FIFO, a folder)
    try:
        traces = find_traces([root], left_out=skipped)
    except TraceError:
        if not skipped:
            raise
        return {"windows": [], "skipped": skipped}
    windows: dict[str, list[Path]] = {}
    for path in traces:
        windows.setdefault(path.parent.name, []).append(path)
    out: list[dict[str, Any]] = []
    done = 0
    for window, paths in sorted(windows.items()):
        try:
            found = kernel_report(paths)
        except TraceError as exc:
            skipped.append(str(exc))
            continue
        finally:
            done += len(paths)
            if progress is not None:
                progress("traces", done, len(traces))
        skipped.extend(found.skipped)
        for table in found.tables:
            summary = table.to_dict(_TOP_KERNELS)
            out.append(
                {
                    "window": window,
                    "ranks": sorted(
                        {
                            t["rank"]
                            for t in found.traces
                            if t["kind"] == table.kind and t["rank"] is not None
                        }
                    ),
                    "kind": table.kind,
                    "total_us": table.total_us,
                    "items": summary["items"],
                }
            )
    why = _why_captured(root, skipped)
    by_key = {window_key(name): reasons for name, reasons in why.items()}
    for entry in out:
        # A window cut short by stop() ends earlier than the name its asker announced.
        reasons = why.get(entry["window"]) or by_key.get(window_key(entry["window"]))
        entry["why"] = reasons or []
    return {"windows": out, "skipped": skipped}


def _why_captured(root: Path, skipped: list[str]) -> dict[str, list[str]]:
    """Per window, who asked for it outside the schedule: a rank's own slow steps
    (RUN_DIR/auto) or `rankscope trigger` (the ranks' answers in RUN_DIR/triggers)."""
    run = RunDir(root)
    why: dict[str, list[str]] = {}
    for path in (found.path for found in run.auto_records()):
        for number, line in enumerate(_lines(path, skipped), 1):
            try:
                record = json.loads(line)
                if record.get("status") != "accepted":
                    continue
                window, rank = str(record["window"]), int(record["rank"])
                slow, median = list(record["slow_steps"]), float(record["median_s"])
                worst = max(float(s) for s in record["step_s"]) / median
                measured = str(record.get("measured", "step"))
            except (ValueError, KeyError, TypeError, ZeroDivisionError):
                skipped.append(f"{path}:{number}: not an anomaly record")
                continue
            steps = format_steps(slow)
            if measured == "step":
                what = f"its steps {steps} took up to {worst:.1f}x its median step time"
            else:
                phase = measured.removeprefix("phase ")
                what = f"its phase {phase} on steps {steps} took up to {worst:.1f}x its median"
            why.setdefault(window, []).append(
                f"rank {rank} asked for it: {what} ({median * 1000:.1f} ms)"
            )
    triggered: dict[tuple[str, str], list[int]] = {}
    for found in run.trigger_answers():
        try:
            answer = json.loads(found.path.read_text(encoding="utf-8"))
            if answer.get("status") == "accepted":
                asked = (str(answer["window"]), str(found.folder))
                triggered.setdefault(asked, []).append(found.rank)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            skipped.append(f"{found.path}: not a trigger answer")
    for (window, trigger), ranks in sorted(triggered.items()):
        why.setdefault(window, []).append(
            f"rankscope trigger {trigger} asked for it ({format_ranks(ranks)})"
        )
    skipped.extend(run.left_out)  # an auto record or answer that is not a regular file
    signalled: dict[str, list[int]] = {}
    for trace in RunDir(root).traces():  # what it leaves out, _kernels has said
        key = window_key(trace.window)
        if key is not None and key[1] == SIGNAL_TAG and trace.rank is not None:
            signalled.setdefault(trace.window, []).append(trace.rank)
    for window, ranks in sorted(signalled.items()):
        why.setdefault(window, []).append(f"SIGUSR2 asked for it ({format_ranks(ranks)})")
    return why


def _other_captures(root: Path, skipped: list[str]) -> dict[str, list[dict[str, Any]]]:
    """What was captured besides torch.profiler traces: nsys capture ranges (their
    records in RUN_DIR/nsys) and CUDA memory snapshots (RUN_DIR/memory), per window."""
    run = RunDir(root)
    nsys: dict[str, dict[str, Any]] = {}
    for path in (found.path for found in run.nsys_ranges()):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            rank, first, last = int(record["rank"]), int(record["first"]), int(record["last"])
        except (OSError, ValueError, KeyError, TypeError):
            skipped.append(f"{path}: not an nsys range record")
            continue
        entry = nsys.setdefault(
            path.parent.name,
            {"window": path.parent.name, "first": first, "last": last, "ranks": []},
        )
        entry["ranks"].append(rank)
    memory: dict[str, dict[str, Any]] = {}
    for found in run.memory_snapshots():
        path, rank = found.path, found.rank
        try:
            size = path.stat().st_size
        except OSError:
            skipped.append(f"{path}: not a memory snapshot")
            continue
        entry = memory.setdefault(
            path.parent.name,
            {"window": path.parent.name, "path": str(path.parent), "ranks": [], "bytes": 0},
        )
        entry["ranks"].append(rank)
        entry["bytes"] += size
    skipped.extend(run.left_out)  # a range or snapshot that is not a regular file
    return {"nsys": list(nsys.values()), "memory": list(memory.values())}


def _lines(path: Path, skipped: list[str]) -> list[str]:
    try:
        return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        skipped.append(f"{path}: cannot read ({exc})")
        return []
