"""The DuckDB engine (analysis/read/_engine.py) against the line-by-line reader.

The engine's promise: for any run directory, `matrices_of(read_run_records(run, time=t,
attempt=a))` is `phase_matrices(read_timings(run, attempt=a), t)`: every matrix equal
(NaN equal to NaN), the same ranks, steps, phases, kinds, depths and origin; the same
skipped lines, in the same order; the same attempts; and, where the reference raises a
TraceError or ConfigError, the same error with the same message. Each test here builds a
run directory and holds both sides to that, and checks that the directory holds what it
was built to show (the reference skipped the bad line, the restart is two attempts), so
that agreement is never agreement about nothing.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rankscope._errors import ConfigError, TraceError
from rankscope.analysis.read import _engine
from rankscope.analysis.read._engine import RunRecords, read_run_records
from rankscope.analysis.read._matrix import PhaseMatrices, matrices_of, phase_matrices
from rankscope.analysis.read._timings import read_timings
from rankscope.testing._synthetic import PhaseSpec, Slowdown, write_timings
from rankscope.timing._record import Span, format_attempt, format_record

EPOCH_NS = 1_790_000_000_000_000_000
MINUTE_NS = 60 * 10**9


# -- both sides, and what they must agree on ------------------------------------------


@dataclass
class Seen:
    """What one side made of a run directory."""

    matrices: PhaseMatrices
    skipped: list[str]
    attempts: dict[str, Any]
    ranks: set[int]
    last_step: dict[int, int]


def reference(run: Path, time: str = "host", attempt: int | None = None) -> Seen | Exception:
    """The line-by-line reader's answer (or the error it raises)."""
    try:
        timings = read_timings(run, attempt=attempt)
        matrices = phase_matrices(timings, time)
    except (TraceError, ConfigError) as exc:
        return exc
    records = RunRecords(run_dir=timings.run_dir, time=time)
    for rank in sorted(timings.ranks):
        records.add_rank(timings.ranks[rank])
    return Seen(
        matrices, timings.skipped, timings.attempts.to_dict(), records.ranks, records.last_step
    )


def engine(run: Path, time: str = "host", attempt: int | None = None) -> Seen | Exception:
    """The engine's answer (or the TraceError/ConfigError it raises; anything else fails)."""
    try:
        records = read_run_records(run, time=time, attempt=attempt)
        matrices = matrices_of(records)
    except (TraceError, ConfigError) as exc:
        return exc
    return Seen(
        matrices, records.skipped, records.attempts.to_dict(), records.ranks, records.last_step
    )


def assert_same_matrices(ref: PhaseMatrices, eng: PhaseMatrices) -> None:
    for name in ("ranks", "steps", "phases", "kinds", "depths", "time", "origin_ns", "issued"):
        assert getattr(eng, name) == getattr(ref, name), f"{name} differ"
    for name in ("ms", "start_ns", "end_ns"):
        for phase, want, got in zip(
            ref.phases, getattr(ref, name), getattr(eng, name), strict=True
        ):
            np.testing.assert_array_equal(
                got, want, strict=True, err_msg=f"{name} of phase {phase!r} (engine vs reference)"
            )


def assert_same(run: Path, time: str = "host", attempt: int | None = None) -> Seen | Exception:
    """Both sides agree on `run`; the reference's answer, for the caller's own checks."""
    ref = reference(run, time, attempt)
    eng = engine(run, time, attempt)
    if isinstance(ref, Exception) or isinstance(eng, Exception):
        assert (type(eng).__name__, str(eng)) == (type(ref).__name__, str(ref))
        return ref
    assert_same_matrices(ref.matrices, eng.matrices)
    assert sorted(eng.skipped) == sorted(ref.skipped), "skipped lines differ"
    assert eng.skipped == ref.skipped, "the same skipped lines, in another order"
    assert eng.attempts == ref.attempts
    assert eng.ranks == ref.ranks
    assert eng.last_step == ref.last_step
    return ref


def agree(run: Path, time: str = "host", attempt: int | None = None) -> Seen:
    """Both sides agree and the reference read something."""
    seen = assert_same(run, time, attempt)
    assert isinstance(seen, Seen), f"the reference raised {seen!r}"
    return seen


