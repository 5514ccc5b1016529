"""Pipeline-shaped runs (testing/_pipeline.py): a slow stage is one finding with its price."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rankscope.analysis import StragglerOptions, analyse_stragglers, phase_matrices, read_timings
from rankscope.analysis._findings import cost_lines, model_fit
from rankscope.testing._pipeline import SlowStage, write_pipeline


def _step_ms(run: Path) -> float:
    m = phase_matrices(read_timings(run))
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
