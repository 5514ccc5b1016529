"""Pipeline-shaped runs (testing/_pipeline.py): a slow stage is one finding with its price."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rankscope.analysis import StragglerOptions, analyse_stragglers, phase_matrices, read_timings
from rankscope.analysis.pipeline._replay import Replay
from rankscope.analysis.pipeline._replay_build import build_replay
from rankscope.analysis.read._timed import read_timed_run
from rankscope.analysis.stragglers._arrivals import ends_in_collective
from rankscope.analysis.stragglers._findings import cost_lines
from rankscope.analysis.stragglers._model import model_fit
from rankscope.rundir._layout import timing_path
from rankscope.testing._pipeline import Pipeline, SlowStage, write_pipeline
from rankscope.testing._synthetic import Uneven


def _step_ms(run: Path, time: str = "host") -> float:
    m = phase_matrices(read_timings(run), time=time)
    return float(np.nanmean(np.nanmedian(m.ms[m.index("step")], axis=0)))


def test_a_slow_last_stage_is_one_group_over_forward_and_backward(tmp_path: Path) -> None:
    write_pipeline(tmp_path / "slow", slow=[SlowStage(3, 1.0)])
    write_pipeline(tmp_path / "even")  # the same seed: the same noise
    report = analyse_stragglers(tmp_path / "slow").report
    (group,) = report.groups
    assert (group.name, group.ranks, group.phases) == (
        "pipeline_stage=3",
        (6, 7),
        ("backward", "forward"),
    )
    truth = _step_ms(tmp_path / "slow") - _step_ms(tmp_path / "even")
    assert group.cost is not None and report.cost is not None
    assert group.cost.step_ms_saved == pytest.approx(truth, rel=0.15)
    assert report.cost.step_ms_saved >= group.cost.step_ms_saved
    fit = model_fit(report)
    assert fit is not None and abs(fit - 1) <= 0.15  # the model fits this pipeline's step
    said = report.to_dict()
    assert said["summary"][0].startswith(
        "pipeline_stage=3 (ranks 6, 7) is slow in backward and forward as a group"
    )
    # The earlier stages wait for it in their recv (a stage that sends more is not waiting).
    assert said["summary"][0].endswith("; ranks 0-5 wait for it in pp_recv")
    assert said["groups"][0]["waiting"] == [{"phase": "pp_recv", "ranks": [0, 1, 2, 3, 4, 5]}]
    lines = cost_lines(said)
    assert lines[0].startswith("fixing pipeline_stage=3 in backward and forward saves")


@pytest.mark.parametrize("time", ["host", "device"])
def test_the_ranks_that_wait_in_their_recv_are_named_on_either_clock(
    tmp_path: Path, time: str
) -> None:
    write_pipeline(tmp_path, slow=[SlowStage(3, 1.0)], gpu=True)
    report = analyse_stragglers(tmp_path, StragglerOptions(time=time)).report
    (group,) = report.groups
    assert group.waiting == (("pp_recv", (0, 1, 2, 3, 4, 5)),)
    assert report.summary[0].endswith("; ranks 0-5 wait for it in pp_recv")


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_slow_stage_is_priced_by_replaying_the_schedule(
    tmp_path: Path, schedule: str, stage: int
) -> None:
    # 1F1B hides part of an early stage's extra work in the later stages' bubbles: the
    # segment model priced a slow first stage 41% high, a second 23%, though its step
    # fitted the measured one.
    shape = Pipeline(schedule=schedule)
    write_pipeline(tmp_path / "slow", shape=shape, slow=[SlowStage(stage, 1.0)])
    write_pipeline(tmp_path / "even", shape=shape)
    report = analyse_stragglers(tmp_path / "slow").report
    (group,) = report.groups
    truth = _step_ms(tmp_path / "slow") - _step_ms(tmp_path / "even")
    assert group.cost is not None
    assert group.cost.step_ms_saved == pytest.approx(truth, rel=0.02)
    fit = model_fit(report)
    assert fit is not None and abs(fit - 1) <= 0.01


def test_on_device_time_the_replay_prices_a_slow_stage(tmp_path: Path) -> None:
    # The host's clock says when a GPU op was launched, not when it ran: the replay
    # reads the order of the ops and their device times alone.
    shape = Pipeline(schedule="1f1b")
    write_pipeline(tmp_path / "slow", shape=shape, slow=[SlowStage(0, 1.0)], gpu=True)
    write_pipeline(tmp_path / "even", shape=shape, gpu=True)
    report = analyse_stragglers(tmp_path / "slow", StragglerOptions(time="device")).report
    truth = _step_ms(tmp_path / "slow", "device") - _step_ms(tmp_path / "even", "device")
    (group,) = report.groups
    assert group.cost is not None
    # The wire, unmeasured on device time, is fitted to the measured steps: taken as the
    # recv's own time, this priced 2% high.
    assert group.cost.step_ms_saved == pytest.approx(truth, rel=0.01)


def test_a_slow_rank_that_is_a_whole_stage_is_priced_by_the_replay(tmp_path: Path) -> None:
    shape = Pipeline(schedule="1f1b", stages=8, dp=1, microbatches=16)
    write_pipeline(tmp_path / "slow", shape=shape, slow=[SlowStage(1, 0.5)])
    write_pipeline(tmp_path / "even", shape=shape)
    report = analyse_stragglers(tmp_path / "slow").report
    assert not report.groups  # a stage of one rank: its findings are the rank's
    assert {f.rank for f in report.findings if f.role == "slow"} == {1}
    truth = _step_ms(tmp_path / "slow") - _step_ms(tmp_path / "even")
    assert report.cost is not None
    assert report.cost.step_ms_saved == pytest.approx(truth, rel=0.02)


def test_the_replay_runs_each_rank_in_its_own_order_and_reproduces_the_steps(
    tmp_path: Path,
) -> None:
    write_pipeline(tmp_path, shape=Pipeline(schedule="1f1b"), noise=0.1)
    run = read_timed_run(tmp_path)
    m = run.matrices
    replay = build_replay(m, set(ends_in_collective(m)), run.meta.groups)
    assert isinstance(replay, Replay) and replay.key == "pipeline_stage"
    assert replay.ok.all()
    measured = np.nanmedian(m.ms[m.index("step")], axis=0)
    assert replay.steps == pytest.approx(measured, rel=0.01)
    forward, backward = m.index("forward"), m.index("backward")
    first = [op for op in replay.ops[0] if op.phase in (forward, backward)]
    # Stage 0 of four runs three forwards before its first backward (1F1B's warm-up).
    assert [op.phase for op in first[:5]] == [forward] * 4 + [backward]
    # Without the groups that name the stages there is no pipeline to replay, and why.
    why = build_replay(m, set(ends_in_collective(m)), None)
    assert isinstance(why, str) and why.startswith("no parallel group numbers its stages")


def test_a_step_a_rank_ran_otherwise_is_left_to_the_segment_model(tmp_path: Path) -> None:
    write_pipeline(tmp_path, shape=Pipeline(schedule="1f1b"), slow=[SlowStage(0, 1.0)])
    # Rank 3 lost one forward record at step 5: that step is not replayed.
    path = timing_path(tmp_path, 3)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    dropped = next(i for i, line in enumerate(lines) if '"step":5,' in line and '"forward"' in line)
    path.write_text("".join(lines[:dropped] + lines[dropped + 1 :]), encoding="utf-8")
    run = read_timed_run(tmp_path)
    m = run.matrices
    replay = build_replay(m, set(ends_in_collective(m)), run.meta.groups)
    assert isinstance(replay, Replay)
    assert [s for s, ok in zip(m.steps, replay.ok, strict=True) if not ok] == [5]
    report = analyse_stragglers(tmp_path).report
    assert report.groups and report.groups[0].cost is not None


def test_one_slow_rank_of_a_stage_is_priced_by_the_replay(tmp_path: Path) -> None:
    # Rank 6 (stage 1 of replica 2) alone: its replica's pipeline, and through the loss
    # all-reduce every replica, waits for it.
    shape = Pipeline(schedule="1f1b", dp=4)
    write_pipeline(tmp_path / "slow", shape=shape, slow=[SlowStage(1, 1.0, replica=2)])
    write_pipeline(tmp_path / "even", shape=shape)
    report = analyse_stragglers(tmp_path / "slow").report
    assert not report.groups
    assert {(f.rank, f.phase) for f in report.findings if f.role == "slow"} == {
        (6, "forward"),
        (6, "backward"),
    }
    truth = _step_ms(tmp_path / "slow") - _step_ms(tmp_path / "even")
    assert report.cost is not None
    assert report.cost.step_ms_saved == pytest.approx(truth, rel=0.02)


@pytest.mark.parametrize("tokens", [1000, None])
def test_uneven_data_across_replicas_is_found_and_priced(
    tmp_path: Path, tokens: int | None
) -> None:
    # Each replica's data loads its every stage alike, a different replica each step:
    # the forward and the backward both follow the data, so neither is the other's
    # measure of noise. Priced as the whole of each phase balanced: balancing kept the
    # other uneven phase's spread as if it were noise, and saved 1.0 ms of a true 25.
    shape = Pipeline(schedule="1f1b", dp=4)
    uneven = Uneven(phases=("forward", "backward"), spread=0.6, tokens=tokens)
    write_pipeline(tmp_path / "uneven", shape=shape, uneven=uneven, steps=40)
    write_pipeline(tmp_path / "even", shape=shape, steps=40)
    report = analyse_stragglers(tmp_path / "uneven").report
    assert not report.findings
    assert {i.phase for i in report.imbalance} == {"forward", "backward"}
    truth = _step_ms(tmp_path / "uneven") - _step_ms(tmp_path / "even")
    assert report.cost is not None
    assert report.cost.step_ms_saved == pytest.approx(truth, rel=0.1)
    said = report.imbalance[0].cause.text
    if tokens:
        assert said.startswith("data-driven: the slowest rank held one of the largest tokens")
    else:
        # Without a value: the ranks of one replica are slow together, a different one
        # each step; the machines' noise does not fall on a replica's ranks together.
        assert said.startswith("likely the data: the ranks that share the slowest rank's dp")
        assert 'record one, e.g. prof.phase("' in said


@pytest.mark.parametrize(
    ("schedule", "dp", "noise", "seed"),
    [
        ("1f1b", 8, 0.03, 0),
        ("1f1b", 4, 0.1, 0),
        ("gpipe", 4, 0.1, 1),
        ("1f1b", 2, 0.2, 1),
        # 20% noise per op: the optimizer (run once) spread twice as much as the forward
        # (a sum of four microbatches), and was called uneven data.
        ("gpipe", 8, 0.2, 2),
        ("1f1b", 4, 0.2, 2),
    ],
)
def test_a_clean_pipeline_has_no_finding(
    tmp_path: Path, schedule: str, dp: int, noise: float, seed: int
) -> None:
    # Each stage's replicas all-reduce their gradients together, the stages apart (the
    # first stage drains last). Taken as one collective of every rank, every stage's
    # ranks "waited in dp_allreduce for rank 0", on 20 of 54 such clean runs.
    shape = Pipeline(schedule=schedule, dp=dp, microbatches=4)
    write_pipeline(tmp_path, shape=shape, noise=noise, seed=seed)
    report = analyse_stragglers(tmp_path).report
    assert report.findings == []
    assert report.imbalance == []
    assert report.summary == []


def test_uneven_data_beside_a_slow_stage_is_found_and_each_is_priced(tmp_path: Path) -> None:
    # The paper's SE job: uneven sequence lengths across replicas, and a slow stage. By
    # its time the slow stage held the slowest place at every step and the uneven data
    # was not seen; balancing then kept the slow stage's pace as the target of its fix.
    shape = Pipeline(schedule="1f1b", dp=4)
    uneven = Uneven(phases=("forward", "backward"), spread=0.6, tokens=1000)
    slow = [SlowStage(1, 1.0)]
    write_pipeline(tmp_path / "both", shape=shape, slow=slow, uneven=uneven, steps=40)
    write_pipeline(tmp_path / "uneven", shape=shape, uneven=uneven, steps=40)
    write_pipeline(tmp_path / "even", shape=shape, steps=40)
    report = analyse_stragglers(tmp_path / "both").report
    (group,) = report.groups
    assert group.name == "pipeline_stage=1"
    assert {i.phase for i in report.imbalance} == {"forward", "backward"}
    both = _step_ms(tmp_path / "both")
    assert group.cost is not None and report.cost is not None
    assert group.cost.step_ms_saved == pytest.approx(both - _step_ms(tmp_path / "uneven"), rel=0.1)
    assert report.cost.step_ms_saved == pytest.approx(both - _step_ms(tmp_path / "even"), rel=0.1)
    # Fixing everything never saves less than any of its parts.
    parts = [group.cost] + [i.cost for i in report.imbalance] + [f.cost for f in report.findings]
    priced = [c.step_ms_saved for c in parts if c is not None]
    assert len(priced) >= 3
    assert report.cost.step_ms_saved >= max(priced)


@pytest.mark.parametrize(("stages", "dp", "seed"), [(4, 4, 0), (4, 8, 1), (4, 8, 2)])
def test_balancing_is_priced_at_the_same_data_spread_evenly(
    tmp_path: Path, stages: int, dp: int, seed: int
) -> None:
    # The truth: the same draws, each step's spread evenly over the replicas. Each rank
    # held against its own median load kept the luck of its replica's draws (over 40
    # steps a replica's median load strays by 4%), the more replicas the further: at 8
    # replicas priced 12% and 29% low.
    shape = Pipeline(schedule="1f1b", stages=stages, dp=dp, microbatches=4)
    uneven = Uneven(phases=("forward", "backward"), tokens=1000)
    write_pipeline(tmp_path / "uneven", shape=shape, seed=seed, uneven=uneven, steps=40)
    write_pipeline(
        tmp_path / "spread", shape=shape, seed=seed, uneven=uneven, balanced=True, steps=40
    )
    report = analyse_stragglers(tmp_path / "uneven").report
    assert {i.phase for i in report.imbalance} == {"forward", "backward"}
    truth = _step_ms(tmp_path / "uneven") - _step_ms(tmp_path / "spread")
    assert report.cost is not None
    assert report.cost.step_ms_saved == pytest.approx(truth, rel=0.1)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_fix_of_some_replicas_replays_them_alone_to_the_same_figures(
    tmp_path: Path, schedule: str
) -> None:
    shape = Pipeline(schedule=schedule, dp=4)
    uneven = Uneven(phases=("forward", "backward"))
    write_pipeline(tmp_path, shape=shape, slow=[SlowStage(1, 1.0, replica=2)], uneven=uneven)
    run = read_timed_run(tmp_path)
    m = run.matrices
    replay = build_replay(m, set(ends_in_collective(m)), run.meta.groups)
    assert isinstance(replay, Replay) and replay.base is not None
    rng = np.random.default_rng(0)
    for _ in range(10):
        ranks = rng.choice(len(m.ranks), size=int(rng.integers(1, 4)), replace=False)
        phase = m.index(str(rng.choice(["forward", "backward"])))
        scale = {(int(r), phase): rng.uniform(0.3, 1.0, len(m.steps)) for r in ranks}
        alone = replay.step_ms(scale)
        base, replay.base = replay.base, None  # every replica replayed
        whole = replay.step_ms(scale)
        replay.base = base
        assert alone is not None and whole is not None
        assert alone == pytest.approx(whole, abs=1e-9)


def _send_early(run: Path, rank: int) -> int:
    """Rewrite `rank`'s records so that at every step its first send after a forward
    starts before that forward (the schedule issued it early; two ops that start
    together): the same ops, another order. How many steps were changed."""
    import itertools
    import json

    path = timing_path(run, rank)
    lines = path.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        if "phase" in r and r["phase"] != "step" and r.get("depth", 0) == 0:
            by_step.setdefault(int(r["step"]), []).append(r)
    changed = 0
    for ops in by_step.values():
        ops.sort(key=lambda r: int(r["start_ns"]))
        for a, b in itertools.pairwise(ops):
            if a["phase"] == "forward" and b["kind"] == "comm":
                a["start_ns"], b["start_ns"] = b["start_ns"], a["start_ns"]
                changed += 1
                break
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return changed


def test_a_rank_that_runs_its_stages_ops_in_a_little_other_order_is_still_replayed(
    tmp_path: Path,
) -> None:
    # One rank of stage 2 issues a send before the forward it follows at every step:
    # its stage-mate runs the schedule's order. The stage's ops are the same ones.
    shape = Pipeline(schedule="1f1b")
    write_pipeline(tmp_path / "slow", shape=shape, slow=[SlowStage(1, 1.0)])
    write_pipeline(tmp_path / "even", shape=shape)
    truth = _step_ms(tmp_path / "slow") - _step_ms(tmp_path / "even")
    meta = read_timed_run(tmp_path / "slow").meta.groups
    (rank, *_) = sorted(r for r, g in meta.items() if g.get("pipeline_stage") == 2)
    assert _send_early(tmp_path / "slow", rank) == 30
    report = analyse_stragglers(tmp_path / "slow").report
    assert not any("not replayed" in note for note in report.notes), report.notes
    (group,) = report.groups
    assert group.cost is not None
    assert group.cost.step_ms_saved == pytest.approx(truth, rel=0.05)


MEGATRON = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "runs"


@pytest.fixture(scope="module")
def megatron_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Megatron-LM 1F1B run the machine holds (see its README), extracted."""
    import tarfile

    archive = MEGATRON / "megatron-1f1b-16ranks.tar.gz"
    if not archive.is_file():
        pytest.skip(f"no real Megatron run at {archive}")
    root = tmp_path_factory.mktemp("megatron")
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    return root / "megatron-1f1b-16ranks"


