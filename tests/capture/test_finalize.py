from __future__ import annotations

import errno
import gzip
import json
import os
import random
import string
from pathlib import Path

import pytest

from rankscope.capture._finalize import RAW_NAME, FinalizeJob, finalize
from rankscope.capture._worker import TraceFinalizer

WINDOW = "step-000001-000002"


def _write_raw_trace(path: Path, events: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    names = ["".join(rng.choices(string.ascii_letters, k=24)) for _ in range(events)]
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": n, "ts": i, "dur": 1 + i % 7, "pid": 0, "tid": 7}
            for i, n in enumerate(names)
        ],
        "distributedInfo": {"rank": 5},
    }
    path.write_text(json.dumps(trace))


def _raw(run: Path) -> Path:
    """Where the export puts the raw trace: a private folder in the window's folder."""
    work = run / "traces" / WINDOW / ".rank-00005.pt.trace.json.raw-1.tmp"
    work.mkdir(parents=True, mode=0o700)
    return work / RAW_NAME


def _job(run: Path, raw: Path, gz: bool = True) -> FinalizeJob:
    window = run / "traces" / WINDOW
    window.mkdir(parents=True, exist_ok=True)
    suffix = ".pt.trace.json.gz" if gz else ".pt.trace.json"
    return FinalizeJob(
        raw=str(raw),
        trace=str(window / f"rank-00005{suffix}"),
        summary=str(window / "rank-00005.summary.json"),
        rank=5,
        window=WINDOW,
        run_dir=str(run),
    )


def test_finalize_writes_trace_and_summary_and_removes_the_raw_export(tmp_path: Path) -> None:
    raw = _raw(tmp_path)
    _write_raw_trace(raw, events=50)
    job = _job(tmp_path, raw)
    summary = finalize(job)
    assert not raw.parent.exists()  # the raw export, and the folder made for it
    with gzip.open(job.trace, "rt") as fh:
        assert len(json.load(fh)["traceEvents"]) == 50
    on_disk = json.loads(Path(job.summary).read_text())
    assert on_disk == summary
    assert on_disk["rank"] == 5
    assert on_disk["window"] == "step-000001-000002"
    assert on_disk["trace"] == "rank-00005.pt.trace.json.gz"
    assert sorted(os.listdir(Path(job.trace).parent)) == [
        "rank-00005.pt.trace.json.gz",
        "rank-00005.summary.json",
    ]


def test_uncompressed_trace_is_renamed_not_copied(tmp_path: Path) -> None:
    raw = _raw(tmp_path)
    _write_raw_trace(raw, events=5)
    inode = raw.stat().st_ino
    job = _job(tmp_path, raw, gz=False)
    finalize(job)
    assert Path(job.trace).stat().st_ino == inode


def test_truncated_export_leaves_no_final_file(tmp_path: Path) -> None:
    raw = _raw(tmp_path)
    _write_raw_trace(raw, events=50)
    raw.write_text(raw.read_text()[:-300])  # what a disk filling up mid-export leaves
    job = _job(tmp_path, raw)
    with pytest.raises(Exception, match="truncated"):
        finalize(job)
    assert os.listdir(Path(job.trace).parent) == []
    assert not raw.exists()


def test_a_raw_export_outside_a_private_folder_is_finalised_too(tmp_path: Path) -> None:
    raw = tmp_path / ".raw.json"
    _write_raw_trace(raw, events=5)
    job = _job(tmp_path, raw)
    finalize(job)
    assert not raw.exists()
    assert sorted(os.listdir(Path(job.trace).parent)) == [
        "rank-00005.pt.trace.json.gz",
        "rank-00005.summary.json",
    ]


@pytest.mark.parametrize("name", ["rank-00005.pt.trace.json.gz", "rank-00005.summary.json"])
def test_a_link_under_a_final_name_is_refused_not_followed(tmp_path: Path, name: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    run = tmp_path / "run"
    raw = _raw(run)
    _write_raw_trace(raw, events=5)
    job = _job(run, raw)
    (run / "traces" / WINDOW / name).symlink_to(outside / "planted")
    with pytest.raises(OSError, match="symbolic link"):
        finalize(job)
    assert os.listdir(outside) == []
    assert not raw.parent.exists()
    assert (run / "traces" / WINDOW / name).is_symlink()  # left as it was


def test_disk_full_while_compressing_leaves_no_final_file(small_disk: Path) -> None:
    raw = _raw(small_disk)
    _write_raw_trace(raw, events=400)  # ~43 KiB of poorly compressible names
    assert 30_000 < raw.stat().st_size < 60_000
    job = _job(small_disk, raw)
    with pytest.raises(OSError) as info:
        finalize(job)
    assert info.value.errno == errno.ENOSPC
    assert os.listdir(Path(job.trace).parent) == []
    assert not raw.exists()


def test_worker_reports_a_failing_child_and_keeps_going(small_disk: Path, tmp_path: Path) -> None:
    errors: list[str] = []
    worker = TraceFinalizer(errors.append)
    full_raw = _raw(small_disk)
    _write_raw_trace(full_raw, events=400)
    worker.submit(_job(small_disk, full_raw))
    good_raw = _raw(tmp_path)
    _write_raw_trace(good_raw, events=3)
    good = _job(tmp_path, good_raw)
    worker.submit(good)
    assert worker.drain(timeout=60)
    assert len(errors) == 1
    assert "No space left on device" in errors[0]
    assert Path(good.trace).is_file()
    assert worker.last_summary is not None
    assert worker.last_summary["count"] == 3


def test_drain_times_out_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    worker = TraceFinalizer(lambda _: None)
    raw = _raw(tmp_path)
    _write_raw_trace(raw, events=20_000)
    worker.submit(_job(tmp_path, raw))
    assert worker.drain(timeout=0.0) is False
    assert any("gave up" in r.getMessage() for r in caplog.records)
    assert worker.drain(timeout=60)
