"""Bad input, one file at a time: a run directory is built once, copied per case, one of
its files corrupted, and both the library and the CLI must say which file and what is
wrong in one line; skip it where the rest is usable, exit 2 where nothing is; never a
traceback, a hang or a figure that silently changed.

Timings and meta files are another module's cases (test_timings_reader.py); here they
only must not hang a reader.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rankscope import ConfigError, TraceError
from rankscope.analysis import KernelOptions, build_report, kernel_report, merge_traces
from rankscope.cli import main
from rankscope.rundir._layout import memory_path, nsys_path, summary_of, timing_path, trace_path
from rankscope.rundir._listing import RunDir
from rankscope.testing._synthetic import write_timings
from rankscope.testing._synthetic_traces import write_run_traces, write_trace
from rankscope.traces._kineto import summarize_trace

from .._helpers import within

pytestmark = pytest.mark.slow

WINDOW = "step-000003-000004"
RANKS = 4
BAD_DUR = "a bad dur (not a number from 0 to 1e15 us) left out"


# -- the run, and what it says when sound ---------------------------------------------


def _write_summary(trace: Path) -> None:
    """The summary capture writes beside a trace."""
    summary = summary_of(trace)
    assert summary is not None
    summary.write_text(json.dumps(summarize_trace(trace, window=trace.parent.name)))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pristine")
    write_timings(root, ranks=RANKS, steps=12)
    for truth in write_run_traces(root, WINDOW, range(RANKS), world_size=RANKS, size_bytes=40_000):
        _write_summary(truth.path)
    return root


@pytest.fixture(scope="module")
def good(pristine: Path) -> dict[int, float]:
    """Each rank's kernel time in the sound run."""
    report = kernel_report([pristine])
    assert report.skipped == []
    return {t["rank"]: t["total_us"] for t in report.traces}


@pytest.fixture
def run(pristine: Path, tmp_path: Path) -> Path:
    """A copy of the sound run (its mtimes kept: the summaries stay current)."""
    root = tmp_path / "run"
    shutil.copytree(pristine, root, symlinks=True)
    return root


def _trace(run: Path, rank: int) -> Path:
    return trace_path(run, WINDOW, rank, gzip=True)


def _summary(run: Path, rank: int) -> Path:
    summary = summary_of(_trace(run, rank))
    assert summary is not None
    return summary


def _edit_trace(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite a trace after `edit` changed its document (its summary is now stale)."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    edit(doc)
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


def _replace(path: Path, make: Callable[[Path], Any]) -> None:
    """Put something else at `path`'s name."""
    path.unlink()
    make(path)


def _linked(path: Path, name: str, link: Callable[[Path, Path], Any]) -> Path:
    """A second name beside `path` for the same file."""
    other = path.with_name(name)
    link(other, path)
    return other


def _kernels_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]


# -- running it: the library and the CLI under a hang guard ----------------------------


def _cli(*argv: object, timeout: float = 60) -> tuple[int, str, str]:
    """`rankscope ARGV` in this process (a process each cost 0.4 s of imports, 56 times)."""
    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return main([str(a) for a in argv])

    code = within(run, timeout)  # a traceback fails the test here
    assert "Traceback" not in err.getvalue(), err.getvalue()
    return code, out.getvalue(), err.getvalue()


def _strict(text: str) -> Any:
    """Parse --json output, refusing NaN and Infinity: --json is strict JSON."""

    def refuse(word: str) -> None:
        raise AssertionError(f"{word} in --json output")

    return json.loads(text, parse_constant=refuse)


def _one_line(err: str, command: str) -> str:
    line = err.strip()
    assert "\n" not in line and line.startswith(f"rankscope {command}: "), err
    return line


def _totals(report: Any) -> dict[int, float]:
    return {t["rank"]: t["total_us"] for t in report.traces}