def test_a_real_megatron_runs_batched_send_recv_calls_are_replayed(megatron_run: Path) -> None:
    # Its 1F1B steady state sends and receives in one call (pp_send_forward_recv_backward,
    # pp_send_backward_recv_forward): a recv whose data leaves for the next stage as it is
    # reached. Taken as a recv alone, its send never came, and nothing was replayed.
    run = read_timed_run(megatron_run)
    sync = set(ends_in_collective(run.matrices.on_timeline(), run.meta.hosts))
    built = build_replay(run.matrices.on_timeline(), sync, run.meta.groups)
    assert isinstance(built, Replay), built
    assert built.key == "pipeline_stage"
    batched = {run.matrices.phases[op.phase] for stage in built.ops for op in stage if op.batched}
    assert batched == {"pp_send_forward_recv_backward", "pp_send_backward_recv_forward"}


def test_a_real_megatron_run_is_replayed_priced_and_its_waiting_ranks_named(
    megatron_run: Path,
) -> None:
    # Data-parallel rank 0 of stage 0 is slow (its README: backward 1.58x, forward 1.37x
    # the others'). Its replica's later stages wait for it in their p2p calls; the other
    # replicas wait for it in their data-parallel collectives, in a gap before one that no
    # record holds (the trace is the GPU's: a collective starts once all are there).
    # Taken as each rank's own time, those gaps made the replay's step 1.45x the measured.
    report = analyse_stragglers(megatron_run).report
    said = report.to_dict()
    assert not [n for n in report.notes if "replay" in n], report.notes
    assert said["model_fit"] == pytest.approx(1.0, abs=0.10)
    slow = {(f.rank, f.phase) for f in report.findings if f.role == "slow"}
    assert slow == {(0, "forward"), (0, "backward")}
    waits = {f.rank: f.waits_for for f in report.findings if f.role == "waits"}
    assert waits == {16: (0,), 32: (0,), 48: (0,)}
    assert {f.phase for f in report.findings if f.role == "waits"} <= {
        "pp_recv_forward",
        "pp_send_backward",
        "pp_send_backward_recv_forward",
    }
    # The artifact's own what-if simulator: fixing every straggler, 1.973x as fast.
    assert said["cost"]["speedup"] == pytest.approx(1.973, rel=0.10)


