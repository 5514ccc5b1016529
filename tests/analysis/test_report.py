"""The report's data: what a run directory shows, with timings, traces, or only one of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankscope import TraceError
from rankscope.analysis import _report as report_module
from rankscope.analysis import build_report, read_run_meta
from rankscope.testing._synthetic import Slowdown, write_timings
from rankscope.testing._synthetic_traces import write_run_traces


def _run(root: Path, **timings: object) -> Path:
    write_timings(root, **{"ranks": 4, "steps": 20, **timings})  # type: ignore[arg-type]
    write_run_traces(root, "step-000003-000004", [0, 2], world_size=4, size_bytes=60_000)
    return root


def test_a_run_with_a_straggler_and_traces(tmp_path: Path) -> None:
    report = build_report(_run(tmp_path, slowdowns=[Slowdown(2, "forward", 0.41)]))
    json.dumps(report, allow_nan=False)  # plain JSON, no NaN
    assert report["ranks"] == {
        "world_size": 4,
        "present": [0, 1, 2, 3],
        "missing": [],
        "hosts": {str(r): "node000" for r in range(4)},
    }
    assert report["steps"]["sampled"] == list(range(20))
    assert [p["name"] for p in report["phases"]] == [
        "host_to_device",
        "forward",
        "backward",
        "optimizer",
        "loss_allreduce",
        "step",
    ]
    forward = next(p for p in report["phases"] if p["name"] == "forward")
    assert forward["records"] == 80 and 29 < forward["median_ms"] < 44
    heat = report["heatmaps"]
    assert heat["ranks"] == [0, 1, 2, 3] and heat["steps"] == list(range(20))
    assert heat["metrics"][0]["name"] == "step"
    fwd = next(m for m in heat["metrics"] if m["name"] == "forward")
    assert len(fwd["values"]) == 4 and all(len(row) == 20 for row in fwd["values"])
    assert min(fwd["values"][2]) > max(fwd["values"][0])  # the slow rank stands out
    assert report["breakdown"]["phases"] == [p["name"] for p in report["phases"][:-1]]
    assert report["stragglers"]["summary"][0].startswith("rank 2 is slow in forward")
    assert all("ratios" not in f for f in report["stragglers"]["findings"])
    (window,) = report["kernels"]["windows"]
    assert window["window"] == "step-000003-000004" and window["ranks"] == [0, 2]
    assert window["kind"] == "gpu_kernels" and 0 < len(window["items"]) <= 15
    assert report["skipped"] == []


def test_missing_ranks_and_bad_lines_are_said(tmp_path: Path) -> None:
    write_timings(tmp_path, ranks=6, steps=10, only_ranks=[0, 1, 3])
    with open(tmp_path / "timings" / "rank-00001.jsonl", "a") as fh:
        fh.write("{garbage\n")
    report = build_report(tmp_path)
    assert report["ranks"]["missing"] == [2, 4, 5] and report["ranks"]["world_size"] == 6
    assert (
        "ranks 2, 4, 5: no timings (of a world of 6)"
        "; no meta file either: nothing of it was written here (another output_dir, its own config leaving it out, or it never started: its log says)"
    ) in report["skipped"]
    assert any("rank-00001.jsonl:" in s and "not valid JSON" in s for s in report["skipped"])
    assert "kernels" not in report  # no traces: the rest still reported


def test_traces_without_timings_still_report_kernels(tmp_path: Path) -> None:
    write_run_traces(tmp_path, "step-000001-000002", [0], world_size=1, size_bytes=30_000)
    report = build_report(tmp_path)
    assert "stragglers" not in report and "heatmaps" not in report
    assert report["kernels"]["windows"][0]["items"]


def test_an_empty_directory_has_nothing_to_report(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="nothing to report") as info:
        build_report(tmp_path)
    assert "no timings" in str(info.value) and "no trace files" in str(info.value)


def test_long_runs_and_many_ranks_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(report_module, "_MAX_COLUMNS", 20)
    monkeypatch.setattr(report_module, "_MAX_ROWS", 4)
    write_timings(tmp_path, ranks=8, steps=60, slowdowns=[Slowdown(5, "forward", 0.5, 30)])
    report = build_report(tmp_path)
    heat = report["heatmaps"]
    assert heat["steps_per_column"] == 3
    assert heat["steps"] == list(range(0, 60, 3))
    # the slow rank on a row of its own, then groups of consecutive ranks (their slowest)
    assert heat["row_is"] == "slowest"
    assert heat["rows"] == [[5], [0, 1, 2], [3, 4, 5], [6, 7]]
    assert all(len(row) == 20 for m in heat["metrics"] for row in m["values"])
    fwd = next(m for m in heat["metrics"] if m["name"] == "forward")["values"]
    assert fwd[2] == [max(a, b) for a, b in zip(fwd[0], fwd[2], strict=True)]
    over = {p["name"]: p for p in report["over_steps"]["phases"]}
    assert report["over_steps"]["steps"] == heat["steps"]
    (flagged,) = over["forward"]["flagged"]
    assert flagged["rank"] == 5 and flagged["role"] == "slow" and flagged["since_step"] == 30
    assert [line["rank"] for line in over["forward"]["lines"]] == [0, 1, 2, 3, 4, 6, 7]
    # from the onset on the slow rank is 1.5x the others' median, before it with them
    mid = over["forward"]["band"]["median"]
    ratio = [v / m for v, m in zip(flagged["values"], mid, strict=True)]
    assert all(r > 1.3 for r in ratio[10:]) and all(r < 1.2 for r in ratio[:10]), ratio


def test_meta_files_that_disagree_or_lie_are_said(tmp_path: Path) -> None:
    write_timings(tmp_path, ranks=3, steps=2)
    meta = tmp_path / "meta"
    (meta / "rank-00001.json").write_text(json.dumps({"rank": 1, "world_size": 8}))
    (meta / "rank-00002.json").write_text(json.dumps({"rank": 5}))
    (meta / "rank-2.json").write_text("{")
    found = read_run_meta(tmp_path)
    assert found.world_size == 8
    assert sorted(found.meta) == [0, 1]
    said = " | ".join(found.skipped)
    assert "rank-00002.json: not the meta of rank 2" in said
    assert "rank-2.json: not readable meta" in said
    assert "disagree on the world size ([3, 8])" in said
    assert found.missing([0, 1, 2]) == [3, 4, 5, 6, 7]


def test_the_report_says_why_a_window_was_captured_outside_the_schedule(tmp_path: Path) -> None:
    run = _run(tmp_path)
    write_run_traces(run, "step-000010-000011", [1, 3], world_size=4, size_bytes=60_000)
    write_run_traces(run, "step-000015-000016", [3], world_size=4, size_bytes=60_000)
    (run / "auto").mkdir()
    declined = {"rank": 3, "status": "declined", "reason": "overlaps", "slow_steps": [5]}
    accepted = {
        "rank": 3,
        "capture": 1,
        "seen_at_step": 13,
        "slow_steps": [11, 12, 13],
        "step_s": [0.2, 0.25, 0.21],
        "median_s": 0.1,
        "ratio": 1.5,
        "status": "accepted",
        "window": "step-000015-000016",
        "first": 15,
        "last": 16,
    }
    lines = [json.dumps(declined), json.dumps(accepted), "{torn"]
    (run / "auto" / "rank-00003.jsonl").write_text("\n".join(lines) + "\n")
    for rank, status in ((1, "accepted"), (3, "accepted"), (2, "declined")):
        answer = run / "triggers" / "t-1" / f"rank-{rank:05d}.json"
        answer.parent.mkdir(parents=True, exist_ok=True)
        answer.write_text(json.dumps({"status": status, "window": "step-000010-000011"}))
    report = build_report(run)
    why = {w["window"]: w["why"] for w in report["kernels"]["windows"]}
    assert why == {
        "step-000003-000004": [],
        "step-000010-000011": ["rankscope trigger t-1 asked for it (ranks 1, 3)"],
        "step-000015-000016": [
            "rank 3 asked for it: its steps 11-13 took up to 2.5x its median step time (100.0 ms)"
        ],
    }
    assert any(s.endswith("rank-00003.jsonl:3: not an anomaly record") for s in report["skipped"])


def test_memory_snapshots_and_nsys_ranges_are_listed(tmp_path: Path) -> None:
    import pickle

    from rankscope.testing._synthetic import write_timings

    write_timings(tmp_path, ranks=2, steps=10)
    for rank in (0, 1):
        snapshot = tmp_path / "memory" / "step-000004-000005" / f"rank-{rank:05d}.pickle"
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        snapshot.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]] * (rank + 1)}))
    (tmp_path / "memory" / "oom-step-000007").mkdir()
    (tmp_path / "memory" / "oom-step-000007" / "rank-00001.pickle").write_bytes(b"x" * 10)
    (tmp_path / "nsys" / "step-000002-000003").mkdir(parents=True)
    (tmp_path / "nsys" / "step-000002-000003" / "rank-00000.json").write_text(
        json.dumps({"rank": 0, "window": "step-000002-000003", "first": 2, "last": 3})
    )
    (tmp_path / "nsys" / "step-000002-000003" / "rank-00001.json").write_text("{not json")
    report = build_report(tmp_path)
    memory = report["captures"]["memory"]
    assert [(m["window"], m["ranks"]) for m in memory] == [
        ("oom-step-000007", [1]),
        ("step-000004-000005", [0, 1]),
    ]
    assert memory[0]["bytes"] == 10
    assert report["captures"]["nsys"] == [
        {"window": "step-000002-000003", "first": 2, "last": 3, "ranks": [0]}
    ]
    assert any("rank-00001.json: not an nsys range record" in s for s in report["skipped"])


def test_heartbeats_and_hang_files_give_a_hangs_part(tmp_path: Path) -> None:
    from .test_hang_analysis import data_stuck_run

    run = _run(tmp_path, slowdowns=[Slowdown(2, "forward", 0.41)])
    assert "hangs" not in build_report(run)  # no watch, no part
    data_stuck_run(run, dead=True)  # the job then hung and was killed
    (run / "live" / "rank-00009.json").write_text('{"v": 1, "rank": 9, "step": NaN}')
    report = build_report(run)
    json.dumps(report, allow_nan=False)
    hangs = report["hangs"]
    assert hangs["state"] == "hung" and "skipped" not in hangs
    assert hangs["summary"].startswith("rank 2 has been stuck in data_loading (data) at step 120")
    assert [g["ranks"] for g in hangs["groups"]] == [[2], [0, 1, 3]]
    assert any("rank-00009.json: not a heartbeat (NaN" in s for s in report["skipped"])
    assert report["stragglers"]["findings"]  # the rest of the report is as it was


def test_a_run_with_heartbeats_alone_is_reported(tmp_path: Path) -> None:
    from .test_hang_analysis import data_stuck_run

    report = build_report(data_stuck_run(tmp_path, dead=True))
    assert report["hangs"]["state"] == "hung"
    assert "stragglers" not in report and "kernels" not in report


def test_the_html_is_written_whole_or_not_at_all(tmp_path: Path, small_disk: Path) -> None:
    from rankscope.analysis.render._page import write_page as write_html

    page = tmp_path / "report.html"
    write_html(page, "<p>first</p>")
    write_html(page, "<p>second</p>")
    assert page.read_text() == "<p>second</p>"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    # a disk that fills part-way: the earlier report stays, and no temporary is left
    earlier = small_disk / "report.html"
    write_html(earlier, "<p>earlier</p>")
    with pytest.raises(OSError):
        write_html(earlier, "<p>" + "x" * 200_000 + "</p>")
    assert earlier.read_text() == "<p>earlier</p>"
    assert sorted(p.name for p in small_disk.iterdir()) == ["report.html"]
    # a folder in its place: the error, and nothing else
    (tmp_path / "taken").mkdir()
    with pytest.raises(OSError):
        write_html(tmp_path / "taken", "<p>page</p>")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["report.html", small_disk.name, "taken"]
    )


def test_a_run_of_thousands_of_phases_shows_the_step_the_found_and_the_longest(
    tmp_path: Path,
) -> None:
    # 5,000 phase names made a 9-20 MB page. Shown: the step, the phase a finding names
    # (however short), then the longest; the rest are counted.
    from rankscope.analysis import render_html
    from rankscope.testing._synthetic import PhaseSpec

    phases = [PhaseSpec(f"phase_{i:04d}", "compute", 0.5 + i / 1000) for i in range(3000)]
    phases.append(PhaseSpec("tiny", "compute", 0.2))
    write_timings(
        tmp_path, ranks=3, steps=16, phases=phases, slowdowns=[Slowdown(1, "tiny", 2000.0)]
    )
    report = build_report(tmp_path)
    assert any(f["phase"] == "tiny" for f in report["stragglers"]["findings"])
    shown = [p["name"] for p in report["phases"]]
    assert len(shown) == report_module._MAX_PHASES
    assert report["phases_left_out"] == 3001 + 1 - len(shown)  # the phases and the step
    assert {"step", "tiny", "phase_2999", "phase_2961"} <= set(shown)
    assert "phase_0000" not in shown  # the shortest, no finding
    charts = [p["name"] for p in report["over_steps"]["phases"]]
    assert set(charts) == set(shown) and "tiny" in report["breakdown"]["phases"]
    page = render_html(report)
    assert len(page.encode()) < 400_000
    assert f"The run has {report['phases_left_out']} more phases" in page
