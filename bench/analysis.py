"""Analysis speed and memory, side by side in one run.

1. Kernel summary: `rankscope kernels` against HolisticTraceAnalysis 0.5.0
   (`TraceAnalysis(trace_dir=...)` + `get_gpu_kernel_breakdown()`, in its own virtual
   environment under bench/.results) and against the floor (decompress and json-decode
   each file, nothing else), on the real traces in ../shared/data/traces and on
   generated traces of 50 MB and 500 MB. Goals: >= 10x faster than HTA, <= 0.5x its
   peak RSS, within 2x of the floor.
2. Stragglers: `rankscope stragglers RUN --json` end to end (a new interpreter) on
   generated timings of 1024 ranks x 200 sampled steps x 6 phases. Goal: under 3 s.
3. Merge of 8 rank traces of 20 MB (bench/_merge_bench.py). Goal: >= 50 MB/s, bounded memory.

Each measurement runs in a fresh process that reports its wall time and peak RSS
(its own peak plus its largest child's, for tools that fork workers).

    python bench/analysis.py [--quick] [--no-hta] [--sizes MB...] [--only kernels stragglers merge]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
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
        from rankscope._synthetic import write_trace

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


def stragglers(quick: bool) -> None:
    ranks, steps = (128, 50) if quick else (1024, 200)
    print(f"== stragglers: {ranks} ranks x {steps} sampled steps x 6 phases (5 + the step record)")
    run = RESULTS / f"timings-{ranks}x{steps}"
    if not (run / "timings").is_dir():
        from rankscope._synthetic import Slowdown, write_timings

        print(f"  generating (cached in {run}) ...", flush=True)
        write_timings(
            run, ranks=ranks, steps=steps, slowdowns=[Slowdown(ranks // 3, "forward", 0.3)]
        )
    command = [sys.executable, "-m", "rankscope.cli", "stragglers", str(run), "--json"]
    walls = []
    for _ in range(3):
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        walls.append(time.perf_counter() - started)
        if done.returncode != 0:
            print(f"  failed: {done.stderr.strip()[-500:]}")
            return
    summary = json.loads(done.stdout)["summary"]
    print(f"  rankscope stragglers --json, end to end: best {min(walls):.2f} s of 3 (goal < 3 s)")
    print(f"  found: {summary[0] if summary else 'nothing'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small inputs (a smoke test)")
    parser.add_argument("--no-hta", action="store_true", help="skip HolisticTraceAnalysis")
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
        stragglers(args.quick)
    if "merge" in args.only:
        print("== merge")
        sys.path.insert(0, str(BENCH))
        from _merge_bench import run as merge_bench

        merge_bench(quick=args.quick)


if __name__ == "__main__":
    main()