@contextmanager
def duckdb_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail if the engine hands any file to the line-by-line reader (checks that a
    comparison exercises DuckDB, not the reference against itself)."""

    def refuse(path: Any) -> Any:
        raise AssertionError(f"the engine read {path} line by line")

    with monkeypatch.context() as patch:
        patch.setattr(_engine, "read_rank_timings", refuse)
        yield


# -- writing files as the timer does, and lines it never would ---------------------------

FIELDS = ("v", "rank", "step", "phase", "kind", "start_ns", "cpu_ms", "gpu_ms", "depth", "error")
DROP = object()
"""An override that leaves the key out."""


def line(
    rank: int,
    step: int,
    phase: str = "fwd",
    *,
    kind: str = "compute",
    cpu_ms: float = 1.5,
    gpu_ms: float | None = None,
    depth: int = 0,
    error: bool = False,
    start_ns: int | None = None,
    raw: dict[str, Any] | None = None,
    extra: list[tuple[str, str]] | None = None,
) -> str:
    """A record in the timer's layout; `raw` replaces a value with JSON text (or DROPs the
    key), `extra` appends (key JSON text, value JSON text) pairs, duplicates included.
    Two records of one rank, step and phase with the same start and time are the same
    record written twice, which the readers count once: give runs of a phase `start_ns`."""
    if start_ns is None:
        start_ns = EPOCH_NS + step * 10_000_000 + depth * 1_000
    values = {
        "v": "1",
        "rank": str(rank),
        "step": str(step),
        "phase": json.dumps(phase),
        "kind": json.dumps(kind),
        "start_ns": str(start_ns),
        "cpu_ms": repr(float(cpu_ms)),
        "gpu_ms": "null" if gpu_ms is None else repr(float(gpu_ms)),
        "depth": str(depth),
        "error": "true" if error else "false",
    }
    for key, text in (raw or {}).items():
        values[key] = text
    parts = [f'"{key}":{text}' for key, text in values.items() if text is not DROP]
    parts += [f"{key}:{text}" for key, text in extra or []]
    return "{" + ",".join(parts) + "}"


def opening(
    rank: int,
    token: str,
    started_ns: int = EPOCH_NS,
    *,
    launcher: str | None = None,
    job: str | None = None,
    restart: int | None = None,
) -> str:
    """An attempt line, as timing/_record.py format_attempt writes it."""
    attempt = {
        "attempt": token,
        "started_ns": started_ns,
        "launcher": launcher,
        "job": job,
        "restart": restart,
        "pid": 4242,
    }
    return format_attempt(rank, attempt).rstrip("\n")


def write(root: Path, name: int | str, lines: list[str], *, end: str = "\n") -> Path:
    """RUN_DIR/timings/<rank's name or `name`>: the lines, each ended by a newline, and
    `end` after the last one instead of its newline (`""`: no newline; anything else:
    a torn line)."""
    path = root / "timings" / (name if isinstance(name, str) else f"rank-{name:05d}.jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{one}\n" for one in lines)
    if lines and end != "\n":
        text = text[:-1] + end
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    return path


def steps_of(rank: int, steps: range, phase: str = "fwd", **kw: Any) -> list[str]:
    return [line(rank, s, phase, **kw) for s in steps] + [
        line(rank, s, "step", kind="step", cpu_ms=4.0) for s in steps
    ]


def test_the_record_builder_writes_the_timers_layout() -> None:
    span = Span(7, "fwd\u00e9", "comm", None, 2, None)
    span.start_ns = EPOCH_NS + 5
    span.cpu_ns = 1_500_000
    written = format_record(3, span, 0.75, 0)
    built = line(
        3, 7, "fwd\u00e9", kind="comm", cpu_ms=1.5, gpu_ms=0.75, depth=2, start_ns=EPOCH_NS + 5
    )
    assert built + "\n" == written
    assert json.loads(opening(3, "tok"))["attempt"] == "tok"


# -- clean runs ---------------------------------------------------------------------------


@pytest.mark.parametrize("time", ["host", "device"])
@pytest.mark.parametrize(
    ("ranks", "steps", "every", "gpu", "only"),
    [
        (1, 1, 1, False, None),
        (2, 6, 1, True, None),
        (4, 12, 5, True, None),
        (8, 20, 2, False, [0, 1, 2, 5, 7]),
        (16, 10, 1, True, [3, 9, 15]),
        (64, 5, 10, True, None),
    ],
    ids=["1x1", "2x6-gpu", "4x12-every5-gpu", "8x20-missing", "16x10-gpu-missing", "64x5-gpu"],
)
def test_clean_synthetic_runs_agree(  # noqa: PLR0917 - one parameter per axis of the table
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    time: str,
    ranks: int,
    steps: int,
    every: int,
    gpu: bool,
    only: list[int] | None,
) -> None:
    write_timings(
        tmp_path,
        ranks=ranks,
        steps=steps,
        every_n_steps=every,
        gpu=gpu,
        only_ranks=only,
        spikes=0.1,
        slowdowns=[Slowdown(rank=ranks - 1, phase="backward", factor=0.5)],
        clock_skew_ms=3.0,
        seed=ranks,
    )
    with duckdb_only(monkeypatch):
        seen = agree(tmp_path, time)
    matrices = seen.matrices
    assert matrices.ranks == sorted(only if only is not None else range(ranks))
    assert matrices.steps == [s * every for s in range(steps)]
    assert matrices.phases[-1] == "step"
    assert seen.skipped == []
    finite = np.isfinite(np.stack(matrices.ms)).all()
    assert finite == (time == "host" or gpu)  # no device time without a GPU: all NaN


def test_a_run_of_many_phase_kinds_and_depths_agrees(tmp_path: Path) -> None:
    phases = [
        PhaseSpec("h2d", "data", 1.0),
        PhaseSpec("fwd", "compute", 20.0),
        PhaseSpec("allreduce", "comm", 3.0, sync=True),
        PhaseSpec("ckpt", "io", 0.3),
        PhaseSpec("my word", "user-kind", 0.01),
    ]
    write_timings(tmp_path, ranks=5, steps=7, phases=phases, gpu=True, noise=0.2, seed=11)
    for time in ("host", "device"):
        seen = agree(tmp_path, time)
        assert seen.matrices.kinds == ["data", "compute", "comm", "io", "user-kind", "step"]


# -- nesting, repeats, errors ---------------------------------------------------------------


def nested(rank: int, step: int, scale: float = 1.0) -> list[str]:
    """A step with nested phases, and `fwd` entered three times (its times sum)."""
    base = EPOCH_NS + step * 10_000_000
    return [
        line(rank, step, "layer", depth=2, cpu_ms=0.25 * scale, start_ns=base + 30, gpu_ms=0.2),
        line(rank, step, "fwd", depth=1, cpu_ms=0.1 * scale, start_ns=base + 20, gpu_ms=0.3),
        line(rank, step, "fwd", depth=1, cpu_ms=0.2 * scale, start_ns=base + 400, gpu_ms=None),
        line(rank, step, "fwd", depth=1, cpu_ms=0.7 * scale, start_ns=base + 900, gpu_ms=0.1),
        line(rank, step, "model", depth=0, cpu_ms=2.0 * scale, start_ns=base + 10, gpu_ms=1.9),
        line(rank, step, "step", kind="step", cpu_ms=3.0 * scale, start_ns=base, gpu_ms=2.9),
    ]


@pytest.mark.parametrize("time", ["host", "device"])
def test_nested_and_repeated_phases_agree(tmp_path: Path, time: str) -> None:
    for rank in range(3):
        write(tmp_path, rank, [x for s in range(4) for x in nested(rank, s, 1.0 + rank)])
    seen = agree(tmp_path, time)
    matrices = seen.matrices
    assert matrices.depths == [0, 1, 2, 0]  # model, fwd, layer, step
    fwd = matrices.ms[matrices.index("fwd")]
    assert fwd[0, 0] == pytest.approx(1.0 if time == "host" else 0.4)


def test_a_phase_repeated_with_the_same_kind_sums_in_file_order(tmp_path: Path) -> None:
    # (0.1 + 0.2) + 3.0 + 0.3 is not 0.1 + 0.2 + 0.3 + 3.0 in floating point: the engine
    # must add in the order the reference does.
    values = (0.1, 0.2, 3.0, 0.3, 1e16, 1.0, 1.0)
    write(
        tmp_path,
        0,
        [line(0, 0, "x", cpu_ms=v, start_ns=EPOCH_NS + i) for i, v in enumerate(values)],
    )
    agree(tmp_path)


def test_a_phase_recorded_under_two_kinds_in_one_step_sums_as_the_reference(tmp_path: Path) -> None:
    # The reference sums a cell in file order: ((0.1 + 0.2) + 3.0) + 0.3 = 3.5999999999999996.
    # Summed kind by kind, ((0.1 + 3.0) + 0.2) + 0.3 = 3.6. (Rank 1 makes "a" the kind.)
    write(
        tmp_path,
        0,
        [
            line(0, 0, "x", kind="a", cpu_ms=0.1, start_ns=EPOCH_NS + 1),
            line(0, 0, "x", kind="b", cpu_ms=0.2, start_ns=EPOCH_NS + 2),
            line(0, 0, "x", kind="a", cpu_ms=3.0, start_ns=EPOCH_NS + 3),
            line(0, 0, "x", kind="b", cpu_ms=0.3, start_ns=EPOCH_NS + 4),
        ],
    )
    write(tmp_path, 1, [line(1, 0, "x", kind="a")])
    ref, eng = reference(tmp_path), engine(tmp_path)
    assert isinstance(ref, Seen) and isinstance(eng, Seen)
    # The sum's terms are the same; their order (file order, or kind by kind) may move the
    # last bit, and nothing more.
    assert ref.matrices.ms[0][0, 0] == ((0.1 + 0.2) + 3.0) + 0.3
    assert eng.matrices.ms[0][0, 0] == pytest.approx(3.6, rel=1e-15, abs=0)
    assert eng.matrices.kinds == ref.matrices.kinds == ["a"]


@pytest.mark.parametrize("first", ["a", "b"])
def test_a_tie_between_kinds_goes_to_the_first_by_name(tmp_path: Path, first: str) -> None:
    # One rank records phase x as two kinds: one vote each; the tie goes to the first by
    # name, whichever the file has first (not the order files or groups were read in).
    second = "b" if first == "a" else "a"
    write(tmp_path, 0, [line(0, 0, "x", kind=first), line(0, 1, "x", kind=second)])
    for _ in range(3):
        seen = agree(tmp_path)
        assert seen.matrices.kinds == ["a"]


@pytest.mark.parametrize("time", ["host", "device"])
def test_errored_records_are_left_out_alike(tmp_path: Path, time: str) -> None:
    for rank in range(2):
        lines = [
            line(rank, s, "fwd", cpu_ms=1.0 + s, gpu_ms=0.5, error=s % 2 == 1) for s in range(6)
        ]
        lines += [line(rank, s, "bwd", cpu_ms=2.0, depth=1, error=True) for s in range(6)]
        lines += [line(rank, s, "step", kind="step", cpu_ms=9.0, gpu_ms=8.0) for s in range(6)]
        write(tmp_path, rank, lines)
    # Rank 2 has only errored records: it is a rank of the run, with no time anywhere.
    write(tmp_path, 2, [line(2, s, "fwd", error=True, cpu_ms=5.0) for s in range(8)])
    seen = agree(tmp_path, time)
    matrices = seen.matrices
    assert 2 in matrices.ranks and seen.last_step[2] == 7
    assert np.isnan(matrices.ms[matrices.index("bwd")]).all()
    assert np.isnan(matrices.ms[matrices.index("fwd")][:, 1]).all()


def test_a_run_whose_only_rank_has_only_errored_records_agrees(tmp_path: Path) -> None:
    write(tmp_path, 0, [line(0, s, "fwd", error=True) for s in range(3)])
    seen = agree(tmp_path)
    assert seen.matrices.ranks == [0]
    assert seen.matrices.steps == []


# -- attempts -----------------------------------------------------------------------------

ATTEMPT_PICKS = [None, 1, 2, 3]


def _restart_run(root: Path) -> None:
    """Attempt aaa ran steps 0-9 at 10 ms; bbb, a torchelastic restart, ran 6-11 at 30 ms."""
    for rank in range(2):
        first = [opening(rank, "aaa", EPOCH_NS, launcher="torchelastic", job="j", restart=0)]
        first += steps_of(rank, range(10), cpu_ms=10.0)
        second = [
            opening(rank, "bbb", EPOCH_NS + MINUTE_NS, launcher="torchelastic", job="j", restart=1)
        ]
        second += steps_of(rank, range(6, 12), cpu_ms=30.0)
        write(root, rank, first + second)


@pytest.mark.parametrize("attempt", ATTEMPT_PICKS)
def test_one_attempt_as_the_timer_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attempt: int | None
) -> None:
    for rank in range(3):
        write(tmp_path, rank, [opening(rank, "tok", EPOCH_NS + rank), *steps_of(rank, range(5))])
    with duckdb_only(monkeypatch):
        seen = assert_same(tmp_path, attempt=attempt)
    if attempt in (None, 1):
        assert isinstance(seen, Seen) and seen.attempts["count"] == 1
    else:
        assert isinstance(seen, ConfigError)


@pytest.mark.parametrize("job", [4000, 5000, 70_000])
def test_an_attempt_line_longer_than_the_first_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: int
) -> None:
    # The engine reads 4 KB of a file's start first, and up to 64 KB where its first line
    # goes on: a longer attempt line (a launcher's long job id) is read whole as before,
    # and one past 64 KB leaves the file to the line-by-line reader.
    for rank in range(2):
        first = opening(rank, "tok", EPOCH_NS, launcher="slurm", job="j" * job, restart=0)
        write(tmp_path, rank, [first, *steps_of(rank, range(4))])
    if job < 65536:
        with duckdb_only(monkeypatch):
            seen = agree(tmp_path)
    else:
        seen = agree(tmp_path)
    assert seen.attempts["count"] == 1


@pytest.mark.parametrize("time", ["host", "device"])
@pytest.mark.parametrize("attempt", ATTEMPT_PICKS)
def test_a_restart_in_one_file(tmp_path: Path, time: str, attempt: int | None) -> None:
    _restart_run(tmp_path)
    seen = assert_same(tmp_path, time, attempt)
    if attempt == 3:
        assert isinstance(seen, ConfigError)
        return
    assert isinstance(seen, Seen)
    assert seen.attempts["count"] == 2
    if attempt is None:
        assert seen.attempts["rerun_steps"] == "6-9"


def _timed(rank: int, steps: range, since_ns: int, cpu_ms: float) -> list[str]:
    """Records as a process started at `since_ns` writes them: each after its start."""
    at = [since_ns + 1_000_000 + s * 10_000_000 for s in steps]
    return [
        line(rank, s, "fwd", cpu_ms=cpu_ms, start_ns=t) for s, t in zip(steps, at, strict=True)
    ] + [
        line(rank, s, "step", kind="step", cpu_ms=4.0, start_ns=t)
        for s, t in zip(steps, at, strict=True)
    ]


def _timed_restart(root: Path, second_ns: int, older: bool = False) -> None:
    """Attempt a (at EPOCH_NS) ran steps 0-9 at 10 ms, b (at `second_ns`) 6-11 at 30 ms;
    `older`: records of an older rankscope (no attempt line) ran steps 0-2 before both."""
    for rank in range(3):
        lines = _timed(rank, range(3), EPOCH_NS - 10 * MINUTE_NS, 1.0) if older else []
        lines += [opening(rank, f"a{rank}", EPOCH_NS), *_timed(rank, range(10), EPOCH_NS, 10.0)]
        lines += [
            opening(rank, f"b{rank}", second_ns),
            *_timed(rank, range(6, 12), second_ns, 30.0),
        ]
        write(root, rank, lines)


@pytest.mark.parametrize("older", [False, True])
@pytest.mark.parametrize("attempt", ATTEMPT_PICKS)
def test_a_restart_whose_clock_agrees_with_its_file(
    tmp_path: Path, attempt: int | None, older: bool
) -> None:
    _timed_restart(tmp_path, EPOCH_NS + MINUTE_NS, older)
    seen = assert_same(tmp_path, attempt=attempt)
    count = 3 if older else 2
    if attempt is not None and attempt > count:
        assert isinstance(seen, ConfigError)
        return
    assert isinstance(seen, Seen) and seen.attempts["count"] == count
    if attempt is None:
        assert seen.attempts["rerun_steps"] == ("0-2, 6-9" if older else "6-9")
        fwd = seen.matrices.ms[seen.matrices.phases.index("fwd")]
        assert np.all(fwd[:, 6:] == 30.0) and np.all(fwd[:, 3:6] == 10.0)


def test_a_clock_set_back_across_a_restart_is_read_by_its_lines_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # b's clock reads 50 ms after a's start: by the clock, a's later records would be b's;
    # by the order of the file's lines they are a's, and so they are read.
    _timed_restart(tmp_path, EPOCH_NS + 50_000_000)
    read: list[Path] = []
    real = _engine.read_rank_timings

    def counted(path: Path) -> Any:
        read.append(path)
        return real(path)

    monkeypatch.setattr(_engine, "read_rank_timings", counted)
    for attempt in (None, 1, 2):
        seen = agree(tmp_path, attempt=attempt)
        assert seen.attempts["count"] == 2
    assert sorted({p.name for p in read}) == [f"rank-{r:05d}.jsonl" for r in range(3)]


@pytest.mark.parametrize("attempt", ATTEMPT_PICKS)
def test_records_before_the_first_attempt_line(tmp_path: Path, attempt: int | None) -> None:
    for rank in range(2):
        old = steps_of(rank, range(4), cpu_ms=2.0)
        new = [
            opening(rank, "new", EPOCH_NS + 100 * MINUTE_NS),
            *steps_of(rank, range(2, 6), cpu_ms=7.0),
        ]
        write(tmp_path, rank, old + new)
    seen = assert_same(tmp_path, attempt=attempt)
    if attempt != 3:
        assert isinstance(seen, Seen) and seen.attempts["count"] == 2


@pytest.mark.parametrize("attempt", ATTEMPT_PICKS)
def test_the_same_token_twice_is_one_attempt(tmp_path: Path, attempt: int | None) -> None:
    for rank in range(2):
        lines = [opening(rank, "same", EPOCH_NS), *steps_of(rank, range(3))]
        lines += [opening(rank, "same", EPOCH_NS), *steps_of(rank, range(3, 6))]
        write(tmp_path, rank, lines)
    seen = assert_same(tmp_path, attempt=attempt)
    if attempt in (None, 1):
        assert isinstance(seen, Seen) and seen.attempts["count"] == 1
        assert seen.matrices.steps == list(range(6))


@pytest.mark.parametrize("attempt", ATTEMPT_PICKS)
def test_ranks_that_saw_different_attempts(tmp_path: Path, attempt: int | None) -> None:
    # Rank 0 ran in both attempts, rank 1 only in the first, rank 2 only in the second
    # (started an hour later: a new launch), rank 3 wrote no attempt line at all.
    write(
        tmp_path,
        0,
        [
            opening(0, "a0", EPOCH_NS),
            *steps_of(0, range(4)),
            opening(0, "b0", EPOCH_NS + 60 * MINUTE_NS),
            *steps_of(0, range(4), cpu_ms=3.0),
        ],
    )
    write(tmp_path, 1, [opening(1, "a1", EPOCH_NS + 5), *steps_of(1, range(4))])
    write(
        tmp_path,
        2,
        [opening(2, "b2", EPOCH_NS + 60 * MINUTE_NS + 7), *steps_of(2, range(4), cpu_ms=3.0)],
    )
    write(tmp_path, 3, steps_of(3, range(4), cpu_ms=0.5))
    seen = assert_same(tmp_path, attempt=attempt)
    if attempt is not None and attempt <= 3:
        assert isinstance(seen, Seen) and seen.attempts["used"] == attempt


BAD_OPENINGS = {
    "no-token": '{"v":1,"rank":0,"started_ns":5,"pid":1}',
    "empty-token": '{"v":1,"rank":0,"attempt":"","started_ns":5}',
    "token-not-a-string": '{"v":1,"rank":0,"attempt":5,"started_ns":5}',
    "started-not-an-int": '{"v":1,"rank":0,"attempt":"tok","started_ns":"x"}',
    "started-negative": '{"v":1,"rank":0,"attempt":"tok","started_ns":-1}',
    "of-another-rank": '{"v":1,"rank":1,"attempt":"tok","started_ns":5}',
    "rank-as-string": '{"v":1,"rank":"0","attempt":"tok","started_ns":5}',
    "version-2": '{"v":2,"rank":0,"attempt":"tok","started_ns":5}',
    "with-step-null": '{"v":1,"rank":0,"attempt":"tok","started_ns":5,"step":null}',
    "with-phase": '{"v":1,"rank":0,"attempt":"tok","phase":"fwd"}',
    "not-json": '{"v":1,"rank":0,"attempt":"tok",',
}


@pytest.mark.parametrize("where", ["first", "middle"])
@pytest.mark.parametrize("bad", list(BAD_OPENINGS), ids=list(BAD_OPENINGS))
def test_a_bad_attempt_line(tmp_path: Path, bad: str, where: str) -> None:
    body = steps_of(0, range(4))
    lines = (
        [BAD_OPENINGS[bad], *body]
        if where == "first"
        else [*body[:3], BAD_OPENINGS[bad], *body[3:]]
    )
    write(tmp_path, 0, lines)
    write(tmp_path, 1, [opening(1, "tok", 5), *steps_of(1, range(4))])
    for attempt in (None, 1, 2):
        assert_same(tmp_path, attempt=attempt)


# -- bad lines ----------------------------------------------------------------------------

# (what the odd line is, the line (rank 0, step 7), what the reference makes of it:
# USED, a record of step 7; KEPT, read but not at step 7 or errored; SKIPPED, said)
ODD = 7
USED, KEPT, SKIPPED = "used", "kept", "skipped"
BAD_LINES: list[tuple[str, str, str]] = [
    ("not-json", "this is not json", SKIPPED),
    ("empty-object", "{}", SKIPPED),
    ("a-json-array", "[1, 2]", SKIPPED),
    ("a-json-number", "5", SKIPPED),
    ("a-json-string", '"fwd"', SKIPPED),
    ("json-null", "null", SKIPPED),
    ("two-objects-on-a-line", line(0, ODD) + line(0, ODD + 1), SKIPPED),
    ("an-object-split-over-two-lines", line(0, ODD)[:40] + "\n" + line(0, ODD)[40:], SKIPPED),
    ("a-comment", line(0, ODD) + " // note", SKIPPED),
    ("single-quotes", line(0, ODD, raw={"phase": "'fwd'"}), SKIPPED),
    ("leading-zero", line(0, ODD, raw={"cpu_ms": "01"}), SKIPPED),
    ("a-nul-after-the-object", line(0, ODD) + "\x00", SKIPPED),
    ("a-raw-tab-in-a-name", line(0, ODD, raw={"phase": '"f\tw"'}), SKIPPED),
    ("nested-meta", line(0, ODD, extra=[('"meta"', '{"tokens":3,"a":[1,{"b":null}]}')]), USED),
    ("step-1.5", line(0, ODD, raw={"step": "1.5"}), SKIPPED),
    ("step-7.0", line(0, ODD, raw={"step": "7.0"}), SKIPPED),
    ("step-7e0", line(0, ODD, raw={"step": "7e0"}), SKIPPED),
    ("step-true", line(0, ODD, raw={"step": "true"}), SKIPPED),
    ("step-string", line(0, ODD, raw={"step": '"7"'}), SKIPPED),
    ("step-negative", line(0, ODD, raw={"step": "-7"}), SKIPPED),
    ("step-null", line(0, ODD, raw={"step": "null"}), SKIPPED),
    ("step-2**63-1", line(0, ODD, raw={"step": str(2**63 - 1)}), KEPT),
    ("step-2**63", line(0, ODD, raw={"step": str(2**63)}), SKIPPED),
    ("step-2**64", line(0, ODD, raw={"step": str(2**64)}), SKIPPED),
    ("step-10**30", line(0, ODD, raw={"step": str(10**30)}), SKIPPED),
    ("start-2**63", line(0, ODD, raw={"start_ns": str(2**63)}), SKIPPED),
    ("start-2**64", line(0, ODD, raw={"start_ns": str(2**64)}), SKIPPED),
    ("depth-2**64", line(0, ODD, raw={"depth": str(2**64)}), SKIPPED),
    ("rank-string", line(0, ODD, raw={"rank": '"0"'}), SKIPPED),
    ("rank-true", line(0, ODD, raw={"rank": "false"}), SKIPPED),
    ("rank-0.0", line(0, ODD, raw={"rank": "0.0"}), USED),
    ("rank-missing", line(0, ODD, raw={"rank": DROP}), SKIPPED),
    ("another-ranks-record", line(1, ODD), SKIPPED),
    ("phase-number", line(0, ODD, raw={"phase": "5"}), SKIPPED),
    ("phase-null", line(0, ODD, raw={"phase": "null"}), SKIPPED),
    ("phase-object", line(0, ODD, raw={"phase": '{"a":1}'}), SKIPPED),
    ("kind-missing", line(0, ODD, raw={"kind": DROP}), SKIPPED),
    ("kind-list", line(0, ODD, raw={"kind": '["compute"]'}), SKIPPED),
    ("cpu-string", line(0, ODD, raw={"cpu_ms": '"1.5"'}), SKIPPED),
    ("cpu-true", line(0, ODD, raw={"cpu_ms": "true"}), SKIPPED),
    ("cpu-1e400", line(0, ODD, raw={"cpu_ms": "1e400"}), SKIPPED),
    ("cpu-just-past-double", line(0, ODD, raw={"cpu_ms": "1.7976931348623159e308"}), SKIPPED),
    # Past a week (read/_timings.py MAX_MS) a number is no phase's time.
    ("cpu-largest-double", line(0, ODD, raw={"cpu_ms": "1.7976931348623157e308"}), SKIPPED),
    ("cpu-400-digits", line(0, ODD, raw={"cpu_ms": "9" * 400}), SKIPPED),
    ("cpu-2**64", line(0, ODD, raw={"cpu_ms": str(2**64)}), SKIPPED),
    ("cpu-2**53+1", line(0, ODD, raw={"cpu_ms": str(2**53 + 1)}), SKIPPED),
    ("cpu-a-week", line(0, ODD, raw={"cpu_ms": "604800000"}), USED),
    ("cpu-past-a-week", line(0, ODD, raw={"cpu_ms": "604800000.5"}), SKIPPED),
    ("cpu-subnormal", line(0, ODD, raw={"cpu_ms": "3e-324"}), USED),
    ("cpu-underflow", line(0, ODD, raw={"cpu_ms": "-1e-400"}), USED),
    ("cpu-minus-zero", line(0, ODD, raw={"cpu_ms": "-0.0"}), USED),
    ("cpu-negative", line(0, ODD, raw={"cpu_ms": "-0.5"}), SKIPPED),
    ("cpu-NaN", line(0, ODD, raw={"cpu_ms": "NaN"}), SKIPPED),
    ("cpu-Infinity", line(0, ODD, raw={"cpu_ms": "Infinity"}), SKIPPED),
    ("cpu-int", line(0, ODD, raw={"cpu_ms": "2"}), USED),
    ("cpu-exponent", line(0, ODD, raw={"cpu_ms": "1.5E+1"}), USED),
    ("cpu-missing", line(0, ODD, raw={"cpu_ms": DROP}), SKIPPED),
    ("gpu-string", line(0, ODD, raw={"gpu_ms": '"x"'}), SKIPPED),
    ("gpu-NaN", line(0, ODD, raw={"gpu_ms": "NaN"}), SKIPPED),
    ("gpu-negative", line(0, ODD, raw={"gpu_ms": "-1"}), SKIPPED),
    ("gpu-missing", line(0, ODD, raw={"gpu_ms": DROP}), USED),
    ("gpu-a-time", line(0, ODD, raw={"gpu_ms": "0.25"}), USED),
    ("depth-null", line(0, ODD, raw={"depth": "null"}), SKIPPED),
    ("depth-missing", line(0, ODD, raw={"depth": DROP}), USED),
    ("depth-1.0", line(0, ODD, raw={"depth": "1.0"}), SKIPPED),
    ("error-string-true", line(0, ODD, raw={"error": '"true"'}), USED),
    ("error-1", line(0, ODD, raw={"error": "1"}), USED),
    ("error-null", line(0, ODD, raw={"error": "null"}), USED),
    ("error-missing", line(0, ODD, raw={"error": DROP}), USED),
    ("v-2", line(0, ODD, raw={"v": "2"}), SKIPPED),
    ("v-string-1", line(0, ODD, raw={"v": '"1"'}), SKIPPED),
    ("v-1.0", line(0, ODD, raw={"v": "1.0"}), USED),
    ("v-true", line(0, ODD, raw={"v": "true"}), USED),
    ("v-missing", line(0, ODD, raw={"v": DROP}), USED),
    (
        "extra-keys",
        line(0, ODD, extra=[('"thread"', '"main"'), ('"dropped"', "3"), ('"x"', "NaN")]),
        USED,
    ),
    ("an-empty-key", line(0, ODD, extra=[('""', "1")]), USED),
    ("a-record-naming-its-attempt", line(0, ODD, extra=[('"attempt"', '"zzz"')]), USED),
    ("escaped-key-v-2", line(0, ODD, raw={"v": DROP}, extra=[('"\\u0076"', "2")]), SKIPPED),
    (
        "escaped-key-step",
        line(0, ODD, raw={"step": DROP}, extra=[('"st\\u0065p"', str(ODD))]),
        USED,
    ),
    ("crlf", line(0, ODD) + "\r", USED),
    ("surrounding-blanks", "  \t" + line(0, ODD) + "  ", USED),
    ("a-vertical-tab-first", "\x0b" + line(0, ODD), USED),
    ("a-bom-first", "\ufeff" + line(0, ODD), USED),
    ("a-lone-surrogate-name", line(0, ODD, raw={"phase": '"fwd\\udce9"'}), USED),
    ("a-nul-in-a-name", line(0, ODD, raw={"phase": '"f\\u0000w"'}), USED),
    ("a-bad-escape", line(0, ODD, raw={"phase": '"f\\xw"'}), SKIPPED),
]


# Lines Python's json refuses, or reads another way, that DuckDB reads as the line beside
# them (docs/analysis.md, "Readers"): the engine takes them as DuckDB reads them, and
# its figures are those of a run holding that line instead.
LENIENT_LINES: list[tuple[str, str, str]] = [
    ("trailing-comma", line(0, ODD)[:-1] + ",}", line(0, ODD)),
    (
        "trailing-comma-in-an-array",
        line(0, ODD, extra=[('"meta"', "[1,2,]")]),
        line(0, ODD, extra=[('"meta"', "[1,2]")]),
    ),
    (
        "nested-too-deep-for-json",
        line(0, ODD, extra=[('"meta"', "[" * 5000 + "]" * 5000)]),
        line(0, ODD, extra=[('"meta"', "[]")]),
    ),
    ("v-null", line(0, ODD, raw={"v": "null"}), line(0, ODD, raw={"v": DROP})),
    # A key given twice: DuckDB keeps the first value, json the last.
    ("duplicate-step", line(0, 9, extra=[('"step"', str(ODD))]), line(0, 9)),
    ("duplicate-error", line(0, ODD, extra=[('"error"', "true")]), line(0, ODD)),
    ("duplicate-gpu", line(0, ODD, extra=[('"gpu_ms"', '"x"')]), line(0, ODD)),
    ("duplicate-v", line(0, ODD, extra=[('"v"', "2")]), line(0, ODD)),
    ("duplicate-rank", line(0, ODD, extra=[('"rank"', "1")]), line(0, ODD)),
    ("duplicate-phase", line(0, ODD, extra=[('"phase"', '"other"')]), line(0, ODD)),
    ("escaped-duplicate-error", line(0, ODD, extra=[('"\\u0065rror"', "true")]), line(0, ODD)),
]


@pytest.mark.parametrize(
    ("odd", "as_read"), [(o, r) for _, o, r in LENIENT_LINES], ids=[n for n, _, _ in LENIENT_LINES]
)
def test_a_line_duckdb_reads_leniently_is_read_as_the_line_it_means(
    tmp_path: Path, odd: str, as_read: str
) -> None:
    _odd_run(tmp_path / "odd", odd)
    _odd_run(tmp_path / "plain", as_read)
    for time in ("host", "device"):
        eng = engine(tmp_path / "odd", time)
        plain = reference(tmp_path / "plain", time)
        assert isinstance(eng, Seen) and isinstance(plain, Seen)
        assert_same_matrices(plain.matrices, eng.matrices)
        assert eng.skipped == plain.skipped == []


def _odd_run(root: Path, odd: str, *, where: str = "middle", end: str = "\n") -> None:
    body = [line(0, s, cpu_ms=1.0 + s, gpu_ms=0.5) for s in range(4)]
    body += [line(0, s, "step", kind="step", cpu_ms=9.0, gpu_ms=8.0) for s in range(4)]
    lines = (
        [odd, *body]
        if where == "first"
        else [*body, odd]
        if where == "last"
        else [*body[:4], odd, *body[4:]]
    )
    write(root, 0, lines, end=end)
    write(root, 1, steps_of(1, range(4)))


@pytest.mark.parametrize(
    ("odd", "made"), [(o, m) for _, o, m in BAD_LINES], ids=[n for n, _, _ in BAD_LINES]
)
def test_an_odd_line(tmp_path: Path, odd: str, made: str) -> None:
    _odd_run(tmp_path, odd)
    for time in ("host", "device"):
        seen = agree(tmp_path, time)
        rank0 = seen.matrices.ranks.index(0)
        ran = (
            ODD in seen.matrices.steps
            and not np.isnan(
                np.stack([m[rank0, seen.matrices.steps.index(ODD)] for m in seen.matrices.start_ns])
            ).all()
        )
        said = any("rank-00000.jsonl" in s for s in seen.skipped)
        assert (said, ran) == {USED: (False, True), KEPT: (False, False), SKIPPED: (True, False)}[
            made
        ], seen.skipped


@pytest.mark.parametrize("where", ["first", "last"])
@pytest.mark.parametrize(
    ("odd", "made"),
    [
        (o, m)
        for n, o, m in BAD_LINES
        if n
        in (
            "not-json",
            "cpu-NaN",
            "another-ranks-record",
        )
    ],
)
def test_an_odd_line_first_or_last(tmp_path: Path, odd: str, made: str, where: str) -> None:
    _odd_run(tmp_path, odd, where=where)
    seen = agree(tmp_path)
    assert any("rank-00000.jsonl" in s for s in seen.skipped) == (made == SKIPPED)


def test_a_torn_last_line(tmp_path: Path) -> None:
    _odd_run(tmp_path, line(0, ODD)[:33], where="last", end="")
    seen = agree(tmp_path)
    assert any("cut short" in s for s in seen.skipped)


def test_a_whole_last_line_without_its_newline(tmp_path: Path) -> None:
    _odd_run(tmp_path, line(0, ODD), where="last", end="")
    seen = agree(tmp_path)
    assert any("cut short" in s for s in seen.skipped)  # the reader cannot know it is whole
    assert ODD not in seen.matrices.steps


def test_blank_lines_are_passed_over_alike(tmp_path: Path) -> None:
    lines = ["", *steps_of(0, range(3)), "", "   ", "\t", *steps_of(0, range(3, 5)), ""]
    write(tmp_path, 0, lines)
    write(tmp_path, 1, ["", "", ""])
    seen = agree(tmp_path)
    assert seen.matrices.steps == list(range(5))
    assert any("rank-00001.jsonl: no records" in s for s in seen.skipped)


def test_an_empty_file_and_a_file_of_an_attempt_line_alone(tmp_path: Path) -> None:
    write(tmp_path, 0, steps_of(0, range(3)))
    write(tmp_path, 1, [])
    write(tmp_path, 2, [opening(2, "tok")])
    seen = agree(tmp_path)
    assert seen.matrices.ranks == [0]
    assert sum("no records" in s for s in seen.skipped) == 2


def test_invalid_utf8_in_a_line(tmp_path: Path) -> None:
    path = write(tmp_path, 0, steps_of(0, range(3)))
    path.write_bytes(path.read_bytes() + line(0, ODD).encode().replace(b"fwd", b"f\xffw") + b"\n")
    write(tmp_path, 1, steps_of(1, range(3)))
    seen = agree(tmp_path)
    assert any("rank-00000.jsonl:7:" in s for s in seen.skipped)


def test_two_files_claiming_one_rank_and_misnamed_files(tmp_path: Path) -> None:
    write(tmp_path, 3, steps_of(3, range(3)))
    write(tmp_path, "rank-3.jsonl", steps_of(3, range(3), cpu_ms=9.0))
    write(tmp_path, 5, steps_of(5, range(3)))
    write(tmp_path, "rank-005.jsonl", ["not json", *steps_of(5, range(3))])
    write(tmp_path, "rank-x.jsonl", steps_of(0, range(3)))
    write(tmp_path, "rank-00007a.jsonl", steps_of(7, range(3)))
    write(tmp_path, 1, steps_of(1, range(3)))
    seen = agree(tmp_path)
    assert seen.matrices.ranks == [1]
    assert sum("is claimed by 2 files" in s for s in seen.skipped) == 2
    assert sum("not a timings file" in s for s in seen.skipped) == 2


def test_a_rank_of_records_of_another_rank_only(tmp_path: Path) -> None:
    write(tmp_path, 0, steps_of(1, range(3)))
    write(tmp_path, 1, steps_of(1, range(3)))
    seen = agree(tmp_path)
    assert seen.matrices.ranks == [1]


# -- names --------------------------------------------------------------------------------

NAMES = {
    "ascii-escaped-accent": json.dumps("fwd\u00e9"),
    "raw-utf8-accent": json.dumps("fwd\u00e9", ensure_ascii=False),
    "quote": json.dumps('a"b'),
    "backslash": json.dumps("a\\b"),
    "slash-escaped": '"a\\/b"',
    "emoji-pair": json.dumps("\U0001f600"),
    "line-separator": json.dumps("a\u2028b", ensure_ascii=False),
    "empty": '""',
}


@pytest.mark.parametrize("text", list(NAMES.values()), ids=list(NAMES))
def test_unicode_and_escaped_names(tmp_path: Path, text: str) -> None:
    for rank in range(2):
        lines = [line(rank, s, raw={"phase": text, "kind": text}) for s in range(3)]
        write(tmp_path, rank, lines + [line(rank, s, "step", kind="step") for s in range(3)])
    seen = agree(tmp_path)
    assert json.loads(text) in seen.matrices.phases


def test_names_that_differ_only_by_escaping_are_one_phase(tmp_path: Path) -> None:
    # "z", "\u007a" and "\u007A" are one name. Rank 0 records phase z of kind "x" in three
    # spellings; ranks 1 and 2 record it as kind "y": each rank votes once, so "y" wins.
    spellings = ['"z"', '"\\u007a"', '"\\u007A"']
    write(
        tmp_path,
        0,
        [line(0, s, raw={"phase": spelling}, kind="x") for s, spelling in enumerate(spellings)],
    )
    for rank in (1, 2):
        write(tmp_path, rank, [line(rank, s, "z", kind="y") for s in range(3)])
    seen = agree(tmp_path)
    assert seen.matrices.phases == ["z"]
    assert seen.matrices.kinds == ["y"]


def test_kinds_that_differ_only_by_escaping_are_one_kind(tmp_path: Path) -> None:
    write(tmp_path, 0, [line(0, 0, kind="x"), line(0, 1, raw={"kind": '"\\u0078"'})])
    write(tmp_path, 1, [line(1, 0, kind="y"), line(1, 1, kind="y")])
    write(tmp_path, 2, [line(2, 0, kind="y")])
    seen = agree(tmp_path)
    assert seen.matrices.kinds == ["y"]


# -- errors -------------------------------------------------------------------------------


def test_errors_are_the_same(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    (empty / "timings").mkdir(parents=True)
    assert isinstance(assert_same(empty), TraceError)
    assert isinstance(assert_same(tmp_path / "missing"), TraceError)
    bad = tmp_path / "bad"
    write(bad, 0, ["not json", "{}"])
    write(bad, 1, [])
    write(bad, "rank-y.jsonl", steps_of(0, range(2)))
    assert isinstance(assert_same(bad), TraceError)
    good = tmp_path / "good"
    write(good, 0, steps_of(0, range(2)))
    for attempt in (0, -1, 2):
        assert isinstance(assert_same(good, attempt=attempt), ConfigError)
    assert isinstance(assert_same(good, attempt=True), ConfigError)
    assert isinstance(assert_same(good, time="gpu"), ConfigError)


def test_a_bad_time_base_on_a_run_that_cannot_be_read(tmp_path: Path) -> None:
    # The reference reads first and checks `time` after; the engine checks its arguments
    # before it reads anything. Each names what is wrong.
    assert isinstance(reference(tmp_path / "missing", time="gpu"), TraceError)
    said = engine(tmp_path / "missing", time="gpu")
    assert isinstance(said, ConfigError) and "time='gpu'" in str(said)


# -- random runs --------------------------------------------------------------------------

PHASE_TEXTS = ['"fwd"', '"bwd"', '"\\u0066wd"', json.dumps("\u00e9t\u00e9"), '"a\\"b"', '"step"']
KIND_TEXTS = ['"compute"', '"comm"', '"\\u0063omm"', '"step"']
CPU_TEXTS = ["0.1", "0.2", "3.0", "0.3", "1e16", "2", "-0.0", "1.7976931348623157e308", "5e-324"]
ODD_TEXTS = [odd for _, odd, _ in BAD_LINES]
TOKENS = ["aaa", "bbb", "ccc"]
STARTS = [EPOCH_NS, EPOCH_NS + 1, EPOCH_NS + 20 * MINUTE_NS, EPOCH_NS + 90 * MINUTE_NS]


@st.composite
def records(draw: st.DrawFn, rank: int) -> str:
    step = draw(st.integers(0, 4))
    cpu = draw(st.sampled_from(CPU_TEXTS) | st.floats(0, 1e6).map(repr))
    gpu = draw(st.none() | st.sampled_from(["0.5", "7.25", "0"]) | st.floats(0, 1e3).map(repr))
    raw = {
        "phase": draw(st.sampled_from(PHASE_TEXTS)),
        "kind": draw(st.sampled_from(KIND_TEXTS)),
        "cpu_ms": cpu,
        "gpu_ms": "null" if gpu is None else gpu,
        "depth": str(draw(st.integers(0, 2))),
    }
    start = EPOCH_NS + step * 10_000_000 + draw(st.integers(0, 10**6))
    return line(rank, step, error=draw(st.booleans()), start_ns=start, raw=raw)


def odd_lines(rank: int) -> st.SearchStrategy[str]:
    """A line that is not one of `rank`'s records: an attempt line, a bad line, a blank
    line, another rank's record."""
    openings = st.builds(
        lambda token, started: opening(rank, token, started),
        st.sampled_from(TOKENS),
        st.sampled_from(STARTS),
    )
    others = st.sampled_from(ODD_TEXTS).map(lambda odd: odd.replace('"rank":0', f'"rank":{rank}'))
    return st.one_of(openings, others, others, st.just(""), st.just(line(rank + 1, 0)))