def _check_kernels(run: Path, said: str, good: dict[int, float], ranks: dict[int, float]) -> None:
    """kernel_report and `kernels --json` skip with `said` alone and sum `ranks` as given;
    `report` says it too, and shows the same ranks."""
    report = within(lambda: kernel_report([run]))
    assert report.skipped == [said]
    assert _totals(report) == pytest.approx(ranks)  # the other ranks' figures as they were
    code, out, err = _cli("kernels", run, "--json")
    assert code == 0, err
    data = _strict(out)
    assert data["skipped"] == [said]
    assert {t["rank"]: t["total_us"] for t in data["traces"]} == pytest.approx(ranks)
    code, out, err = _cli("report", run, "--json", "--no-html")
    assert code == 0, err
    data = _strict(out)
    assert said in data["skipped"]
    (window,) = data["kernels"]["windows"]
    assert window["ranks"] == sorted(ranks)


# -- trace content ----------------------------------------------------------------------


def _dur(value: Any, events: int = 1) -> Callable[[dict[str, Any]], float]:
    def edit(doc: dict[str, Any]) -> float:
        lost = 0.0
        for event in _kernels_of(doc)[:events]:
            lost += event["dur"]
            event["dur"] = value
        return lost

    return edit


@pytest.mark.parametrize(
    ("edit", "events"),
    [
        (_dur(10**400), 1),  # an int past any float: OverflowError before
        (_dur(float("inf")), 1),
        (_dur(float("nan")), 1),
        (_dur(-5.0), 1),
        (_dur("12"), 1),
        (_dur({"us": 3}), 1),
        (_dur(None, events=3), 3),
        (_dur(True), 1),
    ],
    ids=["huge-int", "infinity", "nan", "negative", "string", "object", "null", "bool"],
)
def test_an_event_with_a_bad_dur_is_left_out_and_counted(
    run: Path, good: dict[int, float], edit: Callable[[dict[str, Any]], float], events: int
) -> None:
    lost: list[float] = []
    _edit_trace(_trace(run, 1), lambda doc: lost.append(edit(doc)))
    plural = "events" if events > 1 else "event"
    said = f"{_trace(run, 1)}: {events} {plural} with {BAD_DUR}"
    _check_kernels(run, said, good, {**good, 1: good[1] - lost[0]})


def test_a_kernel_with_a_name_that_is_not_a_string_is_left_out_and_counted(
    run: Path, good: dict[int, float]
) -> None:
    lost: list[float] = []

    def edit(doc: dict[str, Any]) -> None:
        kernel = _kernels_of(doc)[0]
        kernel["name"] = ["not", "a", "name"]
        lost.append(kernel["dur"])

    _edit_trace(_trace(run, 1), edit)
    said = f"{_trace(run, 1)}: 1 event with a bad name (not a string) left out"
    _check_kernels(run, said, good, {**good, 1: good[1] - lost[0]})


def _gzip_length_lies(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-4:] = b"\xff\xff\xff\xff"  # ISIZE: a 4 GB claim
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("corrupt", "problem"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:300]), "truncated or corrupt gzip"),
        (lambda p: p.write_bytes(b"\x1f\x8b" + b"not gzip at all"), "truncated or corrupt gzip"),
        (_gzip_length_lies, "truncated or corrupt gzip (Incorrect length of data produced)"),
        (lambda p: p.write_bytes(b""), "not valid JSON (the file is empty)"),
        (lambda p: p.write_text("{not json"), "not valid JSON"),
        (lambda p: p.write_text('{"traceEvents": "none"}'), "not a trace (no traceEvents list)"),
        (
            lambda p: p.write_text('{"traceEvents": [{"ph": "X"}, 7]}'),
            "not a trace (event 2 is a number, not an object)",
        ),
        (
            lambda p: p.write_text('{"traceEvents": [{"dur": ' + "9" * 5000 + "}]}"),
            "not a trace (a number of thousands of digits)",
        ),
        (
            lambda p: p.write_text('{"traceEvents": [{"a": ' + "[" * 50_000 + "]" * 50_000 + "}]}"),
            "not a trace (values nested too deep)",
        ),
    ],
    ids=[
        "truncated-gzip",
        "gzip-magic-only",
        "gzip-size-claim",
        "empty",
        "not-json",
        "events-not-a-list",
        "event-not-an-object",
        "5000-digits",
        "nested-too-deep",
    ],
)
def test_a_trace_that_cannot_be_read_is_skipped_and_said(
    run: Path, good: dict[int, float], corrupt: Callable[[Path], None], problem: str
) -> None:
    trace = _trace(run, 1)
    corrupt(trace)
    report = within(lambda: kernel_report([run]))
    (said,) = report.skipped
    assert said.startswith(f"{trace}: {problem}")
    assert _totals(report) == {r: t for r, t in good.items() if r != 1}
    code, out, err = _cli("kernels", run, "--json")
    assert code == 0 and _strict(out)["skipped"] == [said], err
    code, out, err = _cli("merge", trace, _trace(run, 0), "-o", run / "m.json.gz")
    assert code == 2
    assert _one_line(err, "merge").startswith(f"rankscope merge: {trace}: {problem}")
    assert not (run / "m.json.gz").exists()