def _joins(run: Path) -> dict[str, str]:
    """Per collective of the run's replay, whom it joins: "all", "stage" or "replica"."""
    timed = read_timed_run(run)
    m = timed.matrices.on_timeline()
    built = build_replay(m, set(ends_in_collective(m, timed.meta.hosts)), timed.meta.groups)
    assert isinstance(built, Replay), built
    out = {}
    for stage in built.ops:
        for op in stage:
            if op.key is not None:
                how = "replica" if op.per_replica else "stage" if len(op.key) == 3 else "all"
                out[m.phases[op.phase]] = how
    return out


def test_a_real_megatron_runs_collectives_join_the_ranks_that_left_them_together(
    megatron_run: Path,
) -> None:
    # Each stage's replicas left its parameters' all-gather and gradients' reduce-scatter
    # within 0.24 ms, the stages 170-356 ms apart; a replica's first and last stage left
    # the embedding all-reduce within 0.15 ms, the replicas 2.4 s apart.
    joins = _joins(megatron_run)
    assert joins["params_all_gather"] == joins["grads_reduce_scatter"] == "stage"
    assert joins["embedding_grads_all_reduce"] == "replica"
    assert joins["optimizer_clip_main_grad"] == "all"


def test_a_stages_data_parallel_all_reduce_joins_its_replicas_alone_where_the_step_ends_together(
    tmp_path: Path,
) -> None:
    write_pipeline(tmp_path / "run", shape=Pipeline(schedule="1f1b"))
    assert _joins(tmp_path / "run") == {"dp_allreduce": "stage", "loss_allreduce": "all"}
    # The same run with no loss all-reduce ends each stage's step apart: a step is
    # replayed from its stages starting together, so its collectives join every stage.
    for path in (tmp_path / "run").glob("timings/*.jsonl"):
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        path.write_text("".join(x for x in lines if '"loss_allreduce"' not in x))
    assert _joins(tmp_path / "run") == {"dp_allreduce": "all"}


