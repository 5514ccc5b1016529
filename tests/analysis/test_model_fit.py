"""How far the cost model's step is from the measured one, said by every output."""

from __future__ import annotations

from pathlib import Path

from rankscope.analysis import analyse_stragglers, build_report
from rankscope.analysis.render._html import render_html
from rankscope.testing._synthetic import Slowdown, write_timings

SLOW = [Slowdown(2, "forward", 0.5)]


def test_a_model_far_from_the_measured_step_says_its_savings_are_rough(tmp_path: Path) -> None:
    # Heavy noise and hiccups: the slowest rank of each segment, summed, overshoots.
    write_timings(tmp_path, ranks=8, steps=40, slowdowns=SLOW, noise=0.2, spikes=0.2)
    report = analyse_stragglers(tmp_path).report
    said = report.to_dict()
    fit = said["model_fit"]
    assert fit is not None and abs(fit - 1) > 0.15
    assert report.cost is not None and report.model_step_ms is not None
    assert fit == round(report.model_step_ms / report.cost.step_ms, 4)
    (line,) = [s for s in said["summary"] if s.startswith("the cost model gives")]
    assert f"({fit:.2f}x): the savings it prices are rough here" in line
    assert line in render_html(build_report(tmp_path))


def test_a_model_that_fits_says_nothing_more(tmp_path: Path) -> None:
    write_timings(tmp_path, ranks=8, steps=40, slowdowns=SLOW)
    said = analyse_stragglers(tmp_path).report.to_dict()
    assert said["model_fit"] is not None and abs(said["model_fit"] - 1) < 0.05
    assert not [s for s in said["summary"] if s.startswith("the cost model gives")]