def test_only_bad_traces_is_exit_2_naming_each(run: Path) -> None:
    for rank in range(RANKS):
        _trace(run, rank).write_text("{not json")
    with pytest.raises(TraceError, match="no readable trace"):
        kernel_report([run])
    code, _, err = _cli("kernels", run)
    line = _one_line(err, "kernels")
    assert code == 2 and all(f"{_trace(run, r)}: not valid JSON" in line for r in range(RANKS))


# -- summaries: a bad one is said, and its trace read instead ---------------------------


def _edit_summary(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(summary: dict[str, Any]) -> None:
        if value is KeyError:
            del summary[key]
        else:
            summary[key] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (_edit_summary("items", "oops"), 'items is "oops", not a list'),
        (_edit_summary("kind", KeyError), "kind is null, not gpu_kernels or cpu_ops"),
        (_edit_summary("count", "7"), 'count is "7", not a whole number >= 0'),
        (_edit_summary("total_us", float("nan")), "total_us is NaN, not a time in us >= 0"),
        (_edit_summary("total_us", 1.0), "its items' times do not add up to its total_us"),
        (_edit_summary("rank", 0), "it says rank 0, its name rank 1"),
        (_edit_summary("categories", [7]), "categories[1] is 7, not an object"),
        (_edit_summary("v", "2"), "v is '2'"),
        (lambda s: s["items"][0].update(max_us=float("inf")), "items[1].max_us is Infinity"),
        (lambda s: s["items"][0].update(count=0), "items[1].count is 0, not a whole number >= 1"),
    ],
    ids=[
        "items-string",
        "no-kind",
        "count-string",
        "total-nan",
        "total-disagrees",
        "other-rank",
        "category-not-object",
        "version-string",
        "max-infinity",
        "count-zero",
    ],
)
def test_a_bad_summary_is_said_and_its_trace_read_instead(
    run: Path, good: dict[int, float], edit: Callable[[dict[str, Any]], None], problem: str
) -> None:
    summary = _summary(run, 1)
    data = json.loads(summary.read_text())
    edit(data)
    summary.write_text(json.dumps(data))
    report = within(lambda: kernel_report([run]))
    (said,) = report.skipped
    assert said.startswith(f"{summary}: not a usable summary ({problem}")
    assert said.endswith("; its trace was read instead")
    _check_kernels(run, said, good, good)


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda p: p.write_text("{torn"), "not valid JSON (JSONDecodeError)"),
        (lambda p: p.write_text("[1, 2]"), "not a usable summary (not a JSON object)"),
        (lambda p: _replace(p, os.mkfifo), "not a regular file (a FIFO)"),
        (lambda p: _replace(p, Path.mkdir), "not a regular file (a directory)"),
        (lambda p: _replace(p, lambda q: q.symlink_to(q.name)), "a symlink loop"),
    ],
    ids=["not-json", "a-list", "fifo", "directory", "symlink-loop"],
)
def test_a_summary_that_cannot_be_read_is_said_without_hanging(
    run: Path, good: dict[int, float], make: Callable[[Path], None], problem: str
) -> None:
    summary = _summary(run, 1)
    make(summary)
    _check_kernels(run, f"{summary}: {problem}; its trace was read instead", good, good)


def test_a_summary_of_another_version_is_read_again_silently(
    run: Path, good: dict[int, float]
) -> None:
    summary = _summary(run, 1)
    summary.write_text(json.dumps(dict(json.loads(summary.read_text()), v=1, items="old")))
    report = kernel_report([run])
    assert report.skipped == [] and _totals(report) == pytest.approx(good)