@pytest.mark.parametrize(
    ("calls", "schedule", "stage"),
    [
        ("megatron", "1f1b", 0),
        ("megatron", "1f1b", 1),
        ("megatron", "1f1b", 3),
        ("megatron_split", "1f1b", 2),
        ("megatron_split", "gpipe", 1),
    ],
)
def test_a_slow_stage_under_megatrons_calls_is_priced_by_the_replay(
    tmp_path: Path, calls: str, schedule: str, stage: int
) -> None:
    # Megatron's names, each direction its own call or 1F1B's steady state batched (a
    # send and a recv of opposite directions in one call: one start, one duration).
    shape = Pipeline(schedule=schedule, calls=calls)
    write_pipeline(tmp_path / "slow", shape=shape, slow=[SlowStage(stage, 1.0)])
    write_pipeline(tmp_path / "even", shape=shape)
    names = set(phase_matrices(read_timings(tmp_path / "slow")).phases)
    batched = {"pp_send_forward_recv_backward", "pp_send_backward_recv_forward"}
    assert (batched <= names) == (calls == "megatron")
    assert {"pp_recv_forward", "pp_send_backward"} <= names
    truth = _step_ms(tmp_path / "slow") - _step_ms(tmp_path / "even")
    report = analyse_stragglers(tmp_path / "slow").report
    assert not [n for n in report.notes if "replay" in n], report.notes
    (group,) = report.groups
    assert group.name == f"pipeline_stage={stage}"
    assert group.cost is not None
    assert group.cost.step_ms_saved == pytest.approx(truth, rel=0.05)


