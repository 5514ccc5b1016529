"""The GPU's own health as cause evidence (analysis/stragglers/_gpu_health.py, analysis/stragglers/_cause.py)
and the health files read as untrusted input (analysis/read/_health.py)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rankscope.analysis import find_stragglers, matrices_of, read_run_meta, read_run_records
from rankscope.analysis.read._health import read_health
from rankscope.analysis.read._values import PhaseValues
from rankscope.analysis.stragglers._analyse import analyse_stragglers
from rankscope.testing._synthetic import Slowdown, write_timings
from rankscope.timing._record import format_attempt

HEALTHY: dict[str, Any] = {
    "sm_mhz": 1980,
    "mem_mhz": 2619,
    "throttle": [],
    "temp_c": 62,
    "power_w": 420.0,
    "power_limit_w": 700.0,
    "ecc_corrected": 0,
    "ecc_uncorrected": 0,
    "load1": 2.0,
    "mem_available_mb": 200000.0,
}
HOT: dict[str, Any] = {
    **HEALTHY,
    "sm_mhz": 1410,
    "throttle": ["sw_thermal", "hw_thermal"],
    "temp_c": 91,
}


def health_line(rank: int, step: int, fields: dict[str, Any]) -> str:
    sample = {"v": 1, "rank": rank, "step": step, "time_ns": 1, **fields}
    return json.dumps(sample, separators=(",", ":")) + "\n"


def write_health(
    run: Path, ranks: int, steps: int, of: Callable[[int, int], dict[str, Any]], token: str = "t"
) -> None:
    """A health file per rank, as timing/_health.py writes them: each sample after an attempt line."""
    folder = run / "health"
    folder.mkdir(exist_ok=True)
    for rank in range(ranks):
        opening = format_attempt(rank, {"attempt": token, "started_ns": 1, "pid": 1})
        lines = [opening + health_line(rank, step, of(rank, step)) for step in range(steps)]
        (folder / f"rank-{rank:05d}.jsonl").write_text("".join(lines))


def slow_cause(run: Path) -> Any:
    found = analyse_stragglers(run).report
    (finding,) = [f for f in found.findings if f.role == "slow"]
    return finding, found


def test_a_throttling_gpu_is_the_machine_with_its_clock_since_the_onset(tmp_path: Path) -> None:
    write_timings(
        tmp_path, ranks=4, steps=60, slowdowns=[Slowdown(2, "forward", 0.5, from_step=30)]
    )
    write_health(tmp_path, 4, 60, lambda r, s: HOT if r == 2 and s >= 30 else HEALTHY)
    finding, _ = slow_cause(tmp_path)
    assert finding.since_step == 30
    assert finding.cause.kind == "machine"
    assert finding.cause.text == (
        "machine: rank 2's SM clock 1410 MHz against a median of 1980 since step 30, "
        "thermal throttling (set at 100% of its 30 samples; its GPU at 91 C against a "
        "median of 62 C)"
    )
    assert finding.cause.could_be == ()


def test_without_health_files_the_cause_is_as_before(tmp_path: Path) -> None:
    write_timings(
        tmp_path, ranks=4, steps=60, slowdowns=[Slowdown(2, "forward", 0.5, from_step=30)]
    )
    finding, _ = slow_cause(tmp_path)
    assert finding.cause.kind == "persistent"


def test_power_capping_says_the_draw_against_the_limit(tmp_path: Path) -> None:
    write_timings(tmp_path, ranks=4, steps=40, slowdowns=[Slowdown(1, "forward", 0.5)])
    capped = {**HEALTHY, "sm_mhz": 1500, "throttle": ["sw_power_cap"], "power_w": 698.0}
    write_health(tmp_path, 4, 40, lambda r, s: capped if r == 1 else HEALTHY)
    finding, _ = slow_cause(tmp_path)
    assert finding.cause.kind == "machine"
    assert finding.cause.text.startswith(
        "machine: rank 1's SM clock 1500 MHz against a median of 1980 since step"
    )
    assert "power capping (set at 100% of its 40 samples; drawing 698 W of its 700 W limit)" in (
        finding.cause.text
    )


def test_ecc_errors_growing_on_the_slow_rank_are_said(tmp_path: Path) -> None:
    write_timings(
        tmp_path, ranks=4, steps=40, slowdowns=[Slowdown(3, "forward", 0.5, from_step=20)]
    )

    def of(rank: int, step: int) -> dict[str, Any]:
        grown = rank == 3 and step >= 20
        return {**HEALTHY, "ecc_corrected": 40 if grown else 2} if rank == 3 else HEALTHY

    write_health(tmp_path, 4, 40, of)
    finding, _ = slow_cause(tmp_path)
    assert finding.cause.text.endswith(
        f"its GPU's ECC errors grew since step {finding.since_step} (corrected from 2 to 40)"
    )


def test_healthy_clocks_and_no_value_is_unclear_with_what_was_ruled_out(tmp_path: Path) -> None:
    write_timings(tmp_path, ranks=4, steps=40, slowdowns=[Slowdown(2, "forward", 0.5)])
    busy = {**HEALTHY, "load1": 14.0}
    write_health(tmp_path, 4, 40, lambda r, s: busy if r == 2 else HEALTHY)
    finding, _ = slow_cause(tmp_path)
    cause = finding.cause
    assert cause.kind == "unclear"
    assert cause.could_be == ("persistent", "data-driven")
    assert "ruled out: its GPU's clocks (rank 2's SM clock 1980 MHz against a median of 1980" in (
        cause.text
    )
    assert (
        "left: uneven work (no per-step value is recorded with this phase: record one, e.g. "
        'prof.phase("forward", tokens=n)), the host' in cause.text
    )
    assert "the host (its host's load average 14.0 against a median of 2.0)" in cause.text


def test_healthy_clocks_and_a_value_that_explains_it_stay_data_driven(tmp_path: Path) -> None:
    write_timings(tmp_path, ranks=4, steps=40, slowdowns=[Slowdown(2, "forward", 0.5)])
    write_health(tmp_path, 4, 40, lambda r, s: HEALTHY)
    m = matrices_of(read_run_records(tmp_path))
    tokens = np.full((4, len(m.steps)), 1024.0)
    tokens[m.ranks.index(2)] = 1536.0  # 1.5x the work for 1.5x the time
    known = PhaseValues({"forward": {"tokens": tokens}}, health=read_health(tmp_path))
    found = find_stragglers(m, hosts=read_run_meta(tmp_path).hosts, values=lambda phases: known)
    (cause,) = [f.cause for f in found.findings if f.cause is not None]
    assert cause.kind == "data-driven"


def test_a_low_clock_with_no_reason_set_is_said_not_judged(tmp_path: Path) -> None:
    write_timings(tmp_path, ranks=4, steps=40, slowdowns=[Slowdown(2, "forward", 0.5)])
    slow_clock = {**HEALTHY, "sm_mhz": 1500}
    write_health(tmp_path, 4, 40, lambda r, s: slow_clock if r == 2 else HEALTHY)
    finding, _ = slow_cause(tmp_path)
    assert finding.cause.kind == "persistent"
    assert "rank 2's SM clock 1500 MHz against a median of 1980" in finding.cause.text
    assert "; a thermal or power throttle reason set at 0% of its samples)" in finding.cause.text


def test_bad_health_lines_are_skipped_counted_and_said(tmp_path: Path) -> None:
    write_timings(tmp_path, ranks=4, steps=40, slowdowns=[Slowdown(2, "forward", 0.5)])
    write_health(tmp_path, 4, 40, lambda r, s: HOT if r == 2 else HEALTHY)
    path = tmp_path / "health" / "rank-00002.jsonl"
    with path.open("a") as fh:
        fh.write("not json\n")
        fh.write(health_line(2, 41, {**HOT, "sm_mhz": "fast"}))
        fh.write(health_line(3, 42, HOT))  # another rank's line
        fh.write(health_line(2, -1, HOT))
        fh.write(health_line(2, 43, {**HOT, "temp_c": float("inf")}).replace("Infinity", "1e999"))
        fh.write(health_line(2, 44, {**HOT, "throttle": "thermal"}))
        fh.write(health_line(2, 45, {**HOT, "sm_mhz": 10**400}))
        fh.write("x" * 10_000 + "\n")
        fh.write('{"v":1,"rank":2,"step":45,"sm_mhz":1')  # torn: the rank died mid-write
    health = read_health(tmp_path)
    assert health.skipped == [f"{path}: 8 lines skipped (line 81: not JSON)"]
    assert health.of(2).steps.tolist() == list(range(40))
    finding, found = slow_cause(tmp_path)
    assert finding.cause.kind == "machine"
    assert f"{path}: 8 lines skipped (line 81: not JSON)" in found.notes


def test_a_health_file_that_is_no_file_is_named(tmp_path: Path) -> None:
    write_timings(tmp_path, ranks=2, steps=10)
    (tmp_path / "health").mkdir()
    (tmp_path / "health" / "rank-00000.jsonl").mkdir()
    health = read_health(tmp_path)
    assert health.ranks == {}
    assert len(health.skipped) == 1 and "rank-00000.jsonl" in health.skipped[0]


def test_only_the_used_attempts_samples_count(tmp_path: Path) -> None:
    """A sample of another attempt's token is not this attempt's GPU."""
    write_health(tmp_path, 2, 4, lambda r, s: HOT, token="old")
    for rank in range(2):
        path = tmp_path / "health" / f"rank-{rank:05d}.jsonl"
        opening = format_attempt(rank, {"attempt": "new", "started_ns": 2, "pid": 2})
        with path.open("a") as fh:
            fh.write(opening + health_line(rank, 2, HEALTHY))
    every = read_health(tmp_path)
    assert every.of(0).figure("sm_mhz").tolist() == [1410, 1410, 1980, 1410]  # the latest wins
    new = read_health(tmp_path, {0: {"new"}, 1: {"new"}})
    assert new.of(0).steps.tolist() == [2]


def test_a_slow_data_phase_is_not_put_on_the_gpus_clock(tmp_path: Path) -> None:
    """Loading data is the host's work: a throttling GPU does not explain it."""
    # +4 ms a step: clear of --min-saving (2% of the step), which +2 ms is not.
    write_timings(tmp_path, ranks=4, steps=40, slowdowns=[Slowdown(2, "host_to_device", 2.0)])
    write_health(tmp_path, 4, 40, lambda r, s: HOT if r == 2 else HEALTHY)
    finding, _ = slow_cause(tmp_path)
    assert (finding.phase, finding.kind) == ("host_to_device", "data")
    assert finding.cause.kind == "persistent"
    assert "SM clock" not in finding.cause.text