@st.composite
def files(draw: st.DrawFn, rank: int) -> tuple[list[str], str]:
    """(lines, how the file ends): records, a few odd lines among them (none in many
    files, so that DuckDB reads those whole), perhaps an attempt line first."""
    lines = draw(st.lists(records(rank), max_size=8))
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        lines.insert(draw(st.integers(0, len(lines))), draw(odd_lines(rank)))
    if draw(st.booleans()):
        lines.insert(0, opening(rank, draw(st.sampled_from(TOKENS)), draw(st.sampled_from(STARTS))))
    end = draw(st.sampled_from(["\n", "\n", "\n", "\n", "", '{"v":1,"rank"']))
    return lines, end


@st.composite
def runs(draw: st.DrawFn) -> dict[str, tuple[list[str], str]]:
    """File name -> (lines, how the file ends)."""
    out = {f"rank-{rank:05d}.jsonl": draw(files(rank)) for rank in range(draw(st.integers(1, 3)))}
    extra = draw(st.sampled_from([None, None, None, None, "rank-0.jsonl", "rank-x.jsonl"]))
    if extra is not None:
        out[extra] = draw(files(0))
    return out


@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(run=runs(), attempt=st.sampled_from([None, None, 1, 2]))
def test_random_runs_agree(run: dict[str, tuple[list[str], str]], attempt: int | None) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "timings").mkdir()
        for name, (lines, end) in run.items():
            write(root, name, lines, end=end)
        for time in ("host", "device"):
            assert_same(root, time, attempt)


