"""A slow finding's evidence (analysis/stragglers/_evidence.py): the ops that grew on the slow rank
against a healthy peer in a trace window holding both, or why there is none."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from rankscope.analysis import analyse_stragglers
from rankscope.analysis.stragglers._evidence import evidence_line
from rankscope.testing._synthetic import Slowdown, write_timings

from .._helpers import run_cli

SLOW = 2
STEPS = 30


def _run(root: Path) -> Path:
    write_timings(root, ranks=4, steps=STEPS, slowdowns=[Slowdown(SLOW, "forward", 1.0, 10)])
    return root


def _op(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def _steps(mm_us: float, *, phases: bool = True, gpu: bool = False) -> list[dict[str, Any]]:
    """Two steps: a forward range of 1000 us holding aten::mm (`mm_us`) and aten::add (50
    us); after it, outside the range, aten::copy_ (400 us) every step. With `gpu`, the
    products are kernels inside a device range of the phase instead."""
    events = []
    for step in range(2):
        t0 = step * 10_000.0
        if phases:
            events.append(_op("forward", t0, 1000.0, "user_annotation"))
        if gpu:
            if phases:
                events.append(_op("forward", t0 + 10, 1500.0, "gpu_user_annotation", tid=7))
            events.append(_op("sgemm_kernel", t0 + 20, mm_us, "kernel", tid=7))
            events.append(_op("copy_kernel", t0 + 3000, 400.0, "kernel", tid=7))
        events.append(_op("aten::mm", t0 + 10, min(mm_us, 900.0)))
        events.append(_op("aten::add", t0 + 940, 50.0))
        events.append(_op("aten::copy_", t0 + 2000, 400.0))
    return events


def _trace(root: Path, window: str, rank: int, events: list[dict[str, Any]]) -> Path:
    folder = root / "traces" / window
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank-{rank:05d}.pt.trace.json.gz"
    with gzip.open(path, "wt") as out:
        json.dump({"schemaVersion": 1, "traceEvents": events}, out)
    return path


def _evidence(root: Path) -> dict[str, Any]:
    (finding,) = [f for f in analyse_stragglers(root).to_dict()["findings"] if f["role"] == "slow"]
    assert (finding["rank"], finding["phase"]) == (SLOW, "forward")
    return finding  # type: ignore[no-any-return]


def test_a_triggered_window_holding_the_pair_gives_the_ops_inside_the_phase(tmp_path: Path) -> None:
    root = _run(tmp_path)
    window = "step-000020-000021-trigger-abc"
    _trace(root, window, SLOW, _steps(800.0))
    _trace(root, window, 0, _steps(100.0))
    finding = _evidence(root)
    evidence = finding["evidence"]
    assert evidence["window"] == window and evidence["peer_rank"] == 0
    assert evidence["kind"] == "cpu_ops" and evidence["scope"] == "phase forward"
    assert evidence["steps"] == [20, 21]
    # per step: the product grew by 700 us; aten::add is the same; aten::copy_ runs outside
    # the phase and is not counted at all
    assert evidence["ops"] == [
        {"name": "aten::mm", "slow_ms": 0.8, "peer_ms": 0.1, "delta_ms": 0.7, "peer_rank": 0},
        {"name": "aten::add", "slow_ms": 0.05, "peer_ms": 0.05, "delta_ms": 0.0, "peer_rank": 0},
    ]
    assert evidence_line(finding) == (
        "rank 2 is slow in forward: aten::mm +0.7 ms a step against rank 0 at steps 20-21"
    )


def test_gpu_kernels_are_compared_where_the_traces_hold_them(tmp_path: Path) -> None:
    root = _run(tmp_path)
    window = "step-000020-000021"
    _trace(root, window, SLOW, _steps(1200.0, gpu=True))
    _trace(root, window, 1, _steps(200.0, gpu=True))
    evidence = _evidence(root)["evidence"]
    assert evidence["kind"] == "gpu_kernels" and evidence["peer_rank"] == 1
    assert [(op["name"], op["delta_ms"]) for op in evidence["ops"]] == [("sgemm_kernel", 1.0)]


def test_traces_that_mark_no_phase_are_compared_over_whole_steps_and_say_so(
    tmp_path: Path,
) -> None:
    root = _run(tmp_path)
    window = "step-000020-000021"
    _trace(root, window, SLOW, _steps(800.0, phases=False))
    _trace(root, window, 0, _steps(100.0, phases=False))
    finding = _evidence(root)
    assert finding["evidence"]["scope"] == "whole steps"
    assert {op["name"] for op in finding["evidence"]["ops"]} == {
        "aten::mm",
        "aten::add",
        "aten::copy_",
    }
    assert evidence_line(finding).endswith("at steps 20-21 (whole steps: no range of it)")  # type: ignore[union-attr]


def test_without_a_window_holding_the_pair_the_finding_says_so_and_how_to_capture_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _run(tmp_path)
    _trace(root, "step-000020-000021", SLOW, _steps(800.0))  # the slow rank alone
    _trace(root, "step-000001-000001", SLOW, _steps(100.0))
    _trace(root, "step-000001-000001", 0, _steps(100.0))  # a pair, before the slowdown
    evidence = _evidence(root)["evidence"]
    assert evidence["window"] is None and evidence["ops"] == []
    assert evidence["missing"] == (
        "the windows that hold rank 2 and another rank end at step 1, before it turned slow "
        f"at step {_evidence(root)['since_step']}"
    )
    assert evidence["command"] == f"rankscope trigger {root} --ranks 2,1 --steps 2"
    code, out, _ = run_cli(["stragglers", str(root)], capsys)
    assert code == 0
    assert f"`rankscope trigger {root} --ranks 2,1 --steps 2` captures it with a healthy peer" in (
        " ".join(out.split())
    )


def test_no_window_at_all_is_said(tmp_path: Path) -> None:
    evidence = _evidence(_run(tmp_path))["evidence"]
    assert evidence["missing"] == "no trace window holds rank 2"
    assert evidence["command"] == f"rankscope trigger {tmp_path} --ranks 2,1 --steps 2"


def test_a_bad_trace_in_the_pair_is_named_never_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _run(tmp_path)
    window = "step-000020-000021"
    _trace(root, window, SLOW, _steps(800.0))
    bad = _trace(root, window, 0, _steps(100.0))
    bad.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X", "na'))
    evidence = _evidence(root)["evidence"]
    assert evidence["window"] == window and evidence["ops"] == []
    assert evidence["missing"].startswith(f"a trace of the window cannot be read: {bad}")
    code, out, err = run_cli(["stragglers", str(root)], capsys)
    assert code == 0 and "Traceback" not in out + err
    assert "no trace evidence (a trace of the window cannot be read" in " ".join(out.split())


def test_traces_are_read_for_the_slow_findings_that_lose_the_most_time_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rankscope.analysis.stragglers import _evidence

    monkeypatch.setattr(_evidence, "READ_FINDINGS", 1)
    write_timings(
        tmp_path,
        ranks=8,
        steps=STEPS,
        slowdowns=[Slowdown(2, "forward", 1.0, 10), Slowdown(5, "optimizer", 0.5, 10)],
    )
    found = [f for f in analyse_stragglers(tmp_path).to_dict()["findings"] if f["role"] == "slow"]
    assert [(f["rank"], f["phase"]) for f in found] == [(2, "forward"), (5, "optimizer")]
    assert found[0]["evidence"]["missing"] == "no trace window holds rank 2"
    assert found[1]["evidence"]["missing"] == (
        "not read: traces are compared for the 1 slow findings that lose the most time"
    )


def test_an_anomaly_window_its_peer_declined_says_who_was_asked_and_what_it_answered(
    tmp_path: Path,
) -> None:
    root = _run(tmp_path)
    window = "step-000024-000025-slow-forward"
    _trace(root, window, SLOW, _steps(800.0))
    (root / "auto").mkdir()
    peer = {"rank": 0, "why": "same host vm, not slow", "trigger": "auto-rank2-1-abcdef"}
    line = {"rank": SLOW, "capture": 1, "peer": peer, "status": "accepted", "window": window}
    (root / "auto" / "rank-00002.jsonl").write_text(json.dumps(line) + "\n")
    answers = root / "triggers" / "auto-rank2-1-abcdef"
    answers.mkdir(parents=True)
    reason = "step 24 already belongs to an earlier trigger's window"
    (answers / "rank-00000.json").write_text(json.dumps({"status": "declined", "reason": reason}))
    finding = _evidence(root)
    assert finding["evidence"]["missing"] == (
        f"window {window} holds rank 2 alone (rank 0 was asked and answered declined: {reason})"
    )
    assert f"`rankscope trigger {root} --ranks 2,1 --steps 2` captures it" in str(
        evidence_line(finding)
    )


def test_kineto_shaped_traces_are_compared_over_whole_steps_where_no_phase_is_marked(
    tmp_path: Path,
) -> None:
    from rankscope.testing._synthetic_traces import write_run_traces

    root = _run(tmp_path)
    window = "step-000020-000021"
    slow, peer = write_run_traces(root, window, [SLOW, 0], world_size=4, seed=3)
    evidence = _evidence(root)["evidence"]
    assert evidence["window"] == window and evidence["kind"] == "gpu_kernels"
    assert evidence["scope"] == "whole steps" and evidence["problems"] == []
    # each kernel's time a step (the window's two) on each rank, as the traces were written
    truth = {
        name: (
            slow.kernels.get(name, [0, 0.0])[1] / 2000,
            peer.kernels.get(name, [0, 0.0])[1] / 2000,
        )
        for name in slow.kernels.keys() | peer.kernels.keys()
    }
    expected = sorted(truth, key=lambda n: (-(truth[n][0] - truth[n][1]), n))[:10]
    assert [op["name"] for op in evidence["ops"]] == expected
    for op in evidence["ops"]:
        assert (op["slow_ms"], op["peer_ms"]) == pytest.approx(truth[op["name"]], abs=1e-4)


def test_an_auto_record_with_foreign_values_passes_none_of_them_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _run(tmp_path)
    window = "step-000024-000025-slow-forward"
    _trace(root, window, SLOW, _steps(800.0))
    (root / "auto").mkdir()
    line = '{"window": "' + window + '", "peer": {"rank": true, "why": NaN, "trigger": 7}}\n'
    (root / "auto" / "rank-00002.jsonl").write_text(line)
    code, out, err = run_cli(["stragglers", str(root), "--json"], capsys)
    assert code == 0, err
    data = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in strict JSON"))
    (finding,) = [f for f in data["findings"] if f["role"] == "slow"]
    assert finding["evidence"]["missing"] == (
        f"window {window} holds rank 2 alone (no peer was asked)"
    )


def test_the_line_says_how_much_of_the_phases_growth_the_ops_shown_hold() -> None:
    # A slowdown no op shows (the demo's sleep): the ops hold little of the phase's growth.
    ops = [
        {"name": "aten::addmm", "slow_ms": 5.0, "peer_ms": 0.3, "delta_ms": 4.7, "peer_rank": 0},
        {"name": "aten::relu", "slow_ms": 0.2, "peer_ms": 0.1, "delta_ms": 0.1, "peer_rank": 0},
    ]
    evidence = {"window": "step-000020-000021", "peer_rank": 0, "steps": [20, 21], "ops": ops}
    finding = {"rank": 2, "phase": "forward", "evidence": {**evidence, "phase_ms": [20.9, 5.4]}}
    assert evidence_line(finding) == (
        "rank 2 is slow in forward: aten::addmm +4.7 ms a step, aten::relu +0.1 ms a step "
        "against rank 0 at steps 20-21 (the phase 20.9 ms a step against 5.4: the ops shown "
        "hold +4.8 of its +15.5 ms)"
    )
    # Without the phase's own times (traces that mark no range of it), nothing more is said.
    plain = evidence_line({**finding, "evidence": evidence})
    assert plain is not None and plain.endswith("at steps 20-21")


def test_one_trace_marking_the_phase_and_one_not_are_both_compared_over_whole_steps(
    tmp_path: Path,
) -> None:
    root = _run(tmp_path)
    window = "step-000020-000021"
    _trace(root, window, SLOW, _steps(800.0))  # marks forward: copy_ falls outside it
    _trace(root, window, 0, _steps(100.0, phases=False))
    evidence = _evidence(root)["evidence"]
    assert evidence["scope"] == "whole steps"
    ops = {op["name"]: op for op in evidence["ops"]}
    # copy_ runs outside the phase on both ranks alike: over whole steps it did not grow.
    assert ops["aten::copy_"]["slow_ms"] == ops["aten::copy_"]["peer_ms"] == 0.4
    assert ops["aten::mm"]["delta_ms"] == 0.7
