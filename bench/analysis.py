"""Analysis speed and memory, side by side in one run.

1. Kernel summary: `rankscope kernels` against HolisticTraceAnalysis 0.5.0
   (`TraceAnalysis(trace_dir=...)` + `get_gpu_kernel_breakdown()`, in its own virtual
   environment under bench/.results) and against the floor (decompress and json-decode
   each file, nothing else), on the real traces in ../shared/data/traces and on
   generated traces of 50 MB and 500 MB. Goals: >= 10x faster than HTA, <= 0.5x its
   peak RSS, within 2x of the floor.
2. Stragglers (issue 18): `rankscope stragglers RUN --json` end to end (a new
   interpreter) against DuckDB's bare aggregation (read_json of rank, step, phase and
   cpu_ms, each (step, phase)'s median joined back to every record, fetched to numpy, on
   every core) and against today's pure-Python reader (`phase_matrices(read_timings(run))`
   + find_stragglers), on generated timings of 1024 and 4096 ranks x 200 sampled steps x
   6 records (5 phases and the step record); with --long also 4096 x 2000 (about 7.5 GB
   of JSONL, generated once if the disk has room; no pure-Python reader there). Goals: at
   4096 x 200 within 1.5x DuckDB's time (3 s on the issue's machine) in <= 600 MB RSS;
   4096 x 2000 completes within 4 GB; 1024 x 200 no slower than today. The three take
   turns, best of 3 each (the machine is shared); the load average is printed alongside.
   Beside them, the same DuckDB aggregation reading the 8 fields the rules and the
   record checks need, unchecked: the floor of any DuckDB reader that keeps the promises.
3. Merge of 8 rank traces of 20 MB (bench/_merge_bench.py). Goal: >= 50 MB/s, bounded memory.

Each measurement runs in a fresh process that reports its wall time and peak RSS
(its own peak plus its largest child's, for tools that fork workers).

    python bench/analysis.py [--quick] [--no-hta] [--long] [--sizes MB...]
        [--only kernels stragglers merge]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / ".results"
SHARED_TRACES = ROOT.parent / "shared" / "data" / "traces"
HTA_VENV = RESULTS / "hta-venv"
HTA_VERSION = "0.5.0"
# HTA 0.5.0 predates pandas 3, whose stricter assignment breaks its parser on traces of
# more than 32767 events ("Invalid value ... for dtype 'int16'").
SECTIONS = ["kernels", "stragglers", "merge"]
HTA_PACKAGES = [f"HolisticTraceAnalysis=={HTA_VERSION}", "pandas<3"]

# Runs `BODY` (which sets `result`), then prints wall time and peak RSS as JSON.
_HARNESS = """
import json, resource, sys, time
t0 = time.perf_counter()
{body}
wall = time.perf_counter() - t0
me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({{"wall": wall, "rss_mb": (me + kids) / 1024, "result": result}}))
"""

_FLOOR = """
import gzip, json, pathlib
result = 0
for path in sorted(pathlib.Path({dir!r}).glob("*.json*")):
    data = path.read_bytes()
    if data[:2] == b"\\x1f\\x8b":
        data = gzip.decompress(data)
    result += len(json.loads(data)["traceEvents"])
"""

# What a typed decode of the whole file costs: fast, but it holds the file in memory.
_FLOOR_TYPED = """
import gzip, pathlib
from typing import Any
import msgspec
class Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    dur: Any = None
    ts: Any = None
    pid: Any = None
    tid: Any = None
class Trace(msgspec.Struct):
    traceEvents: list[Event]
result = 0
for path in sorted(pathlib.Path({dir!r}).glob("*.json*")):
    data = path.read_bytes()
    if data[:2] == b"\\x1f\\x8b":
        data = gzip.decompress(data)
    result += len(msgspec.json.decode(data, type=Trace).traceEvents)