# -- what a phase says of the collectives it issued ("coll") ------------------------------


def _counted(rank: int, step: int, phase: str, coll: str | None, *, fast: bool = True) -> str:
    """A record with its count; not `fast`: a thread key before it, a layout the timer's
    own pattern does not take (the reader's line-by-line path)."""
    extra = [] if fast else [('"thread"', '"loader"')]
    extra += [] if coll is None else [('"coll"', coll)]
    return line(rank, step, phase, raw={"error": "false"}, extra=extra)


@pytest.mark.parametrize("fast", [True, False], ids=["timer-layout", "line-by-line"])
def test_the_collectives_a_phase_issued_are_read_alike(
    tmp_path: Path, fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """backward issued one at every step (DDP), forward at one step in four (no majority),
    data none, and optimizer's records do not say: both readers agree, and only what the
    records say is known. A count that is not one (a string, a fraction, a negative, a
    boolean, past an int64) is no count; the record stands."""
    for rank in range(3):
        lines = [opening(rank, "tok")]
        for step in range(8):
            lines += [
                _counted(rank, step, "data", "0", fast=fast),
                _counted(rank, step, "forward", "2" if step % 4 == 0 else "0", fast=fast),
                _counted(rank, step, "backward", "1", fast=fast),
                _counted(rank, step, "optimizer", None, fast=fast),
                line(rank, step, "step", kind="step", cpu_ms=9.0),
            ]
        if not fast:  # the timer's own pattern takes no such line: the whole file is slow
            lines += [
                _counted(rank, 9, "optimizer", bad, fast=fast)
                for bad in ('"1"', "1.5", "-1", "true", "99999999999999999999")
            ]
        write(tmp_path, rank, lines)
    with duckdb_only(monkeypatch):
        seen = agree(tmp_path)
    assert seen.matrices.issued == {"data": False, "forward": False, "backward": True}
    assert "optimizer" in seen.matrices.phases