def test_a_reason_set_with_the_clock_near_the_others_is_said_not_judged(tmp_path: Path) -> None:
    """A throttle reason with hardly a lower clock does not explain a rank 50% slower."""
    write_timings(tmp_path, ranks=4, steps=40, slowdowns=[Slowdown(2, "forward", 0.5)])
    warm = {**HOT, "sm_mhz": 1950}
    write_health(tmp_path, 4, 40, lambda r, s: warm if r == 2 else HEALTHY)
    finding, _ = slow_cause(tmp_path)
    assert finding.cause.kind == "persistent"
    assert (
        "(rank 2's SM clock 1950 MHz against a median of 1980; a thermal or power throttle "
        "reason set at 100% of its samples)" in finding.cause.text
    )


_LINES = st.one_of(
    st.binary(max_size=200),
    st.builds(
        lambda fields: json.dumps({"v": 1, "rank": 0, "step": 3, **fields}).encode(),
        st.dictionaries(
            st.sampled_from(["step", "rank", "v", "sm_mhz", "throttle", "temp_c", "attempt"]),
            st.one_of(
                st.none(),
                st.booleans(),
                st.integers(-(2**70), 2**70),
                st.just(10**400),
                st.floats(allow_nan=True),
                st.text(max_size=8),
                st.lists(st.text(max_size=70), max_size=20),
            ),
        ),
    ),
)


@settings(max_examples=150, derandomize=True, database=None, deadline=None)
@given(lines=st.lists(_LINES, max_size=8))
def test_any_health_line_is_read_or_skipped_never_raised(lines: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "health"
        folder.mkdir()
        (folder / "rank-00000.jsonl").write_bytes(b"\n".join(lines) + b"\n")
        health = read_health(tmp)
        rows = health.of(0)
        assert len(rows.steps) == len(set(rows.steps.tolist())) <= len(lines)
        assert not np.isinf(rows.figures).any() and (np.nan_to_num(rows.figures) >= 0).all()
        assert len(health.skipped) <= 1


def test_throttle_reasons_never_read_rule_nothing_out(tmp_path: Path) -> None:
    """NVML that gave no throttle reasons (`"throttle": null`) is not "no throttling"."""
    write_timings(tmp_path, ranks=4, steps=40, slowdowns=[Slowdown(2, "forward", 0.5)])
    unread = {**HEALTHY, "throttle": None}
    write_health(tmp_path, 4, 40, lambda r, s: unread)
    finding, _ = slow_cause(tmp_path)
    assert "no thermal or power throttling" not in finding.cause.text
    assert "its throttle reasons not read" in finding.cause.text
