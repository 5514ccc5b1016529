"""Each phase read on the clock of its work (analysis/core/_clocks.py), on GPU-like runs from the
synthetic generator: host time is launch time there, device time the GPU's execution, and
DDP's all-reduce ends backward on the GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rankscope.analysis.core._clocks import choose_clock, clock_words
from rankscope.analysis.core._options import StragglerOptions
from rankscope.analysis.stragglers._analyse import analyse_stragglers
from rankscope.cli._main import main
from rankscope.testing._synthetic import (
    DDP_PHASES,
    GPU_PHASES,
    GPU_WAITING_PHASES,
    PhaseSpec,
    Slowdown,
    write_timings,
)

RANKS, STEPS, EVERY = 4, 30, 2
FROM = 10


def _run(root: Path, *slow: Slowdown, phases: Any = GPU_PHASES, seed: int = 1) -> Path:
    return write_timings(
        root,
        ranks=RANKS,
        steps=STEPS,
        every_n_steps=EVERY,
        phases=phases,
        slowdowns=slow,
        seed=seed,
    )


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["stragglers", *args, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _step_ms(root: Path, since: int) -> float:
    """The measured step time (device, as the GPU ran it) from step `since` on, median over ranks and steps."""
    times = []
    for path in sorted((root / "timings").glob("rank-*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("phase") == "step" and record["step"] >= since:
                times.append(record["gpu_ms"])
    return float(np.median(times))


def _truth(tmp_path: Path, slow: Slowdown) -> float:
    """What fixing the slow rank saves: the step time with it, less the step time without."""
    clean = _run(tmp_path / "clean")
    slowed = _run(tmp_path / "slow", slow)
    return _step_ms(slowed, FROM) - _step_ms(clean, FROM)


def _slow(data: dict[str, Any]) -> list[tuple[int, str]]:
    return [(f["rank"], f["phase"]) for f in data["findings"] if f["role"] == "slow"]


def _waits(data: dict[str, Any]) -> list[tuple[int, str, list[int]]]:
    return sorted(
        (f["rank"], f["phase"], f["waits_for"]) for f in data["findings"] if f["role"] == "waits"
    )


def _saves(data: dict[str, Any]) -> float:
    (slow,) = [f for f in data["findings"] if f["role"] == "slow"]
    saved: float = slow["cost"]["step_ms_saved"]
    return saved


def test_a_slower_gpu_with_unchanged_launches_is_found_and_priced_on_device_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slow = Slowdown(2, "forward", 3.0, from_step=FROM, on="device")
    truth = _truth(tmp_path, slow)
    data = _json(capsys, str(tmp_path / "slow"))
    assert _slow(data) == [(2, "forward")]
    assert _waits(data) == [(r, "backward", [2]) for r in (0, 1, 3)]
    assert _saves(data) == pytest.approx(truth, rel=0.15), (data["summary"], truth)
    assert data["clocks"]["forward"] == "device" and data["clocks"]["backward"] == "device"
    # On host time (launches) nothing shows: the case the default must not miss.
    host = _json(capsys, str(tmp_path / "slow"), "--time", "host")
    assert _slow(host) == [] and host["clocks"]["forward"] == "host"


def test_extra_gpu_work_seen_in_its_launches_too_is_priced_on_device_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slow = Slowdown(2, "forward", 3.0, from_step=FROM, on="both")
    truth = _truth(tmp_path, slow)
    data = _json(capsys, str(tmp_path / "slow"))
    assert _slow(data) == [(2, "forward")]
    assert _saves(data) == pytest.approx(truth, rel=0.15)
    host = _json(capsys, str(tmp_path / "slow"), "--time", "host")
    # Launch time prices it far lower, under what is worth a finding: what --time host reads.
    assert not _slow(host) or _saves(host) < truth / 10


def test_a_rank_slow_in_a_host_bound_loader_is_found_and_its_waiters_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slow = Slowdown(3, "data", 1.5, from_step=FROM, on="host")
    truth = _truth(tmp_path, slow)
    data = _json(capsys, str(tmp_path / "slow"))
    assert data["clocks"]["data"] == "host", "the GPU is idle in data; the host is the work"
    assert _slow(data) == [(3, "data")]
    assert _waits(data) == [(r, "backward", [3]) for r in (0, 1, 2)]
    # The loader overlaps the GPU's work on the step before: fixing it saves what the
    # GPU waited, not the loader's whole excess (30 ms).
    assert _saves(data) == pytest.approx(truth, rel=0.25), (data["summary"], truth)
    assert "backward" in data["sync_phases"]


def test_onsets_on_device_time_are_the_step_the_slowdown_began(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(tmp_path, Slowdown(2, "forward", 3.0, from_step=FROM, on="device"))
    data = _json(capsys, str(tmp_path))
    assert {f["since_step"] for f in data["findings"]} == {FROM}


def test_a_cpu_run_gives_the_answers_of_host_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slow = Slowdown(1, "forward", 0.4, from_step=5)
    for gpu in (False, True):  # True: device times a little under host times, as on a CPU
        root = write_timings(
            tmp_path / str(gpu), ranks=4, steps=40, phases=DDP_PHASES, slowdowns=[slow], gpu=gpu
        )
        auto = _json(capsys, str(root))
        host = _json(capsys, str(root), "--time", "host")
        assert auto.pop("time") == "auto" and host.pop("time") == "host"
        assert set(auto["clocks"].values()) == {"host"}
        assert auto == host
        assert _slow(auto) == [(1, "forward")]


def test_the_clocks_are_said_in_the_terminal_and_per_phase_in_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _run(tmp_path, Slowdown(2, "forward", 3.0, from_step=FROM, on="device"))
    assert main(["stragglers", str(root)]) == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if line.startswith("clocks:")]
    assert said == ["clocks: device time; host time for data, step"], out
    data = _json(capsys, str(root))
    assert data["clocks"] == {
        "data": "host",
        "forward": "device",
        "backward": "device",
        "optimizer": "device",
        "step": "host",
    }
    cpu = write_timings(tmp_path / "cpu", ranks=3, steps=10)
    assert main(["stragglers", str(cpu)]) == 0
    assert "(host time;" in capsys.readouterr().out


def test_device_time_asked_of_phases_without_it_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = write_timings(tmp_path, ranks=3, steps=10)  # a CPU run: no device times
    data = _json(capsys, str(root), "--time", "device")
    assert data["untimed"] == [*(p.name for p in DDP_PHASES), "step"]
    assert main(["stragglers", str(root), "--time", "device"]) == 0
    assert "no device times for host_to_device, forward" in capsys.readouterr().out


def test_the_rule_reads_device_time_where_the_gpu_works_through_half_the_phase() -> None:
    nan = float("nan")
    host, gpu = np.array([1.0, 1.1, 0.9, 1.0]), np.array([12.0, 12.5, 11.0, 13.0])
    assert choose_clock("auto", gpu, host) == "device"
    assert choose_clock("auto", host, gpu) == "host"  # a loader: the GPU passed its marks
    # A phase that waits on the GPU: host time the longer, the GPU busy through most of it.
    assert choose_clock("auto", np.array([65.0, 64.0, 30.0]), np.array([75.0, 75.0, 75.0])) == (
        "device"
    )
    assert choose_clock("auto", np.array([30.0, 31.0]), np.array([75.0, 75.0])) == "host"
    assert choose_clock("auto", np.array([nan, nan, 12.0, 13.0]), host) == "host"  # half covered
    assert choose_clock("host", gpu, host) == "host"
    assert choose_clock("device", host, gpu) == "device"
    assert clock_words({"a": "host", "b": "host"}) == "host time"
    assert (
        clock_words({"a": "device", "b": "host", "c": "device"}) == "device time; host time for b"
    )


def test_analysis_api_defaults_to_auto(tmp_path: Path) -> None:
    root = _run(tmp_path, Slowdown(2, "forward", 3.0, from_step=FROM, on="device"))
    found = analyse_stragglers(root)
    assert found.report.time == "auto" == StragglerOptions().time
    assert [(f.rank, f.phase) for f in found.report.findings if f.role == "slow"] == [
        (2, "forward")
    ]


def test_diff_reads_each_phase_on_its_clock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clean = _run(tmp_path / "a")
    slow = _run(tmp_path / "b", Slowdown(2, "forward", 3.0, from_step=0, on="device"), seed=2)
    assert main(["diff", str(clean), str(slow), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["clocks"]["forward"] == "device" and data["clocks"]["data"] == "host"
    assert ("forward", 2) in [(c["phase"], c.get("rank")) for c in data["changes"]]
    assert main(["diff", str(clean), str(slow)]) == 0
    assert "device time; host time for data, step" in capsys.readouterr().out


def test_diff_does_not_compare_a_phase_read_on_two_clocks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpu = _run(tmp_path / "gpu")
    cpu = write_timings(
        tmp_path / "cpu",
        ranks=RANKS,
        steps=STEPS,
        phases=[PhaseSpec(p.name, p.kind, p.ms + (p.device_ms or 0.0), p.sync) for p in GPU_PHASES],
    )
    assert main(["diff", str(gpu), str(cpu), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "forward" not in data["compared"]["phases"] and "data" in data["compared"]["phases"]
    said = [n for n in data["notes"] if n.startswith("read on different clocks")]
    assert said and "forward (device time in A, host in B)" in said[0], data["notes"]


def test_the_report_says_the_clocks_and_prices_on_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _run(tmp_path, Slowdown(2, "forward", 3.0, from_step=FROM, on="device"))
    page = tmp_path / "page.html"
    assert main(["report", str(root), "--json", "-o", str(page)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["clock"] == "device time; host time for data, step"
    assert {p["name"]: p["clock"] for p in data["phases"]}["forward"] == "device"
    assert [(f["rank"], f["phase"]) for f in data["stragglers"]["findings"]][:1] == [(2, "forward")]
    html = page.read_text()
    assert "Read on device time; host time for data, step." in html
    assert main(["report", str(root), "--no-html"]) == 0
    assert "device time; host time for data, step" in capsys.readouterr().out


def test_ranks_waiting_on_the_gpu_in_backward_are_named_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real H200 run's shape: DDP's host waits for the all-reduce at backward's end, so
    host time there is the longer clock on every rank and shows every rank alike; the slow
    rank's extra GPU work in forward makes the others wait on the GPU. The default clock
    reads backward on device time and names them (host time, the longer, named none)."""
    slow = Slowdown(2, "forward", 2.0, from_step=FROM, on="device")
    run = _run(tmp_path / "run", slow, phases=GPU_WAITING_PHASES)
    data = _json(capsys, str(run))
    assert data["clocks"]["backward"] == "device"
    assert _slow(data) == [(2, "forward")]
    assert _waits(data) == [(r, "backward", [2]) for r in (0, 1, 3)]
    on_host = _json(capsys, str(run), "--time", "host")
    assert not _waits(on_host)  # what the longer clock gave: no waiting rank