@pytest.mark.parametrize("calls", ["megatron", "megatron_split"])
def test_uneven_data_under_megatrons_calls_is_found_priced_and_its_clean_twin_is_quiet(
    tmp_path: Path, calls: str
) -> None:
    # Uneven sequence lengths across the replicas, no value recorded with the phases (a
    # real trace's case): found as uneven data and priced against the same job even.
    shape = Pipeline(schedule="1f1b", dp=4, calls=calls)
    uneven = Uneven(phases=("forward", "backward"), spread=0.6)
    write_pipeline(tmp_path / "uneven", shape=shape, uneven=uneven, steps=40)
    write_pipeline(tmp_path / "even", shape=shape, steps=40)
    report = analyse_stragglers(tmp_path / "uneven").report
    assert not report.findings
    assert {i.phase for i in report.imbalance} == {"forward", "backward"}
    truth = _step_ms(tmp_path / "uneven") - _step_ms(tmp_path / "even")
    assert report.cost is not None
    assert report.cost.step_ms_saved == pytest.approx(truth, rel=0.1)
    clean = analyse_stragglers(tmp_path / "even").report
    assert (clean.findings, clean.imbalance, clean.summary) == ([], [], [])
    # The later stages' waits in the bubbles were found and left out as cheap: said so.
    (left,) = [n for n in clean.notes if "left out" in n]
    assert "would save under" in left and "--min-saving, 2% of the median step" in left


