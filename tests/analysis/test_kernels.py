"""Kernel tables across traces: sums against what the trace generator wrote, and bad input."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from rankscope import ConfigError, TraceError
from rankscope.analysis import KernelOptions
from rankscope.analysis.kernels import _kernels
from rankscope.analysis.kernels._kernels import find_traces, kernel_report
from rankscope.testing._synthetic_traces import write_run_traces, write_trace
from rankscope.traces._kineto import summarize_trace


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
@pytest.mark.parametrize("base", [None, 1_790_000_000_000_000_000])
def test_a_generated_trace_sums_to_what_was_written(
    tmp_path: Path, name: str, base: int | None
) -> None:
    truth = write_trace(tmp_path / name, size_bytes=400_000, base_time_ns=base, seed=3)
    summary = summarize_trace(truth.path)
    assert summary["kind"] == "gpu_kernels"
    got = {i["name"]: (i["count"], i["total_us"]) for i in summary["items"]}
    assert got.keys() == truth.kernels.keys()
    for kernel, (count, total) in truth.kernels.items():
        assert got[kernel][0] == count
        assert got[kernel][1] == pytest.approx(total)
    assert summary["total_us"] == pytest.approx(truth.kernel_total_us)


def test_a_cpu_only_trace_sums_self_times_to_what_was_written(tmp_path: Path) -> None:
    truth = write_trace(tmp_path / "cpu.json.gz", size_bytes=300_000, gpu=False)
    summary = summarize_trace(truth.path)
    assert summary["kind"] == "cpu_ops"
    got = {i["name"]: (i["count"], i["total_us"]) for i in summary["items"]}
    assert got.keys() == truth.cpu_self.keys()
    for op, (count, own) in truth.cpu_self.items():
        assert got[op][0] == count
        assert got[op][1] == pytest.approx(own, abs=1e-6 * count)


def test_many_traces_are_summed_per_kernel(tmp_path: Path) -> None:
    truths = write_run_traces(tmp_path, "step-000003-000004", range(3), world_size=3)
    truths += write_run_traces(tmp_path, "step-000009-000010", [1], world_size=3, seed=5)
    report = kernel_report([tmp_path])
    (table,) = report.tables
    assert table.kind == "gpu_kernels" and table.traces == 4
    expected: dict[str, list[float]] = {}
    for truth in truths:
        for kernel, (count, total) in truth.kernels.items():
            row = expected.setdefault(kernel, [0, 0.0])
            row[0] += count
            row[1] += total
    got = {i["name"]: (i["count"], i["total_us"]) for i in table.items}
    assert got.keys() == expected.keys()
    for kernel, (count, total) in expected.items():
        assert got[kernel] == (count, pytest.approx(total))
    assert sum(i["share"] for i in table.items) == pytest.approx(1.0)
    assert [t["rank"] for t in report.traces] == [0, 1, 2, 1]
    assert {t["window"] for t in report.traces} == {"step-000003-000004", "step-000009-000010"}
    # Meta and timings files in the run directory are not taken for traces.
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "rank-00000.json").write_text("{}")
    assert len(find_traces([tmp_path])) == 4


def test_a_window_picks_its_traces(tmp_path: Path) -> None:
    write_run_traces(tmp_path, "step-000003-000004", [0, 1], world_size=2)
    write_run_traces(tmp_path, "step-000009-000010", [0], world_size=2)
    report = kernel_report([tmp_path], KernelOptions(window="step-000009-000010"))
    assert [t["window"] for t in report.traces] == ["step-000009-000010"]
    with pytest.raises(TraceError, match=r"no trace files.*window named step-9"):
        kernel_report([tmp_path], KernelOptions(window="step-9"))


def test_by_category_splits_communication_from_computation(tmp_path: Path) -> None:
    truth = write_trace(tmp_path / "t.json.gz", size_bytes=300_000)
    (table,) = kernel_report([truth.path], KernelOptions(by="category")).tables
    rows = {i["name"]: i for i in table.items}
    nccl = sum(t for k, (_, t) in truth.kernels.items() if k.startswith("nccl"))
    assert rows["communication"]["total_us"] == pytest.approx(nccl)
    assert rows["computation"]["total_us"] == pytest.approx(truth.kernel_total_us - nccl)
    assert rows["memcpy"]["count"] > 0
    # One total for every row, memcpy included, so the shares add up to 1.
    assert table.total_us == pytest.approx(truth.kernel_total_us + rows["memcpy"]["total_us"])
    assert sum(i["share"] for i in table.items) == pytest.approx(1.0)
    assert table.count == sum(i["count"] for i in table.items)


def test_kernel_totals_of_the_real_traces_are_plain_sums(real_traces: Path) -> None:
    report = kernel_report([real_traces])
    gpu = next(t for t in report.tables if t.kind == "gpu_kernels")
    expected = 0.0
    for path in sorted(real_traces.glob("*.json.gz")):
        with gzip.open(path, "rt") as fh:
            expected += sum(
                e["dur"] for e in json.load(fh)["traceEvents"] if e.get("cat") == "kernel"
            )
    assert gpu.total_us == pytest.approx(expected)
    assert gpu.traces == 4  # the CUPTI-range and gloo traces hold no kernels
    assert {
        t["rank"] for t in report.traces if t["path"].endswith("rank34-of-300.pt.trace.json.gz")
    } == {34}


def test_category_shares_of_the_real_traces_are_of_one_total(real_traces: Path) -> None:
    """memcpy and memset are rows of the table, so they are in its total: the shares of
    the shared GPU traces added up to 105.8% when memcpy had a share but no part in it."""
    report = kernel_report([real_traces], KernelOptions(by="category"))
    gpu = next(t for t in report.tables if t.kind == "gpu_kernels")
    rows = {i["name"]: i for i in gpu.items}
    assert {"communication", "computation", "memcpy", "memset"} <= rows.keys()
    assert sum(i["share"] for i in gpu.items) == pytest.approx(1.0)
    assert gpu.total_us == pytest.approx(sum(i["total_us"] for i in gpu.items))
    assert gpu.count == sum(i["count"] for i in gpu.items)
    kernels = next(t for t in kernel_report([real_traces]).tables if t.kind == "gpu_kernels")
    memory = rows["memcpy"]["total_us"] + rows["memset"]["total_us"]
    assert gpu.total_us == pytest.approx(kernels.total_us + memory)
    # The CUPTI-range and gloo traces hold no kernels: their table stays per op, and says so.
    assert [(t.kind, t.by) for t in report.tables][1] == ("cpu_ops", "name")
    assert report.notes and "--by category does not apply" in report.notes[0]


def test_a_current_capture_summary_is_used_and_a_stale_one_is_not(tmp_path: Path) -> None:
    (truth,) = write_run_traces(tmp_path, "step-000001-000001", [0], world_size=1)
    summary = summarize_trace(truth.path)
    summary["items"][0]["name"] = "marked"  # found only in the summary
    sidecar = truth.path.with_name("rank-00000.summary.json")
    sidecar.write_text(json.dumps(summary))

    def names() -> set[str]:
        return {item["name"] for item in kernel_report([tmp_path]).tables[0].items}

    assert "marked" in names()
    # A trace newer than its summary is read again.
    stamp = sidecar.stat().st_mtime
    os.utime(truth.path, (stamp + 10, stamp + 10))
    assert names() == truth.kernels.keys()
    # So is a summary of another version, with nothing said.
    os.utime(sidecar, (stamp + 20, stamp + 20))
    sidecar.write_text(json.dumps(dict(summary, v=1)))
    assert names() == truth.kernels.keys()
    assert kernel_report([tmp_path]).skipped == []


def test_read_in_parallel_or_not_the_tables_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_run_traces(tmp_path, "w", range(4), world_size=4, size_bytes=200_000)
    alone = kernel_report([tmp_path], workers=1).to_dict()
    monkeypatch.setattr(_kernels, "_PARALLEL_BYTES", 0)
    seen: list[tuple[int, int]] = []
    together = kernel_report(
        [tmp_path], workers=2, progress=lambda d, t: seen.append((d, t))
    ).to_dict()
    assert together == alone
    assert seen[-1] == (4, 4)


def test_a_bad_trace_among_good_ones_is_skipped_and_said(tmp_path: Path) -> None:
    write_run_traces(tmp_path, "w", [0], world_size=2)
    bad = tmp_path / "traces" / "w" / "rank-00001.pt.trace.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X"}')[:-12])
    report = kernel_report([tmp_path])
    assert report.tables[0].traces == 1
    (said,) = report.skipped
    assert str(bad) in said and "truncated or corrupt gzip" in said


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: root / "absent.json", "no such file or directory"),
        (lambda root: (root / "empty").mkdir() or root / "empty", "no trace files"),
    ],
)
def test_nothing_to_read_is_a_named_error(tmp_path: Path, make: object, message: str) -> None:
    target = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(TraceError, match=message) as info:
        kernel_report([target])
    assert str(target) in str(info.value)


def test_only_bad_traces_is_an_error_naming_each(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{not json")
    (tmp_path / "b.json").write_text('{"foo": 1}')
    with pytest.raises(TraceError) as info:
        kernel_report([tmp_path])
    assert "a.json: not valid JSON" in str(info.value)
    assert "b.json: not a trace" in str(info.value)


def test_an_unknown_grouping_names_the_option(tmp_path: Path) -> None:
    truth = write_trace(tmp_path / "t.json", size_bytes=10_000)
    with pytest.raises(ConfigError, match="by='kernel'"):
        kernel_report([truth.path], KernelOptions(by="kernel"))
