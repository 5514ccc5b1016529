"""What fixing a slow pipeline stage saves: the price the analysis gives against the truth,
the pipeline's replay (analysis/pipeline/_replay.py) and the segment model side by side.

Each case is a simulated pipeline (testing/_pipeline.py: 4 stages x 2 replicas, 8
microbatches) with one stage twice as slow, and the same pipeline with none, from the same
seed: the truth is the difference of their measured steps, on the clock analysed. The run is analysed twice:
with the meta's groups (the stages are named, the steps are replayed) and without (the
segment model prices the same fixes). Printed per case: the truth, each price and its
error, and each model's step over the measured one. Then the time the replay takes
beside reading the run, on a larger pipeline.

    python bench/pipeline_cost.py [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from rankscope.analysis import StragglerOptions, find_stragglers, phase_matrices, read_timings
from rankscope.analysis.pipeline._replay_build import build_replay
from rankscope.analysis.read._timed import read_timed_run
from rankscope.analysis.stragglers._arrivals import ends_in_collective
from rankscope.analysis.stragglers._model import model_fit
from rankscope.testing._pipeline import Pipeline, SlowStage, write_pipeline


def _step_ms(run: Path, time_basis: str) -> float:
    """The mean step on the clock analysed (the simulator's device times are 0.97x)."""
    m = phase_matrices(read_timings(run), time=time_basis)
    return float(np.nanmean(np.nanmedian(m.ms[m.index("step")], axis=0)))


def _priced(run: Path, time_basis: str, *, named: bool) -> tuple[float, float]:
    """Fixing every finding saves (ms a step), and the model's step over the measured."""
    timed = read_timed_run(run, StragglerOptions(time=time_basis))
    report = find_stragglers(
        timed.matrices,
        StragglerOptions(time=time_basis),
        hosts=timed.meta.hosts,
        groups=timed.meta.groups if named else None,
    )
    assert report.cost is not None
    return report.cost.step_ms_saved, model_fit(report) or float("nan")


def accuracy(root: Path, stages: list[int]) -> None:
    print(
        f"{'schedule':8} {'clock':6} {'stage':>5} {'truth':>7} "
        f"{'replay':>7} {'err':>6} {'fit':>5}   {'segment':>7} {'err':>6} {'fit':>5}"
    )
    for schedule in ("gpipe", "1f1b"):
        for gpu in (False, True):
            for stage in stages:
                case = root / f"{schedule}-{gpu}-{stage}"
                shape = Pipeline(schedule=schedule)
                write_pipeline(case / "slow", shape=shape, slow=[SlowStage(stage, 1.0)], gpu=gpu)
                write_pipeline(case / "even", shape=shape, gpu=gpu)
                basis = "device" if gpu else "host"
                truth = _step_ms(case / "slow", basis) - _step_ms(case / "even", basis)
                replay, replay_fit = _priced(case / "slow", basis, named=True)
                segment, segment_fit = _priced(case / "slow", basis, named=False)
                print(
                    f"{schedule:8} {basis:6} {stage:5d} {truth:7.1f} "
                    f"{replay:7.1f} {replay / truth - 1:+6.1%} {replay_fit:5.2f}   "
                    f"{segment:7.1f} {segment / truth - 1:+6.1%} {segment_fit:5.2f}"
                )


def speed(root: Path, shape: Pipeline, steps: int) -> None:
    run = root / "large"
    write_pipeline(run, shape=shape, steps=steps, slow=[SlowStage(1, 0.5)])
    began = time.perf_counter()
    timed = read_timed_run(run)
    read_s = time.perf_counter() - began
    m = timed.matrices.on_timeline()
    began = time.perf_counter()
    replay = build_replay(m, set(ends_in_collective(m)), timed.meta.groups)
    build_s = time.perf_counter() - began
    assert replay is not None
    began = time.perf_counter()
    replay.step_ms({})
    once_s = time.perf_counter() - began
    ranks = shape.stages * shape.dp
    print(
        f"\n{ranks} ranks ({shape.stages} stages x {shape.dp}), {shape.microbatches} "
        f"microbatches, {steps} steps: reading the run {read_s:.2f} s; building the replay "
        f"{build_s:.2f} s ({build_s / read_s:.2f}x the read); one replay {once_s * 1e3:.1f} ms"
    )
    # The whole analysis after the read, with the stages named (replayed, a finding for
    # each of the slow stage's ranks priced) and without (the segment model), side by side.
    took = {}
    for named in (False, True):
        began = time.perf_counter()
        find_stragglers(
            timed.matrices,
            StragglerOptions(),
            hosts=timed.meta.hosts,
            groups=timed.meta.groups if named else None,
        )
        took[named] = time.perf_counter() - began
    print(
        f"the analysis after the read: {took[True]:.2f} s with the stages named (replayed), "
        f"{took[False]:.2f} s without (the segment model): {took[True] / took[False]:.2f}x; "
        f"with the read, {(read_s + took[True]) / (read_s + took[False]):.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer cases, a smaller run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        accuracy(root, [0, 3] if args.quick else [0, 1, 2, 3])
        if args.quick:
            speed(root, Pipeline(stages=4, dp=8, microbatches=8, schedule="1f1b"), 20)
        else:
            speed(root, Pipeline(stages=16, dp=128, microbatches=16, schedule="1f1b"), 50)


if __name__ == "__main__":
    main()