# -- what is named like a file and is not one -------------------------------------------


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (os.mkfifo, "not a regular file (a FIFO)"),
        (Path.mkdir, "not a regular file (a directory)"),
        (lambda p: p.symlink_to(p.name), "a symlink loop"),
        (lambda p: p.symlink_to("/dev/zero"), "not a regular file (a character device)"),
        (lambda p: p.symlink_to("nowhere"), "a broken symlink"),
    ],
    ids=["fifo", "directory", "symlink-loop", "dev-zero", "broken-symlink"],
)
def test_a_trace_name_that_is_not_a_regular_file_is_said_not_opened(
    run: Path, good: dict[int, float], make: Callable[[Path], Any], problem: str
) -> None:
    odd = _trace(run, RANKS)  # a fifth rank's name
    make(odd)
    said = f"{odd}: {problem}"
    _check_kernels(run, said, good, good)
    # Named on the command line: beside a good trace it is skipped; alone it is exit 2
    # (a folder named there is searched for traces, and this one holds none).
    if odd.is_dir():
        said = f"{odd}: no trace files (*.json, *.json.gz)"
    else:
        report = within(lambda: kernel_report([odd, _trace(run, 0)]))
        assert report.skipped == [said] and _totals(report) == {0: good[0]}
    code, _, err = _cli("kernels", odd)
    assert code == 2 and _one_line(err, "kernels") == f"rankscope kernels: {said}"
    said = f"{odd}: {problem}"
    code, _, err = _cli("merge", _trace(run, 0), odd, "-o", run / "m.json")
    assert code == 2 and _one_line(err, "merge") == f"rankscope merge: {said}"
    with pytest.raises(TraceError, match="^" + str(odd)):
        within(lambda: merge_traces([_trace(run, 0), odd], run / "m.json"))


def test_traces_that_is_a_file_is_said(run: Path) -> None:
    shutil.rmtree(run / "traces")
    (run / "traces").write_text("not a folder")
    said = f"{run / 'traces'}: not a directory (a regular file)"
    with pytest.raises(TraceError, match="no trace files") as info:
        kernel_report([run])
    assert said in str(info.value)
    code, _, err = _cli("kernels", run)
    assert code == 2 and said in _one_line(err, "kernels")
    report = build_report(run)  # the timings are still there
    assert said in report["skipped"] and report["kernels"]["windows"] == []
    code, out, _ = _cli("report", run, "--json", "--no-html")
    assert code == 0 and said in _strict(out)["skipped"]


def test_a_window_that_is_a_symlink_loop_is_said(run: Path, good: dict[int, float]) -> None:
    loop = run / "traces" / "step-000009-000010"
    loop.symlink_to(loop.name)
    _check_kernels(run, f"{loop}: a symlink loop", good, good)


def test_a_window_reached_through_a_link_is_read_once(run: Path, good: dict[int, float]) -> None:
    elsewhere = run.parent / "elsewhere"
    (run / "traces" / WINDOW).rename(elsewhere)
    (run / "traces" / WINDOW).symlink_to(elsewhere)
    (run / "traces" / "again").symlink_to(elsewhere)  # the same folder by a second name
    report = kernel_report([run])
    assert report.skipped == [] and _totals(report) == pytest.approx(good)


@pytest.mark.parametrize(
    "where",
    [
        lambda run: timing_path(run, 1),
        lambda run: run / "meta" / "rank-00001.json",
        lambda run: nsys_path(run, WINDOW, 1),
        lambda run: memory_path(run, WINDOW, 1),
    ],
    ids=["timings", "meta", "nsys", "memory"],
)
def test_a_fifo_named_like_a_run_file_never_hangs_a_reader(
    run: Path, where: Callable[[Path], Path]
) -> None:
    fifo = where(run)
    fifo.parent.mkdir(parents=True, exist_ok=True)
    if fifo.exists():
        fifo.unlink()
    os.mkfifo(fifo)
    left_out = f"{fifo}: not a regular file (a FIFO)"
    run_dir = RunDir(run)
    run_dir.meta(), run_dir.timings(), run_dir.nsys_ranges(), run_dir.memory_snapshots()
    assert run_dir.left_out == [left_out]
    report = within(lambda: build_report(run))
    if fifo.parent.name not in ("timings", "meta"):  # those readers are another module's
        assert left_out in report["skipped"]
    for command in ("report", "stragglers"):
        extra = ["--no-html"] if command == "report" else []
        code, out, err = _cli(command, run, "--json", *extra)
        assert code == 0, err
        _strict(out)


