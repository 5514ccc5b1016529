"""Why a rank is slow (analysis/stragglers/_cause.py): each cause class from the evidence that
tells it, and said as unclear where the evidence does not."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import rankscope
from rankscope import ConfigError
from rankscope.analysis import (
    analyse_stragglers,
    find_stragglers,
    matrices_of,
    read_run_meta,
    read_run_records,
)
from rankscope.analysis.read._values import PhaseValues, read_phase_values
from rankscope.testing._gloo import GlooRanks
from rankscope.testing._synthetic import Slowdown, write_timings
from rankscope.timing._record import format_attempt

from .._cost_workers import train_with_uneven_data


def _found(run: Path, values: bool = True) -> rankscope.analysis.StragglerReport:
    meta = read_run_meta(run)
    m = matrices_of(read_run_records(run))
    return find_stragglers(
        m,
        hosts=meta.hosts,
        groups=meta.groups,
        values=(lambda phases: read_phase_values(run, m.ranks, m.steps, phases))
        if values
        else None,
    )


def _causes(found: rankscope.analysis.StragglerReport) -> dict[tuple[int, str], str]:
    return {(f.rank, f.phase): f.cause.kind for f in found.findings if f.cause is not None}


def _set_groups(run: Path, groups: dict[int, dict[str, object]]) -> None:
    """Give ranks parallel groups in their meta files, as Profiler(groups=...) writes them."""
    for rank, named in groups.items():
        path = run / "meta" / f"rank-{rank:05d}.json"
        data = json.loads(path.read_text())
        data["groups"] = named
        path.write_text(json.dumps(data))


def test_a_rank_slow_at_every_step_is_persistent_and_says_data_is_not_ruled_out(
    tmp_path: Path,
) -> None:
    write_timings(tmp_path, ranks=8, steps=40, slowdowns=[Slowdown(2, "forward", 0.4)])
    found = _found(tmp_path)
    assert _causes(found) == {(2, "forward"): "persistent"}
    cause = next(f.cause for f in found.findings if f.cause is not None)
    assert cause.could_be == ("persistent", "data-driven")
    assert "fastest steps included" in cause.text
    assert 'prof.phase("forward", tokens=n)' in cause.text
    assert all(f.cause is None for f in found.findings if f.role == "waits")


def test_a_loader_slow_at_every_step_is_its_own_loading_not_the_machine(tmp_path: Path) -> None:
    # A CPU job's collator sleeping at every batch was called "the machine (or its
    # device) more than the data".
    write_timings(tmp_path, ranks=8, steps=40, slowdowns=[Slowdown(2, "host_to_device", 2.0)])
    found = _found(tmp_path)
    (slow,) = [f for f in found.findings if f.role == "slow"]
    assert (slow.rank, slow.phase, slow.kind) == (2, "host_to_device", "data")
    assert slow.cause is not None and slow.cause.kind == "persistent"
    assert "its own loading (its storage, its loader's workers" in slow.cause.text
    assert "the machine" not in slow.cause.text


def test_a_stage_slow_together_is_partitioning_by_its_group(tmp_path: Path) -> None:
    slow = [Slowdown(r, "forward", 0.4) for r in (6, 7)]
    write_timings(tmp_path, ranks=8, steps=40, slowdowns=slow, ranks_per_host=8)
    _set_groups(tmp_path, {r: {"pipeline_stage": r // 2} for r in range(8)})
    found = _found(tmp_path)
    assert _causes(found) == {(6, "forward"): "partitioning", (7, "forward"): "partitioning"}
    text = next(f.cause.text for f in found.findings if f.cause is not None)
    assert "ranks 6, 7 are slow together in forward, the ranks with pipeline_stage=3" in text


def test_a_whole_host_slow_together_is_said_to_be_unclear(tmp_path: Path) -> None:
    slow = [Slowdown(r, "forward", 0.4) for r in (6, 7)]
    write_timings(tmp_path, ranks=8, steps=40, slowdowns=slow, ranks_per_host=2)
    found = _found(tmp_path)
    assert _causes(found) == {(6, "forward"): "unclear", (7, "forward"): "unclear"}
    cause = next(f.cause for f in found.findings if f.cause is not None)
    assert cause.could_be == ("persistent", "partitioning")
    host = read_run_meta(tmp_path).hosts[6]
    assert f"every rank of host {host}: the machine, or how the work is split" in cause.text


def test_one_slow_rank_of_a_group_is_not_partitioning(tmp_path: Path) -> None:
    write_timings(tmp_path, ranks=8, steps=40, slowdowns=[Slowdown(6, "forward", 0.4)])
    _set_groups(tmp_path, {r: {"pipeline_stage": r // 2} for r in range(8)})
    assert _causes(_found(tmp_path)) == {(6, "forward"): "persistent"}


def test_a_rank_slow_now_and_then_is_intermittent(tmp_path: Path) -> None:
    write_timings(
        tmp_path, ranks=4, steps=60, slowdowns=[Slowdown(1, "forward", 1.0, share=0.7)], seed=3
    )
    found = _found(tmp_path)
    assert _causes(found) == {(1, "forward"): "intermittent"}
    cause = next(f.cause for f in found.findings if f.cause is not None)
    assert "not at its fastest" in cause.text and "data-driven" in cause.could_be


def test_values_are_summed_per_step_and_a_restarted_file_is_left_out(tmp_path: Path) -> None:
    timings = tmp_path / "timings"
    timings.mkdir()

    def line(rank: int, step: int, **meta: object) -> str:
        record = {
            "v": 1,
            "rank": rank,
            "step": step,
            "phase": "fwd",
            "kind": "compute",
            "start_ns": 1,
            "cpu_ms": 1.0,
            "gpu_ms": None,
            "depth": 0,
            "error": False,
            "meta": meta,
        }
        return json.dumps(record, separators=(",", ":")) + "\n"

    (timings / "rank-00000.jsonl").write_text(
        line(0, 0, tokens=3)
        + line(0, 0, tokens=4, name="x")
        + line(0, 1, tokens=True)
        + line(1, 1, tokens=9)  # another rank's line in rank 0's file: not rank 0's value
    )

    def attempt(token: str) -> str:
        return format_attempt(1, {"attempt": token, "started_ns": 1, "restart": 0, "pid": 1})

    (timings / "rank-00001.jsonl").write_text(
        attempt("a") + line(1, 0, tokens=5) + attempt("b") + line(1, 0, tokens=6)
    )
    got = read_phase_values(tmp_path, [0, 1], [0, 1], {"fwd"})
    tokens = got.of("fwd")["tokens"]
    assert tokens[0, 0] == 7.0  # two invocations in step 0: 3 + 4
    assert np.isnan(tokens[0, 1])  # true is no number
    assert np.isnan(tokens[1]).all()  # rank 1's file holds two attempts: left out, said
    assert "1 file(s) that hold several attempts" in got.notes[0]
    assert set(got.of("fwd")) == {"tokens"}  # "x" is no number
    assert read_phase_values(tmp_path, [0, 1], [0, 1], {"bwd"}).values == {}


def test_a_value_that_does_not_explain_the_excess_is_said(tmp_path: Path) -> None:
    write_timings(tmp_path, ranks=4, steps=40, slowdowns=[Slowdown(2, "forward", 0.5)])
    meta = read_run_meta(tmp_path)
    m = matrices_of(read_run_records(tmp_path))
    same = PhaseValues({"forward": {"tokens": np.full((4, len(m.steps)), 1024.0)}})
    found = find_stragglers(m, hosts=meta.hosts, values=lambda phases: same)
    cause = next(f.cause for f in found.findings if f.cause is not None)
    assert cause.kind == "persistent" and cause.could_be == ()
    assert re.search(r"per tokens it is still \+\d+% vs the others$", cause.text)


def test_groups_are_checked_where_the_profiler_is_made(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="groups"):
        rankscope.Profiler({"output_dir": str(tmp_path)}, groups={"stage": 1.5})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="groups"):
        rankscope.Profiler({"output_dir": str(tmp_path)}, groups={"": 1})


@pytest.mark.slow
def test_a_rank_given_more_tokens_is_data_driven_in_a_real_job(
    tmp_path: Path, gloo_ranks: GlooRanks
) -> None:
    """3 gloo ranks at one speed per token; rank 1 gets 4x the tokens at 3 steps in 4 and
    records them with prof.phase("forward", tokens=n)."""
    gloo_ranks.run(train_with_uneven_data, 3, tmp_path, 1)
    assert read_run_meta(tmp_path).groups == {r: {"data_parallel": r} for r in range(3)}
    assert read_run_records(tmp_path).valued == {"forward"}  # read whole by DuckDB
    # A file read line by line (a bad line in it) says the same.
    with (tmp_path / "timings" / "rank-00002.jsonl").open("a") as fh:
        fh.write("not json\n")
    records = read_run_records(tmp_path)
    assert records.valued == {"forward"} and any("not valid JSON" in s for s in records.skipped)
    found = _found(tmp_path)
    assert _causes(found) == {(1, "forward"): "data-driven"}
    cause = next(f.cause for f in found.findings if f.cause is not None)
    assert "its tokens was 4.00x the other ranks'" in cause.text
    # Without the values the same finding is only a guess between machine and data.
    blind = _found(tmp_path, values=False)
    (guess,) = [f.cause for f in blind.findings if f.cause is not None]
    assert guess is not None and "data-driven" in guess.could_be


def test_values_that_cannot_tell_are_said_as_such(tmp_path: Path) -> None:
    write_timings(tmp_path, ranks=4, steps=40, slowdowns=[Slowdown(2, "forward", 0.5)])
    m = matrices_of(read_run_records(tmp_path))
    zeros = PhaseValues({"forward": {"tokens": np.zeros((4, len(m.steps)))}})
    found = find_stragglers(m, values=lambda phases: zeros)
    cause = next(f.cause for f in found.findings if f.cause is not None)
    assert "its tokens cannot tell: fewer than 3 of its steps have a value above 0" in cause.text
    assert "no per-step value is recorded" not in cause.text
    assert "data-driven" in cause.could_be  # not ruled out


def test_a_ratio_just_below_one_reads_as_no_change() -> None:
    from rankscope.analysis.stragglers._findings import ratio_text

    assert ratio_text(0.998) == "+0%" and ratio_text(0.99) == "-1%" and ratio_text(1.004) == "+0%"


def _slow_in_data(rank: int, world: int, run_dir: str, how: str) -> None:
    """Three ranks over gloo: rank 1 takes 6 ms more in data at every step, by sleeping
    or by running on the CPU, then all meet at an all-reduce."""
    import time

    import torch
    import torch.distributed as dist

    config = rankscope.ProfileConfig(
        output_dir=run_dir, timer=rankscope.TimerConfig(enable=True, every_n_steps=1)
    )
    queued = spun = 0  # rank 1's spins: ns waiting for a CPU, ns of wall time
    with rankscope.Profiler(config) as prof:
        for _ in range(40):
            with prof.phase("data", kind="data"):
                if rank == 1 and how == "sleep":
                    time.sleep(0.006)
                elif rank == 1:
                    waited, wall = _run_delay_ns(), time.perf_counter_ns()
                    began = time.thread_time_ns()
                    while time.thread_time_ns() - began < 6_000_000:
                        pass
                    queued += _run_delay_ns() - waited
                    spun += time.perf_counter_ns() - wall
            with prof.phase("sync", kind="comm"):
                dist.all_reduce(torch.ones(8))
            prof.step()
    if rank == 1 and how == "spin":
        (Path(run_dir) / "spin.json").write_text(json.dumps({"queued": queued, "spun": spun}))


def _run_delay_ns() -> int:
    """This thread's time waiting for a CPU so far (the kernel's run_delay)."""
    return int(Path("/proc/thread-self/schedstat").read_text().split()[1])


@pytest.mark.parametrize(("how", "said"), [("sleep", "off the CPU"), ("spin", "ran on a CPU")])
def test_a_slow_ranks_extra_time_is_said_on_the_cpu_or_off_it(
    tmp_path: Path, gloo_ranks: GlooRanks, how: str, said: str
) -> None:
    gloo_ranks.run(_slow_in_data, 3, tmp_path, how)
    report = analyse_stragglers(tmp_path).report
    (slow,) = [f for f in report.findings if f.role == "slow"]
    assert (slow.rank, slow.phase) == (1, "data")
    sayings = [said]
    if how == "spin":
        # On a busy machine the spinning rank can spend as long waiting for a core as on
        # it: the truth, measured by the rank itself, is then the wait (near half and
        # half, the analysis's medians over steps may fall either way).
        spin = json.loads((tmp_path / "spin.json").read_text())
        share = spin["queued"] / spin["spun"]
        if share >= 0.35:
            sayings = ["waited for a CPU"] + (sayings if share < 0.65 else [])
    assert slow.cause is not None, how
    assert any(s in slow.cause.text for s in sayings), (slow.cause.text, sayings)