"""

_RANKSCOPE = """
from rankscope.analysis import kernel_report
tables = kernel_report([{dir!r}]).tables
result = {{t.kind: round(t.total_us, 1) for t in tables}}
"""

_HTA = """
import logging
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
analyzer = TraceAnalysis(trace_dir={dir!r})
kernel_types, kernels = analyzer.get_gpu_kernel_breakdown(visualize=False)
result = {{"rows": len(kernels)}}
"""


def _measure(python: str, body: str, timeout: float = 1800) -> dict[str, Any] | None:
    code = _HARNESS.format(body=textwrap.dedent(body))
    try:
        done = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        print(f"    did not finish within {timeout:.0f} s (stopped)")
        return {"wall": float("inf"), "rss_mb": float("nan"), "result": None, "timed_out": True}
    if done.returncode != 0:
        print(f"    failed: {done.stderr.strip().splitlines()[-1:]}")
        return None
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def _hta_python() -> str | None:
    python = HTA_VENV / "bin" / "python"
    if not python.exists():
        print(
            f"setting up HolisticTraceAnalysis {HTA_VERSION} in {HTA_VENV} (once, about a minute)"
        )
        subprocess.run([sys.executable, "-m", "venv", str(HTA_VENV)], check=True)
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *HTA_PACKAGES],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            print(f"  cannot install HTA ({done.stderr.strip()[-300:]}); comparing without it")
            shutil.rmtree(HTA_VENV, ignore_errors=True)
            return None
    return str(python)


_REAL_SETS = {
    "real: 128-rank NCCL job, ranks 0 and 1": [
        "gpu-128rank-sampled-rank0.json.gz",
        "gpu-128rank-sampled-rank1.json.gz",
    ],
    "real: AlexNet on one GPU": ["gpu-alexnet-1rank.json.gz"],
}


def _linked(label: str, names: list[str]) -> Path:
    """A folder of links to some of the shared real traces (the shared folder mixes jobs)."""
    folder = RESULTS / "traces" / ("real-" + "".join(c if c.isalnum() else "-" for c in label))
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        link = folder / name
        if not link.exists():
            link.symlink_to(SHARED_TRACES / name)
    return folder


def _generated(size_mb: int) -> Path:
    """A folder holding one generated GPU trace of `size_mb` MB of JSON (gzipped)."""
    folder = RESULTS / "traces" / f"gen-{size_mb}mb"
    trace = folder / "rank-00000.pt.trace.json.gz"
    if not trace.exists():
        from rankscope.testing._synthetic_traces import write_trace

        print(f"  generating a {size_mb} MB trace (cached in {folder}) ...", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        write_trace(trace, size_bytes=size_mb << 20, seed=size_mb)
    return folder


def _raw_mb(folder: Path) -> float:
    import gzip

    total = 0
    for path in folder.iterdir():
        with open(path, "rb") as fh:
            packed = fh.read(2) == b"\x1f\x8b"
        if packed:
            with gzip.open(path, "rb") as fh:
                while chunk := fh.read(1 << 22):
                    total += len(chunk)
        else:
            total += path.stat().st_size
    return total / 1e6


def kernels(sizes: list[int], hta: bool) -> None:
    print("== kernel summary: rankscope vs HolisticTraceAnalysis vs the floor")
    sets: list[tuple[str, Path]] = []
    if SHARED_TRACES.is_dir():
        # HTA reads a folder as one job, one trace per rank: give it real jobs.
        for label, names in _REAL_SETS.items():
            sets.append((label, _linked(label, names)))
    else:
        print(f"  (real traces not found at {SHARED_TRACES}; skipped)")
    for size_mb in sizes:
        sets.append((f"generated {size_mb} MB", _generated(size_mb)))
    hta_python = _hta_python() if hta else None
    for label, folder in sets:
        raw_mb = _raw_mb(folder)
        print(f"-- {label}: {raw_mb:.0f} MB of JSON in {folder}")
        floor = _measure(sys.executable, _FLOOR.format(dir=str(folder)))
        typed = _measure(sys.executable, _FLOOR_TYPED.format(dir=str(folder)))
        ours = _measure(sys.executable, _RANKSCOPE.format(dir=str(folder)))
        theirs = _measure(hta_python, _HTA.format(dir=str(folder))) if hta_python else None
        rows = [
            ("floor (decompress + json)", floor),
            ("typed msgspec, whole file", typed),
            ("rankscope kernels", ours),
        ]
        if hta_python:
            rows.append((f"HTA {HTA_VERSION}", theirs))
        for name, m in rows:
            if m is not None:
                print(f"    {name:<28} {m['wall']:8.2f} s   peak RSS {m['rss_mb']:8.0f} MB")
        if ours is None:
            continue
        if floor is not None:
            print(f"    rankscope vs floor: {ours['wall'] / floor['wall']:.2f}x time (goal <= 2x)")
        if typed is not None:
            print(
                f"    rankscope vs a whole-file typed decode: {ours['wall'] / typed['wall']:.2f}x "
                f"time, {ours['rss_mb'] / typed['rss_mb']:.2f}x peak RSS"
            )
        if label.startswith("generated") and raw_mb > 1000:
            print(
                f"    rankscope peak RSS {ours['rss_mb']:.0f} MB (goal: within 300 MB, by a chunk)"
            )
        if theirs is not None and theirs.get("timed_out"):
            print(f"    HTA vs rankscope: HTA did not finish; rankscope took {ours['wall']:.1f} s")
        elif theirs is not None:
            print(
                f"    HTA vs rankscope: {theirs['wall'] / ours['wall']:.1f}x time (goal >= 10x); "
                f"rankscope peak RSS {ours['rss_mb'] / theirs['rss_mb']:.2f}x HTA's (goal <= 0.5x)"
            )


def _timings_run(ranks: int, steps: int) -> Path | None:
    """Generated timings of `ranks` x `steps` sampled steps (cached); None if the disk is short."""
    run = RESULTS / f"timings-{ranks}x{steps}"
    if (run / "timings").is_dir():
        return run
    # About 150 bytes of JSONL a record, 6 records a step; ask for that and a GB besides.
    need = ranks * steps * 6 * 150 + (1 << 30)
    free = shutil.disk_usage(RESULTS).free
    if free < need:
        print(f"  skipped: generating it needs about {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free")
        return None
    from rankscope.testing._synthetic import Slowdown, write_timings

    print(f"  generating (cached in {run}) ...", flush=True)
    partial = run.with_name(f".partial-{run.name}")  # a cut-off run leaves no bad cache
    shutil.rmtree(partial, ignore_errors=True)
    write_timings(
        partial, ranks=ranks, steps=steps, slowdowns=[Slowdown(ranks // 3, "forward", 0.3)]
    )
    os.replace(partial, run)
    return run


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} (1, 5, 15 min)"


def _goal(what: str, value: float, limit: float, unit: str = "x", digits: int = 2) -> str:
    """`what` against its goal (an upper bound), saying whether the goal is met."""
    verdict = "met" if value <= limit else "NOT met"
    return f"{what}: {value:.{digits}f}{unit} (goal <= {limit:g}{unit}): {verdict}"


# The floor of issue 18: DuckDB alone reading the four columns the rules need, taking each
# (step, phase)'s median and joining it back to every record, fetched as numpy (the phase
# as a number: no Python object per record). Read once (MATERIALIZED), on every core.
_BARE_SQL = """
WITH records AS MATERIALIZED (
    SELECT rank, step, phase, cpu_ms
    FROM read_json($files, format = 'newline_delimited', columns = $columns)
), medians AS (
    SELECT step, phase, median(cpu_ms) AS median_ms,
        dense_rank() OVER (ORDER BY phase) AS phase_id
    FROM records GROUP BY step, phase
)
SELECT records.rank, records.step, medians.phase_id, records.cpu_ms, medians.median_ms
FROM records JOIN medians USING (step, phase)
"""

_BARE_COLUMNS = {"rank": "BIGINT", "step": "BIGINT", "phase": "VARCHAR", "cpu_ms": "DOUBLE"}

_DUCKDB_BARE = """
import glob, os
import duckdb
con = duckdb.connect(":memory:")
con.execute(f"SET threads = {{os.cpu_count()}}")
con.execute("SET enable_progress_bar = false")  # it writes to stdout, where the harness reports
files = sorted(glob.glob(os.path.join({run!r}, "timings", "*.jsonl")))
rows = con.execute({sql!r}, {{"files": files, "columns": {columns!r}}}).fetchnumpy()
result = len(rows["rank"])
"""

# The floor of any DuckDB reader that keeps the reader's promises: the same aggregation,
# reading every field the straggler rules and the record checks need (kind, start_ns,
# depth, error besides), typed, with no check at all. What rankscope adds over it is the
# checks, the matrices, the rules and the output.
_FIELDS_SQL = _BARE_SQL.replace(
    "SELECT rank, step, phase, cpu_ms\n",
    "SELECT rank, step, phase, cpu_ms, kind, start_ns, depth, error\n",
).replace(
    "records.cpu_ms, medians.median_ms",
    "records.cpu_ms, medians.median_ms, hash(records.kind), records.start_ns, records.depth, "
    "records.error",
)
_FIELDS_COLUMNS = {
    "rank": "BIGINT",
    "step": "BIGINT",
    "phase": "VARCHAR",
    "cpu_ms": "DOUBLE",
    "kind": "VARCHAR",
    "start_ns": "BIGINT",
    "depth": "BIGINT",
    "error": "BOOLEAN",
}

# The CLI in an interpreter of its own; the peak RSS reported is its own, not the harness's.
_CLI = """
import json, resource, subprocess, sys
command = [sys.executable, "-m", "rankscope.cli", "stragglers", {run!r}, "--json"]
done = subprocess.run(command, capture_output=True, text=True, check=False)
if done.returncode != 0:
    sys.exit(done.stderr.strip())