# -- one rank, two traces ----------------------------------------------------------------


def test_two_traces_of_one_rank_in_a_window_are_both_skipped(
    run: Path, good: dict[int, float]
) -> None:
    copy = _trace(run, 1).with_name("rank-00001-copy.pt.trace.json.gz")
    shutil.copy2(_trace(run, 1), copy)
    said = (
        f"{copy.parent}: rank 1 is claimed by 2 traces ({copy.name}, {_trace(run, 1).name}); "
        "all skipped: neither can be trusted over the other"
    )
    _check_kernels(run, said, good, {r: t for r, t in good.items() if r != 1})
    code, _, err = _cli("merge", _trace(run, 1), copy, "-o", run / "m.json.gz")
    assert code == 2 and "rank 1 is also the rank of" in _one_line(err, "merge")


def test_a_trace_claiming_another_rank_is_skipped_with_that_rank(
    run: Path, good: dict[int, float]
) -> None:
    _edit_trace(_trace(run, 3), lambda doc: doc["distributedInfo"].update(rank=2))
    _summary(run, 3).unlink()
    said = (
        f"{_trace(run, 2).parent}: rank 2 is claimed by 2 traces "
        f"({_trace(run, 2).name}, {_trace(run, 3).name}); "
        "all skipped: neither can be trusted over the other"
    )
    _check_kernels(run, said, good, {0: good[0], 1: good[1]})


def test_the_same_folder_named_twice_is_read_once(run: Path, good: dict[int, float]) -> None:
    report = kernel_report([run, run / "traces", Path(os.path.relpath(run))])
    assert report.skipped == [] and _totals(report) == pytest.approx(good)
    assert report.tables[0].traces == RANKS


# -- merge: never over its own input -------------------------------------------------------


@pytest.mark.parametrize(
    "output",
    [
        lambda a: a,
        lambda a: a.parent / ".." / a.parent.name / a.name,
        lambda a: _linked(a, "link.json.gz", lambda new, old: new.symlink_to(old)),
        lambda a: _linked(a, "hard.json.gz", lambda new, old: os.link(old, new)),
    ],
    ids=["same-name", "other-spelling", "symlink", "hard-link"],
)
def test_merge_refuses_to_write_over_an_input(run: Path, output: Callable[[Path], Path]) -> None:
    first, second = _trace(run, 0), _trace(run, 1)
    before = first.read_bytes()
    out = output(first)
    with pytest.raises(TraceError, match=r"is the input .* choose another output"):
        merge_traces([first, second], out)
    code, _, err = _cli("merge", first, second, "-o", out)
    assert code == 2
    assert _one_line(err, "merge") == (
        f"rankscope merge: {out}: is the input {first} (the same file); the merge will not "
        "overwrite its input: choose another output"
    )
    assert first.read_bytes() == before


def test_merge_says_a_base_time_of_500_digits(run: Path) -> None:
    _edit_trace(_trace(run, 1), lambda doc: doc.update(baseTimeNanoseconds=10**500))
    with pytest.raises(TraceError, match="baseTimeNanoseconds is a number of about 501 digits"):
        merge_traces([_trace(run, 0), _trace(run, 1)], run / "m.json.gz")
    code, _, err = _cli("merge", _trace(run, 0), _trace(run, 1), "-o", run / "m.json.gz")
    assert code == 2 and _one_line(err, "merge") == (
        f"rankscope merge: {_trace(run, 1)}: baseTimeNanoseconds is a number of about 501 "
        "digits, not a time in nanoseconds (0 to 2**63 - 1)"
    )


