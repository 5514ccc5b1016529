"""The trace engine's two decoders: typed msgspec (analysis) and the stdlib's json (capture).

One scanner cuts batches of events; a summary is the same whichever decoder reads them,
and the capture side, which a training job imports, never imports msgspec.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rankscope.testing._synthetic_traces import write_trace
from rankscope.traces import _stream
from rankscope.traces._kineto import summarize_trace

# Events the summary must count, or leave out and say, alike under both decoders: each
# is odd in a way msgspec refuses and the stdlib accepts (NaN, 1e400, a lone surrogate),
# or a type that is not what the field should hold.
ODD_EVENTS = """[
 {"ph": "X", "cat": "kernel", "name": "gemm", "dur": 5.5, "ts": 1, "args": {"a": [{"b": "},{"}]}},
 {"ph": "X", "cat": "kernel", "name": "gemm", "dur": NaN, "ts": 2},
 {"ph": "X", "cat": "kernel", "name": "gemm", "dur": 1e400, "ts": 3},
 {"ph": "X", "cat": "kernel", "name": "nccl\\ud800", "dur": 2, "ts": 4},
 {"ph": "X", "cat": "kernel", "name": 7, "dur": 2, "ts": 5},
 {"ph": "X", "cat": "kernel", "name": "gemm", "dur": "3", "ts": 6},
 {"ph": "X", "cat": "kernel", "name": "gemm", "dur": true, "ts": 7},
 {"ph": "X", "cat": ["kernel"], "name": "gemm", "dur": 1, "ts": 8},
 {"ph": "X", "cat": "gpu_memcpy", "name": "copy", "dur": 4, "ts": 9, "ph": "X"},
 {"ph": "X", "cat": "kernel", "name": "gemm", "dur": 123456789012345678901234567890, "ts": 9},
 {"ph": "X", "cat": "kernel", "name": "\\"},{\\"", "dur": 1, "ts": 10}
]"""

# Prints the summaries of the traces in argv as JSON, with msgspec blocked where asked.
_CHILD = """
import json, sys
if sys.argv[1] == "blocked":
    sys.modules["msgspec"] = None  # import msgspec raises ImportError, as where it is absent
from rankscope.traces._kineto import summarize_trace
print(json.dumps([summarize_trace(path) for path in sys.argv[2:]], allow_nan=False))
print(json.dumps("msgspec" in sys.modules and sys.modules["msgspec"] is not None))
"""


def _summaries(how: str, paths: list[Path]) -> tuple[list[dict[str, Any]], bool]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, how, *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
    )
    summaries, imported = done.stdout.strip().splitlines()
    return json.loads(summaries), json.loads(imported)


@pytest.fixture
def traces(tmp_path: Path) -> list[Path]:
    gpu, cpu, odd = tmp_path / "gpu.json.gz", tmp_path / "cpu.json", tmp_path / "odd.json"
    write_trace(gpu, size_bytes=3 << 20, seed=1)
    write_trace(cpu, size_bytes=1 << 20, gpu=False, seed=2, compact=True)
    odd.write_text(f'{{"traceEvents": {ODD_EVENTS}, "distributedInfo": {{"rank": 3}}}}')
    return [gpu, cpu, odd]


def test_a_summary_is_the_same_with_msgspec_blocked(traces: list[Path]) -> None:
    typed, imported = _summaries("typed", traces)
    plain, blocked_imported = _summaries("blocked", traces)
    assert imported and not blocked_imported
    assert typed == plain
    assert [s["kind"] for s in typed] == ["gpu_kernels", "cpu_ops", "gpu_kernels"]
    odd = typed[2]
    # gemm twice (5.5 and a huge int is a bad dur), nccl\ud800 once, the memcpy.
    assert {i["name"]: i["count"] for i in odd["items"]} == {"gemm": 1, "nccl\ud800": 1, '"},{"': 1}
    assert odd["left_out"] == {"dur": 5, "name": 1}


def test_the_stdlib_decoder_in_process_agrees_with_msgspec(traces: list[Path]) -> None:
    for path in traces:
        typed = summarize_trace(path)
        plain = summarize_trace(path, use_msgspec=False)
        assert json.dumps(typed) == json.dumps(plain), path.name


def test_real_traces_summarise_alike_under_both_decoders(real_traces: Path) -> None:
    paths = sorted(real_traces.glob("*.gz"))
    typed, _ = _summaries("typed", paths)
    plain, _ = _summaries("blocked", paths)
    assert typed == plain


def test_the_job_side_never_imports_msgspec(tmp_path: Path) -> None:
    """Importing rankscope, starting a Profiler's pieces and finalising a window: no msgspec."""
    code = f"""
import json, sys
from pathlib import Path
import rankscope
from rankscope.capture._finalize import RAW_NAME, FinalizeJob, finalize
from rankscope.testing._synthetic_traces import write_trace
run = Path({str(tmp_path)!r})
window = run / "traces" / "step-000001-000002"
work = window / ".rank-00000.pt.trace.json.raw-1.tmp"
work.mkdir(parents=True)
write_trace(work / RAW_NAME, size_bytes=1 << 20)
summary = finalize(FinalizeJob(raw=str(work / RAW_NAME), trace=str(window / "rank-00000.pt.trace.json.gz"),
    summary=str(window / "rank-00000.summary.json"), rank=0, window=window.name, run_dir=str(run)))
assert summary["kind"] == "gpu_kernels", summary
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("msgspec", "duckdb"))))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []


def test_a_wrong_cut_is_read_one_by_one_and_then_batched_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A "}" followed by "," inside a string looks like the end of an event: the batch
    cut there does not decode, its events are read one by one, and batches resume."""
    # Events of under 200 bytes in batches of 4 KB: only a wrong cut reads one alone.
    monkeypatch.setattr(_stream, "_BATCH", 4096)
    monkeypatch.setattr(_stream, "_CHUNK", 4096)
    events = [{"name": "x" * 30 + '},{"' + "y" * (i % 50), "i": i} for i in range(3000)]
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    batches: list[int] = []
    seen: list[Any] = []

    def visit(batch: list[Any]) -> None:
        batches.append(len(batch))
        seen.extend(batch)

    _stream.scan_batches(path, visit)
    assert seen == events
    assert 1 in batches and max(batches) > 1