summary = json.loads(done.stdout)["summary"]
result = {{
    "found": summary[0] if summary else "nothing",
    "rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
}}
"""

# The pure-Python reader that DuckDB replaced, doing what the CLI does with it.
_TODAY = """
from rankscope.analysis import find_stragglers, phase_matrices, read_run_meta, read_timings
meta = read_run_meta({run!r})
summary = find_stragglers(phase_matrices(read_timings({run!r})), hosts=meta.hosts).summary
result = {{"found": summary[0] if summary else "nothing"}}
"""

# The timings path alone: the records read and the matrices built, no rules, no output.
_PATH = """
from rankscope.analysis import matrices_of, read_run_records
m = matrices_of(read_run_records({run!r}))
result = {{"cells": len(m.ranks) * len(m.steps)}}
"""

BARE = "DuckDB bare aggregation"
FIELDS = "DuckDB bare, reading the 8 fields unchecked"
PATH = "timings path: read_run_records + matrices_of"
CLI = "rankscope stragglers --json, end to end:"
TODAY = "today: phase_matrices(read_timings) + find"


def _best_of(bodies: dict[str, str], rounds: int = 3) -> dict[str, dict[str, Any]]:
    """Each body `rounds` times, taking turns (the machine is shared): best wall, highest RSS.

    Empty when a run fails or times out (`_measure` has said why)."""
    best: dict[str, dict[str, Any]] = {}
    for _ in range(rounds):
        for name, body in bodies.items():
            m = _measure(sys.executable, body)
            if m is None or m.get("timed_out"):
                print(f"    ({name} did not complete)")
                return {}
            if isinstance(m["result"], dict) and "rss_mb" in m["result"]:
                m["rss_mb"] = m["result"]["rss_mb"]
            held = best.setdefault(name, m)
            held["rss_mb"] = max(held["rss_mb"], m["rss_mb"])
            if m["wall"] < held["wall"]:
                held.update(wall=m["wall"], result=m["result"])
    return best


def _verdicts(ranks: int, steps: int, best: dict[str, dict[str, Any]]) -> list[str]:
    """Issue 18's goals for this size, each saying whether it is met."""
    bare, ours, today = best[BARE], best[CLI], best.get(TODAY)
    ratio = ours["wall"] / bare["wall"]
    lines = []
    if (ranks, steps) == (4096, 200):
        lines += [
            _goal("rankscope vs DuckDB bare, time", ratio, 1.5),
            _goal("rankscope time (stated for the issue's machine)", ours["wall"], 3, " s"),
            _goal("rankscope peak RSS", ours["rss_mb"], 600, " MB", 0),
        ]
    elif (ranks, steps) == (4096, 2000):
        lines += [
            f"rankscope vs DuckDB bare, time: {ratio:.2f}x (no goal at this size)",
            _goal("rankscope completes; its peak RSS", ours["rss_mb"], 4096, " MB", 0),
        ]
    else:
        lines.append(f"rankscope vs DuckDB bare, time: {ratio:.2f}x (no goal at this size)")
    if PATH in best:
        path = best[PATH]["wall"] / bare["wall"]
        lines.append(f"timings path alone vs DuckDB bare, time: {path:.2f}x")
    if FIELDS in best:
        floor = best[FIELDS]["wall"] / bare["wall"]
        lines.append(
            f"reading the 8 fields unchecked vs DuckDB bare, time: {floor:.2f}x "
            "(the floor of a reader that keeps the promises)"
        )
    if today is not None:
        slower = ours["wall"] / today["wall"]
        if (ranks, steps) == (1024, 200):
            lines.append(_goal("rankscope vs today, time", slower, 1))
        else:
            lines.append(f"rankscope vs today, time: {slower:.2f}x")
        lines.append(f"rankscope vs today, peak RSS: {ours['rss_mb'] / today['rss_mb']:.2f}x")
    return lines