def test_merge_writes_strict_json_from_odd_numbers(run: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["baseTimeNanoseconds"] += 1  # a shift that is not whole microseconds
        events = _kernels_of(doc)
        events[0]["ts"] = 10**400  # beyond a float: kept as written
        events[1]["dur"] = float("nan")
        events[2]["args"] = {"x": float("-inf")}

    _edit_trace(_trace(run, 1), edit)
    result = merge_traces([_trace(run, 0), _trace(run, 1)], run / "m.json.gz")
    assert [i.not_finite for i in result.inputs] == [0, 2]
    merged = _strict(gzip.decompress((run / "m.json.gz").read_bytes()).decode())
    assert any(e.get("ts") == 10**400 for e in merged["traceEvents"])
    code, out, err = _cli("merge", _trace(run, 0), _trace(run, 1), "-o", run / "n.json", "--json")
    assert code == 0, err
    assert [i["not_finite"] for i in _strict(out)["inputs"]] == [0, 2]


# -- kernels --by category ------------------------------------------------------------------


def test_by_category_on_cpu_only_traces_is_exit_2_saying_why(tmp_path: Path) -> None:
    for rank in range(2):
        write_trace(trace_path(tmp_path, WINDOW, rank, gzip=True), rank=rank, gpu=False,
                    size_bytes=20_000)  # fmt: skip
    with pytest.raises(ConfigError, match="CPU ops only"):
        kernel_report([tmp_path], KernelOptions(by="category"))
    code, _, err = _cli("kernels", tmp_path, "--by", "category")
    assert code == 2 and _one_line(err, "kernels") == (
        "rankscope kernels: --by 'category' is not valid: the traces hold CPU ops only, no GPU "
        "kernels, and CPU ops have no categories; accepted: name"
    )


def test_by_category_beside_cpu_only_traces_notes_them(run: Path) -> None:
    write_trace(run / "traces" / "cpu" / "rank-00000.pt.trace.json", gpu=False, size_bytes=20_000)
    report = kernel_report([run], KernelOptions(by="category"))
    assert [(t.kind, t.by) for t in report.tables] == [
        ("gpu_kernels", "category"),
        ("cpu_ops", "name"),
    ]
    assert report.notes == [
        "1 trace(s) hold CPU ops only, no GPU kernels: --by category does not apply to them; "
        "their ops are listed by name"
    ]
    code, out, _ = _cli("kernels", run, "--by", "category", "--json")
    assert code == 0 and _strict(out)["notes"] == report.notes


def test_a_gzip_trace_that_inflates_past_any_trace_is_refused_by_its_size(
    tmp_path: Path, capsys: Any
) -> None:
    # A valid trace of one event repeated: gzip makes 100 MB of it about 200 KB (real
    # traces compress 9-19x). Read whole, a 2 MB one took 47 s: it is refused at 64 MB.
    from rankscope.cli import main
    from rankscope.traces._stream import MAX_INFLATION

    event = b'{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":0,"ts":1,"dur":1},'
    path = tmp_path / "rank-00000.pt.trace.json.gz"
    with gzip.open(path, "wb", compresslevel=9) as out:
        out.write(b'{"traceEvents":[')
        for _ in range(100):
            out.write(event * 15_000)
        out.write(event[:-1] + b"]}")
    size = path.stat().st_size
    assert 100 * 15_000 * len(event) > 64 << 20 > MAX_INFLATION * size  # past the floor
    assert main(["kernels", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: inflates past 64 MB, {MAX_INFLATION}x its size ({size} bytes)" in err


def test_an_event_past_any_traces_is_refused_by_its_size_and_one_under_it_is_read(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A valid 2 GB event was "not valid JSON"; one of 300 MB took 23 s, read again at each
    # MB it grew. The bound is 256 MB; here 4 MB, so that the test writes little.
    from rankscope.cli import main
    from rankscope.traces import _stream

    monkeypatch.setattr(_stream, "_MAX_VALUE", 4 << 20)

    def trace(path: Path, mb: int) -> Path:
        head = '{"traceEvents":[{"ph":"X","cat":"kernel","name":"k","pid":0,"tid":0,'
        path.write_text(head + '"ts":1,"dur":1,"args":{"x":"' + "a" * (mb << 20) + '"}}]}')
        return path

    assert main(["kernels", str(trace(tmp_path / "a.pt.trace.json", 3)), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tables"][0]["items"][0]["name"] == "k"
    big = trace(tmp_path / "b.pt.trace.json", 9)
    assert main(["kernels", str(big)]) == 2
    err = capsys.readouterr().err
    assert f"{big}: an event or value of more than 4 MB, past any trace's: refused" in err
    assert "not valid JSON" not in err