@pytest.mark.parametrize(
    ("calls", "chunks", "stage"),
    [
        ("megatron_split", 2, 0),
        ("megatron_split", 2, 3),
        ("megatron", 2, 1),
        ("megatron", 3, 2),
    ],
)
def test_a_slow_stage_of_an_interleaved_schedule_is_priced_by_the_replay(
    tmp_path: Path, calls: str, chunks: int, stage: int
) -> None:
    # Chunks per rank (Megatron's interleaved 1F1B): stage 0 receives the forward from the
    # last stage for its second chunk. Paired as each stage's k-th forward with the next
    # stage's, the step fitted (1.00x), a slow stage 0 was priced at half its true saving
    # and a slow stage 1 or 3 was not found. The calls' names say which way each goes.
    shape = Pipeline(schedule="1f1b", calls=calls, chunks=chunks, microbatches=8)
    write_pipeline(tmp_path / "slow", shape=shape, slow=[SlowStage(stage, 1.0)])
    write_pipeline(tmp_path / "even", shape=shape)
    names = set(phase_matrices(read_timings(tmp_path / "slow")).phases)
    both = "pp_send_forward_backward_recv_forward_backward"  # the steady state's one call
    assert (both in names) == (calls == "megatron")
    truth = _step_ms(tmp_path / "slow") - _step_ms(tmp_path / "even")
    report = analyse_stragglers(tmp_path / "slow").report
    assert not [n for n in report.notes if "replay" in n], report.notes
    assert report.to_dict()["model_fit"] == pytest.approx(1.0, abs=0.02)
    (group,) = report.groups
    assert group.name == f"pipeline_stage={stage}"
    assert group.cost is not None
    assert group.cost.step_ms_saved == pytest.approx(truth, rel=0.05)
    clean = analyse_stragglers(tmp_path / "even").report
    assert (clean.findings, clean.groups, clean.imbalance) == ([], [], [])


def test_an_interleaved_schedule_whose_calls_name_no_direction_is_not_replayed(
    tmp_path: Path,
) -> None:
    # The same run with its calls named with no direction (pp_recv_fw, ...): read from
    # the order of the compute alone, its stages would pair wrongly, so it is refused and
    # the step model prices the slow stage found as a group.
    shape = Pipeline(schedule="1f1b", calls="megatron_split", chunks=2, microbatches=8)
    write_pipeline(tmp_path / "slow", shape=shape, slow=[SlowStage(1, 1.0)])
    for path in (tmp_path / "slow").glob("timings/*.jsonl"):
        text = path.read_text(encoding="utf-8")
        path.write_text(text.replace('_forward"', '_fw"').replace('_backward"', '_bw"'))
    report = analyse_stragglers(tmp_path / "slow").report
    (note,) = [n for n in report.notes if "not replayed" in n]
    assert "stage 0 receives forward too: an interleaved schedule" in note
    (group,) = report.groups
    assert group.name == "pipeline_stage=1"
    assert group.cost is not None and group.cost.step_ms_saved > 0
