"""Random damage to a sound run directory: report, stragglers, kernels and merge either
answer (in strict JSON) or raise TraceError naming a file, and never hang.

The damage is done to the content of traces, summaries, meta and timings files (a line
of them), and to the kind of any file (a FIFO, a folder, a link in a loop where a file
was); test_timings_reader.py fuzzes the timings reader's lines further. The examples are fixed
(derandomize, no database), so a run in CI sees the same ones as a run here, and few,
so the module takes seconds.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rankscope import TraceError
from rankscope.analysis import (
    build_report,
    find_stragglers,
    kernel_report,
    merge_traces,
    phase_matrices,
    read_run_meta,
    read_timings,
)
from rankscope.rundir._layout import summary_of
from rankscope.testing._synthetic import write_timings
from rankscope.testing._synthetic_traces import write_run_traces
from rankscope.traces._kineto import summarize_trace

from .._helpers import within

pytestmark = pytest.mark.slow

WINDOW = "step-000003-000004"
HANG_S = 20  # one call on a small run takes well under a second
WEIRD: list[Any] = [
    float("nan"),
    float("inf"),
    -1,
    -1.5,
    10**400,
    "",
    "12",
    [],
    {},
    None,
    True,
    [[[[[[[[]]]]]]]],
    {"rank": 0},
]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pristine")
    write_timings(root, ranks=2, steps=8)
    for truth in write_run_traces(root, WINDOW, [0, 1], world_size=2, size_bytes=6_000):
        summary = summary_of(truth.path)
        assert summary is not None
        summary.write_text(json.dumps(summarize_trace(truth.path, window=WINDOW)))
    return root


# -- the damage -------------------------------------------------------------------------


def _files(run: Path) -> list[Path]:
    return sorted(p for p in run.rglob("*") if p.is_file())


def _load(path: Path) -> Any:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def _save(path: Path, doc: Any) -> None:
    text = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(text) if path.name.endswith(".gz") else text)


def _places(doc: Any, depth: int = 0) -> list[tuple[Any, Any]]:
    """(container, key) of values in `doc`: the top-level fields, the events' and the
    summary's rows' fields, not every leaf of a large trace."""
    out: list[tuple[Any, Any]] = []
    items = (
        doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else []
    )
    for key, value in items:
        out.append((doc, key))
        if depth < 2 and isinstance(value, (dict, list)):
            out.extend(_places(value, depth + 1))
    return out


def _damage(run: Path, how: tuple[str, int, Any, float]) -> None:
    kind, pick, value, where = how
    if kind in ("fifo", "folder", "loop", "empty"):
        files = _files(run)
        target = files[pick % len(files)]
        target.unlink()
        if kind == "fifo":
            os.mkfifo(target)
        elif kind == "folder":
            target.mkdir()
        elif kind == "loop":
            target.symlink_to(target.name)
        else:
            target.write_bytes(b"")
        return
    ours = [p for p in _files(run) if p.parent.name in (WINDOW, "meta", "timings")]
    if not ours:
        return
    target = ours[pick % len(ours)]
    data = target.read_bytes()
    if kind == "truncate":
        target.write_bytes(data[: int(len(data) * where)])
    elif kind == "flip":
        at = int(len(data) * where) % max(1, len(data))
        target.write_bytes(data[:at] + bytes([data[at] ^ 0x5A]) + data[at + 1 :] if data else b"")
    elif target.suffix == ".jsonl":  # "replace" or "delete" in one line of a timings file
        lines = data.splitlines()
        if not lines:
            return
        at = int(len(lines) * where) % len(lines)
        try:
            doc = json.loads(lines[at])
        except (ValueError, RecursionError):
            return  # damaged already
        _change(doc, kind, value, where)
        lines[at] = json.dumps(doc).encode()
        target.write_bytes(b"\n".join(lines) + b"\n")
    else:  # "replace" or "delete": a value of the JSON
        try:
            doc = _load(target)
        except (ValueError, OSError, EOFError, zlib.error, RecursionError):
            return  # damaged already
        _change(doc, kind, value, where)
        _save(target, doc)


def _change(doc: Any, kind: str, value: Any, where: float) -> None:
    places = _places(doc)
    if not places:
        return
    container, key = places[int(len(places) * where) % len(places)]
    if kind == "delete" and isinstance(container, dict):
        del container[key]
    else:
        container[key] = value


DAMAGE = st.tuples(
    st.sampled_from(["truncate", "flip", "replace", "delete", "fifo", "folder", "loop", "empty"]),
    st.integers(0, 50),
    st.sampled_from(WEIRD),
    st.floats(0.0, 1.0),
)


# -- the readers, each under a hang guard -----------------------------------------------


def _within(call: Callable[[], Any]) -> Any:
    """`call()`, or the TraceError it raised (anything else fails); a hang fails too."""

    def answer() -> Any:
        try:
            return call()
        except TraceError as exc:
            return exc

    return within(answer, HANG_S)


def _said(error: TraceError, run: Path) -> None:
    message = str(error)
    assert "\n" not in message and message, message


def _stragglers(run: Path) -> dict[str, Any]:
    meta = read_run_meta(run)
    timings = read_timings(run, workers=1)
    return find_stragglers(phase_matrices(timings, "host"), hosts=meta.hosts).to_dict()


@settings(
    max_examples=40,
    deadline=timedelta(seconds=HANG_S),
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(damage=st.lists(DAMAGE, min_size=1, max_size=3))
# Found by longer runs: a phase name flipped on one rank (a ratio with nothing to compare:
# NaN in the table), an event name that is a list (unhashable, in merge).
@example(damage=[("flip", 2, None, 0.8800905465629263)])
@example(damage=[("replace", 4, [[[[[[[[]]]]]]]], 0.03125)])
def test_damaged_runs_are_answered_or_named(
    pristine: Path, damage: list[tuple[str, int, Any, float]]
) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        run = Path(scratch) / "run"
        shutil.copytree(pristine, run, symlinks=True)
        for how in damage:
            _damage(run, how)
        answers = [
            _within(lambda: kernel_report([run], workers=1).to_dict()),
            _within(lambda: build_report(run)),
            _within(lambda: _stragglers(run)),
        ]
        traces = sorted((run / "traces" / WINDOW).glob("rank-*.pt.trace.json.gz"))
        if traces:
            answers.append(_within(lambda: merge_traces(traces, run / "merged.json").to_dict()))
        for answer in answers:
            if isinstance(answer, TraceError):
                _said(answer, run)
            else:
                json.dumps(answer, allow_nan=False)  # strict JSON: no NaN, no Infinity
        if (run / "merged.json").exists():
            json.loads((run / "merged.json").read_text(), parse_constant=_refuse)


def _refuse(word: str) -> None:
    raise AssertionError(f"{word} in the merged trace")
