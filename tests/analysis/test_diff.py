"""`rankscope diff A B`: what changed between two runs, or two windows, above the noise.

Most cases are synthetic runs (`write_timings`, a known slowdown in B, and a new seed
for B's noise, as a second run of the same job has); one real job, two spawned gloo
ranks that time and capture the same loop twice, the second time with a sleep in one
phase, checks the whole path from the Profiler's files.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rankscope.analysis.diff._diff import diff_runs
from rankscope.analysis.stragglers._findings import ratio_text
from rankscope.cli import _diff, _main
from rankscope.rundir._layout import summary_path, timing_path, trace_path
from rankscope.testing._gloo import GlooRanks
from rankscope.testing._synthetic import DDP_PHASES, PhaseSpec, Slowdown, write_timings

from .._helpers import run_cli

RANKS = 4
STEPS = 40
WINDOW = "step-000004-000005"

Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    """`rankscope ARGV` through the real entry point, with `diff` registered where the
    entry point does not register it yet."""
    real = _main._parser

    def parser() -> Any:
        built = real()
        commands = built._commands()
        if "diff" not in commands.choices:
            _diff.add_commands(commands)
        return built

    monkeypatch.setattr(_main, "_parser", parser)
    return lambda *argv: run_cli([str(a) for a in argv], capsys)


def _strict(text: str) -> Any:
    def refuse(word: str) -> None:
        raise ValueError(f"not strict JSON: {word}")

    return json.loads(text, parse_constant=refuse)


def _diff_json(cli: Cli, *argv: object) -> dict[str, Any]:
    code, out, err = cli("diff", *argv, "--json")
    assert (code, err) == (0, ""), err
    data: dict[str, Any] = _strict(out)
    return data


def _pair(
    root: Path, slowdowns: list[Slowdown], *, ranks: int = RANKS, **options: Any
) -> tuple[Path, Path]:
    """The same job run twice (another seed: other noise), B with `slowdowns`."""
    a = write_timings(root / "a", ranks=ranks, steps=STEPS, seed=1, **options)
    b = write_timings(root / "b", ranks=ranks, steps=STEPS, seed=2, slowdowns=slowdowns, **options)
    return a, b


def _named(changes: list[dict[str, Any]]) -> list[tuple[str | None, int | None]]:
    return [(c["phase"] or c["kernel"], c["rank"]) for c in changes]


# -- what changed ---------------------------------------------------------------------------


def test_a_phase_made_slower_on_every_rank_is_named_first_and_alone(
    tmp_path: Path, cli: Cli
) -> None:
    a, b = _pair(tmp_path, [Slowdown(r, "forward", 0.5) for r in range(RANKS)])
    data = _diff_json(cli, a, b)
    assert _named(data["changes"]) == [("forward", None)]
    (change,) = data["changes"]
    assert change["what"] == "phase" and change["kind"] == "compute"
    assert 13 < change["delta_ms"] < 17  # 30 ms made 50% slower
    assert change["a"]["median_ms"] < change["b"]["median_ms"]
    assert change["a"]["p90_ms"] >= change["a"]["median_ms"]
    assert change["delta_ms"] > change["noise_ms"] > 0
    assert data["step"]["delta_ms"] == pytest.approx(change["delta_ms"], rel=0.2)
    assert data["compared"]["phases"] == [p.name for p in DDP_PHASES]
    assert data["within_noise"] == len(DDP_PHASES) - 1


def test_one_rank_made_slower_is_named_with_its_rank_not_its_waiters(
    tmp_path: Path, cli: Cli
) -> None:
    a, b = _pair(tmp_path, [Slowdown(2, "forward", 0.5)])
    data = _diff_json(cli, a, b)
    # The other ranks wait for rank 2 in backward (its gradient all-reduce): that wait is
    # taken out, so neither backward nor the waiting ranks are listed.
    assert _named(data["changes"]) == [("forward", 2)]
    (change,) = data["changes"]
    assert change["what"] == "rank" and 13 < change["delta_ms"] < 17
    assert abs(change["others_delta_ms"]) < 2
    assert change["a"]["ranks"] == change["b"]["ranks"] == 1


@pytest.mark.parametrize("ranks", [64, 256])
def test_one_slow_rank_among_many_leaves_the_collective_phase_unchanged(
    tmp_path: Path, ranks: int
) -> None:
    # backward holds each rank's work and the all-reduce. With many ranks arriving close
    # together it ends after the far tail of their work; with rank 2 far behind, after
    # rank 2's own: left in, that made backward look 2.5 ms faster (over a noise bar of
    # 1.6) at 64 ranks and more at 256.
    a, b = _pair(tmp_path, [Slowdown(2, "forward", 0.5)], ranks=ranks)
    diff = diff_runs(a, b, workers=1)
    assert [(c.name, c.rank) for c in diff.changes] == [("forward", 2)]


def test_a_slower_rank_inside_the_collective_phase_still_shows_among_many(
    tmp_path: Path,
) -> None:
    # Taking the tail out must not hide real work there: rank 2's hidden backward work
    # +30% (about 16 ms) lengthens every rank's backward.
    a, b = _pair(tmp_path, [Slowdown(2, "backward", 0.3)], ranks=64)
    (change,) = diff_runs(a, b, workers=1).changes
    assert (change.name, change.rank) == ("backward", None)
    assert 8 < change.delta_ms < 18


def test_two_ranks_one_slower_names_that_rank(tmp_path: Path, cli: Cli) -> None:
    a, b = _pair(tmp_path, [Slowdown(1, "optimizer", 1.0)], ranks=2)
    data = _diff_json(cli, a, b)
    assert _named(data["changes"])[:1] == [("optimizer", 1)]
    assert all(c["rank"] != 0 for c in data["changes"])


def test_changes_are_sorted_by_the_step_time_they_explain(tmp_path: Path, cli: Cli) -> None:
    slow = [Slowdown(r, "backward", 0.3) for r in range(RANKS)]  # about +16 ms
    slow += [Slowdown(r, "optimizer", -0.5) for r in range(RANKS)]  # about -4 ms
    slow += [Slowdown(3, "forward", 0.3)]  # about +9 ms, rank 3 alone
    a, b = _pair(tmp_path, slow)
    changes = _diff_json(cli, a, b)["changes"]
    assert _named(changes) == [("backward", None), ("forward", 3), ("optimizer", None)]
    sizes = [abs(c["delta_ms"]) for c in changes]
    assert sizes == sorted(sizes, reverse=True)
    assert changes[2]["delta_ms"] < 0 and changes[2]["relative"] == pytest.approx(-0.5, abs=0.1)


@pytest.mark.parametrize(
    "options",
    [
        {"noise": 0.03},
        {"noise": 0.15, "spikes": 0.05},
        {"noise": 0.05, "resume_lag_ms": 3.0, "resume_in_order": False},
    ],
)
def test_a_second_run_of_the_same_job_shows_no_change(
    tmp_path: Path, cli: Cli, options: dict[str, Any]
) -> None:
    a, b = _pair(tmp_path, [], ranks=8, **options)
    data = _diff_json(cli, a, b)
    assert data["changes"] == []
    assert data["within_noise"] == len(DDP_PHASES)
    assert abs(data["step"]["delta_ms"]) <= data["step"]["noise_ms"]


@pytest.mark.parametrize("width", [1, 2, 4])
def test_a_window_of_a_second_run_shows_no_change_despite_spikes(
    tmp_path: Path, cli: Cli, width: int
) -> None:
    """A window of two steps moves with one spike: it is judged against blocks of as
    many steps elsewhere in its run."""
    a, b = _pair(tmp_path, [], noise=0.1, spikes=0.03)
    window = f"step-{10:06d}-{9 + width:06d}"
    for run in (a, b):
        (run / "traces" / window).mkdir(parents=True)
    data = _diff_json(cli, a / "traces" / window, b / "traces" / window)
    assert data["changes"] == [] and data["a"]["sampled_steps"] == width


def test_the_step_line_and_a_phase_row_show_one_quantity_on_both_sides(
    tmp_path: Path, cli: Cli
) -> None:
    """Two ranks that moved apart, with no collective to tie their steps: rank 0 30% slower,
    rank 1 from 60% slower to not at all. The median of every cell fell while the change
    most ranks share (rank 0's) rose: each line's A and B are of the ranks its delta is of."""
    phases = (PhaseSpec("work", "compute", 30.0),)
    a = write_timings(
        tmp_path / "a", ranks=2, steps=STEPS, seed=1, phases=phases,
        slowdowns=[Slowdown(1, "work", 0.6)],
    )  # fmt: skip
    b = write_timings(
        tmp_path / "b", ranks=2, steps=STEPS, seed=2, phases=phases,
        slowdowns=[Slowdown(0, "work", 0.3)],
    )  # fmt: skip
    data = _diff_json(cli, a, b)
    step = data["step"]
    assert step["b_ms"] < step["a_ms"]
    assert step["delta_ms"] == pytest.approx(step["b_ms"] - step["a_ms"])
    assert step["ranks"] == 2
    assert _named(data["changes"]) == [("work", 1), ("work", None)]
    rank, phase = data["changes"]
    assert 8 < phase["delta_ms"] < 10.5  # rank 0's +9 ms: the phase's figures are rank 0's
    assert phase["a"]["ranks"] == phase["b"]["ranks"] == 1
    moved = phase["b"]["median_ms"] - phase["a"]["median_ms"]
    assert moved == pytest.approx(phase["delta_ms"], abs=phase["noise_ms"])
    assert rank["delta_ms"] < -20 and rank["others_delta_ms"] == phase["delta_ms"]
    out = cli("diff", a, b)[1]
    (line,) = [line for line in out.splitlines() if line.startswith("step time")]
    found = re.search(r": ([0-9.]+) ms -> ([0-9.]+) ms \(([-+][0-9.]+) ms", line)
    assert found is not None, line
    a_ms, b_ms, delta_ms = map(float, found.groups())
    assert a_ms + delta_ms == pytest.approx(b_ms, abs=0.002) and delta_ms < 0, line
    # A rank's row says the others' change its delta is beyond: A + others + delta = B.
    assert f"rank 1 in phase work (others +{phase['delta_ms']:.3f})" in out


def _rows(data: dict[str, Any], sign: float = 1.0) -> list[tuple[Any, ...]]:
    return [
        (c["what"], c["phase"] or c["kernel"], c["rank"], sign * c["delta_ms"], c["noise_ms"])
        for key in ("changes", "unjudged")
        for c in data[key]
    ]


def _both_ways_pairs(root: Path) -> dict[str, tuple[Path, Path]]:
    """Pairs of runs (or windows) whose rows once depended on which side was A."""
    two = (PhaseSpec("forward", "compute", 30.0), PhaseSpec("other", "compute", 30.0))
    # B's step is 50% longer (other twice as long), so a share of A's step time was a
    # lower floor than a share of B's: forward's +0.73 ms cleared one (0.60), not the other.
    longer = [Slowdown(r, "forward", 0.025) for r in range(RANKS)]
    longer += [Slowdown(r, "other", 1.0) for r in range(RANKS)]
    floor = _pair(root / "floor", longer, phases=two, noise=0.003)
    # No noise: rank 0 10% slower, rank 1 10% faster. Of the two middle changes, +3 and -3
    # ms, the one "nearer zero" was -3 both ways round, so the rows were not the same.
    work = (PhaseSpec("work", "compute", 30.0),)
    even = tuple(
        write_timings(
            root / f"even-{name}", ranks=2, steps=STEPS, seed=seed, phases=work, noise=0.0,
            slowdowns=slow,
        )
        for name, seed, slow in (
            ("a", 1, []), ("b", 2, [Slowdown(0, "work", 0.1), Slowdown(1, "work", -0.1)])
        )
    )  # fmt: skip
    ddp = _pair(root / "ddp", [Slowdown(2, "forward", 0.5), Slowdown(1, "optimizer", -0.4)])
    # Kernels alone (the timer sampled none of the window's steps), the floor a share of
    # the traces' own time: A's 20 ms against B's 36 ms.
    kernels = tuple(
        write_timings(root / f"k-{n}", ranks=RANKS, steps=10, every_n_steps=10, seed=n)
        for n in (1, 2)
    )
    window = "step-000003-000004"
    _window(kernels[0], window, {GEMM: (10, 20_000.0), "small": (4, 200.0)})
    _window(kernels[1], window, {GEMM: (10, 36_000.0), "small": (4, 500.0)})
    return {
        "floor": floor,
        "even": (even[0], even[1]),
        "ddp": ddp,
        "kernels": (kernels[0] / "traces" / window, kernels[1] / "traces" / window),
    }


@pytest.mark.parametrize("case", ["floor", "even", "ddp", "kernels"])
def test_b_against_a_lists_the_rows_of_a_against_b_with_opposite_signs(
    tmp_path: Path, cli: Cli, case: str
) -> None:
    a, b = _both_ways_pairs(tmp_path)[case]
    forth, back = _diff_json(cli, a, b), _diff_json(cli, b, a)
    assert _rows(forth), case  # each pair has a change to list
    # Exactly: each rule takes A and B alike, and B less A is A less B negated.
    assert sorted(_rows(back, -1.0), key=repr) == sorted(_rows(forth), key=repr)
    assert back["floor_ms"] == forth["floor_ms"]
    assert back["within_noise"] == forth["within_noise"]
    if forth["step"] is not None:
        assert back["step"]["delta_ms"] == -forth["step"]["delta_ms"]
        assert back["step"]["noise_ms"] == forth["step"]["noise_ms"]


def test_a_floor_is_a_share_of_the_shorter_step_time(tmp_path: Path) -> None:
    a, b = _both_ways_pairs(tmp_path)["floor"]
    forth = diff_runs(a, b, workers=1)
    assert [(c.name, c.rank) for c in forth.changes] == [("other", None), ("forward", None)]
    assert forth.step is not None and forth.step["a_ms"] < forth.step["b_ms"]
    assert forth.floor_ms == pytest.approx(0.01 * forth.step["a_ms"], rel=0.01)
    assert diff_runs(b, a, workers=1).floor_ms == forth.floor_ms


def test_two_ranks_that_moved_apart_evenly_are_each_a_row(tmp_path: Path) -> None:
    a, b = _both_ways_pairs(tmp_path)["even"]
    rows = [(c.what, c.rank, c.delta_ms, c.others_ms) for c in diff_runs(a, b).changes]
    assert sorted(rows, key=repr) == [("rank", 0, 3.0, 0.0), ("rank", 1, -3.0, 0.0)]


def test_a_run_against_itself_changes_nothing(tmp_path: Path, cli: Cli) -> None:
    a = write_timings(tmp_path / "a", ranks=RANKS, steps=STEPS)
    data = _diff_json(cli, a, a)
    assert data["changes"] == [] and data["step"]["delta_ms"] == 0
    code, out, _ = cli("diff", a, a)
    assert code == 0 and "No change above noise" in out


def test_a_larger_noise_factor_or_share_leaves_a_small_change_out(tmp_path: Path, cli: Cli) -> None:
    a, b = _pair(tmp_path, [Slowdown(r, "optimizer", 0.5) for r in range(RANKS)])  # +4 ms
    assert _named(_diff_json(cli, a, b)["changes"]) == [("optimizer", None)]
    assert _diff_json(cli, a, b, "--min-share", "0.05")["changes"] == []
    assert _diff_json(cli, a, b, "--noise", "30")["changes"] == []  # 0.3 ms spread


def test_a_phase_new_in_b_is_a_change_of_its_whole_time(tmp_path: Path) -> None:
    phases = (*DDP_PHASES, PhaseSpec("checkpoint", "io", 12.0))
    a = write_timings(tmp_path / "a", ranks=RANKS, steps=STEPS, seed=1)
    b = write_timings(tmp_path / "b", ranks=RANKS, steps=STEPS, seed=2, phases=phases)
    (change,) = diff_runs(a, b).changes
    assert (change.name, change.rank, change.a) == ("checkpoint", None, None)
    assert change.delta_ms == pytest.approx(12.0, rel=0.1) and change.relative is None


def test_device_times_are_compared_with_time_device(tmp_path: Path, cli: Cli) -> None:
    a, b = _pair(tmp_path, [Slowdown(r, "forward", 0.5) for r in range(RANKS)], gpu=True)
    data = _diff_json(cli, a, b, "--time", "device")
    assert data["time"] == "device" and _named(data["changes"]) == [("forward", None)]
    assert data["changes"][0]["a"]["median_ms"] == pytest.approx(30 * 0.97, rel=0.05)


# -- windows and kernels --------------------------------------------------------------------


def _window(
    run: Path, window: str, kernels: dict[str, tuple[int, float]], ranks: int = RANKS
) -> None:
    """A captured window of `ranks` ranks: a trace, and its summary in the documented format
    (`kernels`: name -> (count, total us) per rank, a little more on higher ranks)."""
    for rank in range(ranks):
        trace = trace_path(run, window, rank, gzip=False)
        trace.parent.mkdir(parents=True, exist_ok=True)
        trace.write_text('{"traceEvents": []}', encoding="utf-8")
        items = [
            {
                "name": name,
                "count": count,
                "total_us": total * (1 + 0.01 * rank),
                "mean_us": total * (1 + 0.01 * rank) / count,
                "min_us": 1.0,
                "max_us": total * (1 + 0.01 * rank) / count,
                "share": 0.0,
            }
            for name, (count, total) in kernels.items()
        ]
        summary = {
            "v": 2,
            "trace": trace.name,
            "rank": rank,
            "window": window,
            "kind": "gpu_kernels",
            "count": sum(item["count"] for item in items),
            "total_us": sum(item["total_us"] for item in items),
            "items": items,
            "categories": [],
        }
        path = summary_path(run, window, rank)
        path.write_text(json.dumps(summary), encoding="utf-8")
        later = trace.stat().st_mtime + 5  # a summary older than its trace is not used
        os.utime(path, (later, later))


GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas"
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def test_window_against_window_names_the_kernel_that_grew(tmp_path: Path, cli: Cli) -> None:
    a, b = _pair(tmp_path, [])
    _window(a, WINDOW, {GEMM: (10, 20_000.0), NCCL: (4, 5_000.0)})
    _window(b, WINDOW, {GEMM: (20, 40_000.0), NCCL: (4, 5_000.0), "new_kernel": (2, 6_000.0)})
    data = _diff_json(cli, a / "traces" / WINDOW, b / "traces" / WINDOW)
    assert data["a"]["window"] == WINDOW and data["a"]["steps"] == [4, 5]
    assert data["a"]["traces"] == RANKS and data["a"]["sampled_steps"] == 2
    assert _named(data["changes"]) == [(GEMM, None), ("new_kernel", None)]
    gemm, new = data["changes"]
    assert gemm["what"] == "kernel" and gemm["kind"] == "gpu_kernels" and gemm["phase"] is None
    # 20 ms more per rank in a window of 2 steps: 10 ms per step.
    assert gemm["delta_ms"] == pytest.approx(10.0 * 1.015, rel=0.01)
    assert gemm["a"]["count_per_step"] == 5 and gemm["b"]["count_per_step"] == 10
    assert gemm["a"]["count"] == 10 * RANKS and gemm["a"]["traces"] == RANKS
    assert new["a"] is None and new["relative"] is None
    assert data["compared"]["kernels"] == 3 and data["compared"]["phases"]


def test_runs_with_windows_compare_their_kernels_too(tmp_path: Path, cli: Cli) -> None:
    a, b = _pair(tmp_path, [])
    _window(a, WINDOW, {GEMM: (10, 20_000.0)})
    _window(b, "step-000010-000011", {GEMM: (10, 20_000.0)})
    data = _diff_json(cli, a, b)
    assert data["changes"] == [] and data["compared"]["kernels"] == 1


def test_two_windows_of_one_job_with_a_trace_a_side_list_no_kernel_change(
    tmp_path: Path, cli: Cli
) -> None:
    """One trace a side has no spread to judge noise by: two windows of the same job differ
    in their ops as chance makes them (here addmm by 30%), and that is no change."""
    run = write_timings(tmp_path / "run", ranks=RANKS, steps=STEPS, seed=1)
    ops = {"aten::addmm": (40, 18_000.0), "aten::mm": (20, 4_000.0)}
    _window(run, WINDOW, ops, ranks=1)
    _window(run, "step-000020-000021", {**ops, "aten::addmm": (40, 24_000.0)}, ranks=1)
    data = _diff_json(cli, run / "traces" / WINDOW, run / "traces" / "step-000020-000021")
    assert [c for c in data["changes"] if c["what"] == "kernel"] == []
    (addmm,) = data["unjudged"]  # aten::mm moved less than the floor
    assert addmm["kernel"] == "aten::addmm" and addmm["noise_ms"] is None
    assert addmm["delta_ms"] == pytest.approx(3.0)  # 6 ms more over a window of 2 steps
    assert data["compared"]["kernels"] == 2
    assert any("too few (3 a side) to judge their noise" in note for note in data["notes"])
    code, out, _ = cli("diff", run / "traces" / WINDOW, run / "traces" / "step-000020-000021")
    assert code == 0 and "not judged against noise" in out and "kernel aten::addmm" in out
    assert "1 kernel change(s) not judged (too few traces)" in out


def test_a_window_whose_steps_were_not_sampled_compares_kernels_alone(
    tmp_path: Path, cli: Cli
) -> None:
    a = write_timings(tmp_path / "a", ranks=RANKS, steps=10, every_n_steps=10, seed=1)
    b = write_timings(tmp_path / "b", ranks=RANKS, steps=10, every_n_steps=10, seed=2)
    window = "step-000003-000004"  # the timer sampled steps 0, 10, 20, ...
    _window(a, window, {GEMM: (10, 20_000.0)})
    _window(b, window, {GEMM: (10, 60_000.0)})
    data = _diff_json(cli, a / "traces" / window, b / "traces" / window)
    assert _named(data["changes"]) == [(GEMM, None)]
    assert data["compared"]["phases"] == [] and data["step"] is None
    assert any("no timings at steps 3-4" in note for note in data["notes"])


# -- bad input ------------------------------------------------------------------------------


def _one_line_error(cli: Cli, *argv: object) -> str:
    code, out, err = cli("diff", *argv)
    assert (code, out) == (2, ""), (code, out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, cli: Cli) -> None:
    run = write_timings(tmp_path / "run", ranks=2, steps=5)
    assert "no such directory" in _one_line_error(cli, tmp_path / "missing", run)
    (tmp_path / "empty").mkdir()
    err = _one_line_error(cli, run, tmp_path / "empty")
    assert "neither a run directory" in err and "empty" in err
    (tmp_path / "file").write_text("x")
    assert "not a directory" in _one_line_error(cli, tmp_path / "file", run)
    assert "--noise" in _one_line_error(cli, run, run, "--noise", "0")
    assert "--min-share" in _one_line_error(cli, run, run, "--min-share", "1.5")


def test_runs_with_no_phase_in_common_are_refused(tmp_path: Path, cli: Cli) -> None:
    a = write_timings(tmp_path / "a", ranks=2, steps=5, phases=(PhaseSpec("load"),))
    b = write_timings(tmp_path / "b", ranks=2, steps=5, phases=(PhaseSpec("train"),))
    err = _one_line_error(cli, a, b, "--json")
    assert "nothing to compare" in err and "no phase in common" in err and "load" in err


def test_device_times_of_a_run_without_a_gpu_are_refused(tmp_path: Path, cli: Cli) -> None:
    a, b = _pair(tmp_path, [])
    err = _one_line_error(cli, a, b, "--time", "device")
    assert "nothing to compare" in err and "no device times" in err


def test_a_run_without_timings_or_traces_is_refused(tmp_path: Path, cli: Cli) -> None:
    a = write_timings(tmp_path / "a", ranks=2, steps=5)
    (tmp_path / "b" / "meta").mkdir(parents=True)
    err = _one_line_error(cli, a, tmp_path / "b")
    assert "nothing to compare" in err and "no timings" in err


def test_bad_lines_are_skipped_and_said(tmp_path: Path, cli: Cli) -> None:
    a, b = _pair(tmp_path, [Slowdown(r, "forward", 0.5) for r in range(RANKS)])
    with timing_path(b, 1).open("a", encoding="utf-8") as fh:
        fh.write('{"v": 1, "rank": 1, "step": "x"}\nnot json\n')
    data = _diff_json(cli, a, b)
    assert _named(data["changes"]) == [("forward", None)]
    assert any(line.startswith("B: ") and "rank-00001" in line for line in data["skipped"])
    code, out, _ = cli("diff", a, b)
    assert code == 0 and "Skipped input" in out


# -- output ---------------------------------------------------------------------------------


def test_the_terminal_and_the_page_show_the_top_change(tmp_path: Path, cli: Cli) -> None:
    odd = "<script>alert('x')</script>&"
    phases = (PhaseSpec(odd, "compute", 20.0), *DDP_PHASES[1:])
    a = write_timings(tmp_path / "a", ranks=RANKS, steps=STEPS, seed=1, phases=phases)
    slow = [Slowdown(r, odd, 1.0) for r in range(RANKS)]
    b = write_timings(
        tmp_path / "b", ranks=RANKS, steps=STEPS, seed=2, phases=phases, slowdowns=slow
    )
    page = tmp_path / "diff.html"
    code, out, err = cli("diff", a, b, "--html", page)
    assert (code, err) == (0, "")
    assert f"phase {odd}" in out and "1 change(s) above noise" in out and str(page) in out
    text = page.read_text(encoding="utf-8")
    assert "phase &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&amp;" in text
    assert "<script" not in text and "http" not in text.replace('http-equiv="', "")
    assert "Content-Security-Policy" in text and "step time (median)" in text
    data = _diff_json(cli, a, b, "--html", page)
    assert data["html"] == str(page) and data["changes"][0]["phase"] == odd


def test_b_against_a_is_said_as_stragglers_says_a_ratio(tmp_path: Path, cli: Cli) -> None:
    """A 0.2 ms phase made 250 times as long is "250x", as `rankscope stragglers` says it,
    not "+24900%"; a phase made half as long again is "+50%"."""
    phases = (PhaseSpec("work", "compute", 30.0), PhaseSpec("tiny", "compute", 0.2))
    slow = [Slowdown(r, p, f) for r in range(RANKS) for p, f in (("tiny", 249.0), ("work", 0.5))]
    a, b = _pair(tmp_path, slow, phases=phases)
    page = tmp_path / "diff.html"
    data = _diff_json(cli, a, b)
    tiny, work = data["changes"]
    assert (tiny["phase"], work["phase"]) == ("tiny", "work")
    said, work_said = (ratio_text(1 + change["relative"]) for change in (tiny, work))
    assert re.fullmatch(r"2[45][0-9]x", said) and re.fullmatch(r"\+(49|50|51)%", work_said)
    step = data["step"]
    step_said = ratio_text(step["b_ms"] / step["a_ms"])
    assert step_said.endswith("x")
    code, out, _ = cli("diff", a, b, "--html", page)
    assert code == 0 and "%" not in out.replace(work_said, "")
    (row,) = [line for line in out.splitlines() if "phase tiny" in line]
    assert row.split()[-2:] == [said, f"{tiny['noise_ms']:.3f}"], row
    (line,) = [line for line in out.splitlines() if line.startswith("step time")]
    assert line.endswith(f" ms, {step_said})"), line
    text = page.read_text(encoding="utf-8")
    assert f"<td>{said}</td>" in text and f"<td>{work_said}</td>" in text
    assert f"{step_said})" in text and "%" not in text.replace(work_said, "")


def test_a_page_that_cannot_be_written_whole_leaves_what_was_there(tmp_path: Path) -> None:
    """The page is written beside its name and renamed: a write cut short (here by a file
    size limit of 512 bytes, as a full disk would) leaves the old page and no temporary."""
    import resource
    import subprocess
    import sys

    import rankscope

    a, b = _pair(tmp_path, [Slowdown(r, "forward", 0.5) for r in range(RANKS)])
    out = tmp_path / "out"
    out.mkdir()
    page = out / "diff.html"
    page.write_text("the page of an earlier diff\n", encoding="utf-8")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, resource.RLIM_INFINITY))

    src = str(Path(rankscope.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": src, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "rankscope.cli", "diff", str(a), str(b), "--html", str(page)],
        capture_output=True, text=True, env=env, preexec_fn=limit, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert page.read_text(encoding="utf-8") == "the page of an earlier diff\n"
    assert sorted(p.name for p in out.iterdir()) == ["diff.html"]
    (line,) = done.stderr.strip().splitlines()
    assert line == f"rankscope diff: {page}: File too large", line


# -- a real job: two spawned gloo ranks, the same loop run twice ----------------------------

REAL_STEPS = 24
BASE_S = 0.02
EXTRA_S = 0.03  # the sleep added to forward in run B
REAL_WINDOW = "step-000004-000005"


def _same_loop_twice(rank: int, world_size: int, root: str) -> None:
    import torch
    import torch.distributed as dist

    import rankscope

    from .._helpers import tiny_model

    for name, extra in (("a", 0.0), ("b", EXTRA_S)):
        config = rankscope.ProfileConfig(
            output_dir=Path(root) / name,
            timer=rankscope.TimerConfig(enable=True, every_n_steps=1),
            trace=rankscope.TraceConfig(
                enable=True, ranks="all", schedule=rankscope.Schedule(wait=3, active=2)
            ),
        )
        model, opt = tiny_model()
        with rankscope.Profiler(config) as prof:
            for _ in range(REAL_STEPS):
                with prof.phase("forward"):
                    time.sleep(BASE_S + extra)
                    loss = model(torch.randn(4, 8)).sum()
                with prof.phase("backward"):
                    loss.backward()
                with prof.phase("loss_allreduce", kind="comm"):
                    dist.all_reduce(loss.detach())
                opt.step()
                opt.zero_grad()
                prof.step()
        dist.barrier()


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory: pytest.TempPathFactory, gloo_ranks: GlooRanks) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("diff-real")
    gloo_ranks.run(_same_loop_twice, 2, root)
    yield root


@pytest.mark.slow
def test_a_real_job_made_slower_in_one_phase_names_that_phase_alone(
    real_runs: Path, cli: Cli
) -> None:
    data = _diff_json(cli, real_runs / "a", real_runs / "b")
    assert _named(data["changes"]) == [("forward", None)]
    assert data["changes"][0]["delta_ms"] == pytest.approx(EXTRA_S * 1000, rel=0.3)
    assert data["a"]["ranks"] == data["b"]["ranks"] == 2
    assert data["compared"]["phases"] == ["forward", "backward", "loss_allreduce"]
    assert data["compared"]["kernels"] > 0  # the captured windows' CPU ops
    assert data["skipped"] == []


@pytest.mark.serial
@pytest.mark.slow
def test_a_real_window_against_its_twin_names_the_slower_phase_first(
    real_runs: Path, cli: Cli
) -> None:
    a, b = (real_runs / name / "traces" / REAL_WINDOW for name in ("a", "b"))
    data = _diff_json(cli, a, b)
    assert data["a"]["traces"] == data["b"]["traces"] == 2
    assert data["a"]["sampled_steps"] == 2
    assert _named(data["changes"])[:1] == [("forward", None)]
    assert data["compared"]["kernels"] > 0