def stragglers(quick: bool, long: bool) -> None:
    """Issue 18's goals: each size measured side by side with DuckDB's bare aggregation."""
    print(
        "== stragglers: `rankscope stragglers RUN --json` vs DuckDB's bare aggregation "
        f"({os.cpu_count()} threads) vs today's pure-Python reader; best of "
        f"{1 if quick else 3}, taking turns"
    )
    sizes = [(128, 50)] if quick else [(1024, 200), (4096, 200)]
    if long and not quick:
        sizes.append((4096, 2000))
    elif not quick:
        print("  (4096 x 2000, about 7.5 GB of JSONL, runs with --long)")
    for ranks, steps in sizes:
        print(f"-- {ranks} ranks x {steps} sampled steps")
        run = _timings_run(ranks, steps)
        if run is None:
            continue
        jsonl_mb = sum(p.stat().st_size for p in (run / "timings").iterdir()) / 1e6
        print(f"  {jsonl_mb:.0f} MB of JSONL in {run}; {_load()}")
        bodies = {
            BARE: _DUCKDB_BARE.format(run=str(run), sql=_BARE_SQL, columns=_BARE_COLUMNS),
            FIELDS: _DUCKDB_BARE.format(run=str(run), sql=_FIELDS_SQL, columns=_FIELDS_COLUMNS),
            CLI: _CLI.format(run=str(run)),
            PATH: _PATH.format(run=str(run)),
        }
        if steps <= 200:  # the old reader only where issue 18 measured "today"
            bodies[TODAY] = _TODAY.format(run=str(run))
        best = _best_of(bodies, rounds=1 if quick else 3)
        if not best:
            continue
        print(f"    {best[BARE]['result']:,} records")
        for name, m in best.items():
            print(f"    {name:<44} {m['wall']:7.2f} s   peak RSS {m['rss_mb']:6.0f} MB")
        for line in _verdicts(ranks, steps, best):
            print(f"    {line}")
        found = best[CLI]["result"]["found"]
        print(f"    found: {found}")
        if TODAY in best and best[TODAY]["result"]["found"] != found:
            print(f"    today's reader found otherwise: {best[TODAY]['result']['found']}")
        print(f"  {_load()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small inputs (a smoke test)")
    parser.add_argument("--no-hta", action="store_true", help="skip HolisticTraceAnalysis")
    parser.add_argument(
        "--long",
        action="store_true",
        help="stragglers also on 4096 x 2000 (about 7.5 GB of JSONL, minutes to generate)",
    )
    parser.add_argument(
        "--sizes",
        nargs="+",
        type=int,
        metavar="MB",
        help="generated trace sizes for the kernel summary (default: 50 500; 4 with --quick)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=SECTIONS,
        default=SECTIONS,
        help="run only these sections (default: all)",
    )
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}")
    if "kernels" in args.only:
        kernels(args.sizes or ([4] if args.quick else [50, 500]), not args.no_hta)
    if "stragglers" in args.only:
        stragglers(args.quick, args.long)
    if "merge" in args.only:
        print("== merge")
        sys.path.insert(0, str(BENCH))
        from _merge_bench import run as merge_bench

        merge_bench(quick=args.quick)


if __name__ == "__main__":
    main()
