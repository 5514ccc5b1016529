from __future__ import annotations

import html
import json
import random
import re
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rankscope.analysis.render import _html
from rankscope.analysis.render._html import render_html

from .. import _chromium
from .._chromium import BrowserError, Chromium, chromium

# Names a run could carry (phase, host, kernel, run dir): none may run or turn into markup.
PWN_SCRIPT = "</script><script>window.__pwned=1</script>"
PWN_IMG = '<img src=x onerror="window.__pwned=2">'
QUOTES = "<b>&amp;\"'"
KERNEL = (
    "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<"
    "at::native::CUDAFunctor_add<float> >(at::TensorIteratorBase&, ...)::{lambda(int)#1}>(int, ...)"
)
PHASE_KINDS = {
    "host_to_device": "data",
    "forward": "compute",
    "backward": "compute",
    "optimizer": "compute",
    "loss_allreduce": "comm",
    PWN_SCRIPT: "compute",
}
BASE_MS = {
    "host_to_device": 0.4,
    "forward": 4.0,
    "backward": 8.0,
    "optimizer": 1.2,
    "loss_allreduce": 0.6,
    PWN_SCRIPT: 0.3,
}
FINDING_SENTENCE = (
    "rank 2 is slow in forward (+41% vs median at 95% of sampled steps); "
    "ranks 0, 1, 3 wait for it in loss_allreduce"
)


def _report(
    n_ranks: int, steps: list[int], phases: list[str], slow_rank: int, seed: int = 0
) -> dict[str, Any]:
    """A report dict shaped like `rankscope report --json`, with one slow rank in forward."""
    rng = random.Random(seed)
    ranks = list(range(n_ranks))
    values: dict[str, list[list[float | None]]] = {}
    for phase in phases:
        rows: list[list[float | None]] = []
        for rank in ranks:
            row: list[float | None] = []
            for step in steps:
                v = BASE_MS[phase] * rng.uniform(0.95, 1.05)
                if phase == "forward" and rank == slow_rank:
                    v *= 1.41
                if phase == "loss_allreduce" and rank != slow_rank:
                    v += 1.6  # the others wait for the slow rank in the collective
                if step == steps[0]:
                    v *= 3  # warm-up
                row.append(v)
            rows.append(row)
        values[phase] = rows
    values["forward"][1][3] = None  # one lost record
    step_ms = [
        [sum(values[p][i][j] or 0.0 for p in phases) + 0.25 for j in range(len(steps))]
        for i in range(n_ranks)
    ]
    metrics = [{"name": "step", "label": "step time", "unit": "ms", "values": step_ms}]
    metrics += [
        {"name": p, "label": f"{p} ({PHASE_KINDS[p]})", "unit": "ms", "values": values[p]}
        for p in phases
    ]

    def stats(rows: list[list[float | None]]) -> tuple[float, float]:
        flat = sorted(v for row in rows for v in row if v is not None)
        return statistics.median(flat), flat[int(0.9 * (len(flat) - 1))]

    phase_rows = []
    for name, kind, rows in [("step", "step", step_ms)] + [
        (p, PHASE_KINDS[p], values[p]) for p in phases
    ]:
        median, p90 = stats(rows)  # type: ignore[arg-type]
        phase_rows.append(
            {
                "name": name,
                "kind": kind,
                "records": n_ranks * len(steps),
                "median_ms": median,
                "p90_ms": p90,
            }
        )
    return {
        "v": 1,
        "run_dir": "/runs/exp<1>&2",
        "generated_at": "2026-11-22T17:00:00Z",
        "ranks": {
            "world_size": n_ranks + 1,
            "present": ranks,
            "missing": [n_ranks],
            "hosts": {str(r): (QUOTES if r == 3 else f"node{r // 8:03d}") for r in ranks},
        },
        "steps": {"sampled": steps, "first": steps[0], "last": steps[-1]},
        "skipped": [
            "timings/rank-00003.jsonl:17: not valid JSON (JSONDecodeError)",
            f"timings/rank-00001.jsonl:3: unknown phase kind {PWN_IMG}",
        ],
        "phases": phase_rows,
        "heatmaps": {"ranks": ranks, "steps": steps, "metrics": metrics},
        "breakdown": {
            "ranks": ranks,
            "phases": phases,
            "kinds": [PHASE_KINDS[p] for p in phases],
            "median_ms": [
                [statistics.median(v for v in values[p][i] if v is not None) for p in phases]
                for i in range(n_ranks)
            ],
        },
        "stragglers": {
            "threshold": 1.10,
            "min_persistence": 0.5,
            "reference": "median",
            "summary": [FINDING_SENTENCE],
            "findings": [
                {
                    "rank": slow_rank,
                    "phase": "forward",
                    "kind": "compute",
                    "role": "slow",
                    "median_ratio": 1.41,
                    "share_above": 0.95,
                    "lost_ms": 1234.5,
                    "steps": len(steps),
                    "since_step": steps[0],
                    "waits_for": [],
                },
                {
                    "rank": 0,
                    "phase": "loss_allreduce",
                    "kind": "comm",
                    "role": "waits",
                    "median_ratio": 3.6,
                    "share_above": 0.9,
                    "lost_ms": 900.0,
                    "steps": len(steps),
                    "since_step": steps[0],
                    "waits_for": [slow_rank],
                },
            ],
        },
        "kernels": {"windows": _kernel_windows()},
    }


def _kernel_windows() -> list[dict[str, Any]]:
    names = [KERNEL, PWN_SCRIPT, QUOTES] + [f"ampere_sgemm_{i}x64_tn" for i in range(17)]
    total = sum(100.0 * (20 - i) for i in range(20))
    gpu = [
        {
            "name": name,
            "count": 10 + i,
            "total_us": 100.0 * (20 - i),
            "mean_us": 100.0 * (20 - i) / (10 + i),
            "min_us": 1.0,
            "max_us": 40.0 + i,
            "share": 100.0 * (20 - i) / total,
        }
        for i, name in enumerate(names)
    ]
    cpu = [
        {"name": "aten::addmm", "count": 4, "total_us": 800.0, "mean_us": 200.0},
        {"name": f"aten::{PWN_IMG}", "count": 2, "total_us": 200.0, "mean_us": 100.0},
    ]
    return [
        {
            "window": "step-000010-000011",
            "ranks": [0, 2],
            "kind": "gpu_kernels",
            "total_us": total,
            "items": gpu,
        },
        {
            "window": "phase-actor_update-000003",
            "ranks": [1],
            "kind": "cpu_ops",
            "total_us": 1000.0,
            "items": cpu,
        },
    ]


def realistic_report() -> dict[str, Any]:
    return _report(4, list(range(0, 60, 2)), list(PHASE_KINDS), slow_rank=2)


def clean_report() -> dict[str, Any]:
    report = realistic_report()
    report["stragglers"]["summary"] = []
    report["stragglers"]["findings"] = []
    return report


@pytest.fixture(scope="module")
def big_report() -> dict[str, Any]:
    # 1024 ranks x 200 steps: step time and 5 phases
    return _report(1024, list(range(0, 2000, 10)), list(PHASE_KINDS)[:5], slow_rank=777)


@pytest.fixture(scope="module")
def big_page(big_report: dict[str, Any]) -> str:
    return render_html(big_report)


@pytest.fixture
def browser() -> Iterator[Chromium]:
    with chromium() as b:
        yield b


def _embedded(page: str) -> Any:
    found = re.search(r'<script id="rankscope-data" type="application/json">(.*?)</script>', page)
    assert found is not None
    return json.loads(found.group(1))


# --------------------------------------------------------------------------- the file


@pytest.mark.parametrize("make", [realistic_report, clean_report, lambda: {"run_dir": "/r"}])
def test_page_is_one_self_contained_file(make: Any) -> None:
    page = render_html(make())
    assert "http://" not in page and "https://" not in page
    # nothing fetched: no src attributes, no stylesheet links, no CSS urls or imports
    assert " src=" not in page.replace("&lt;img src=x", "")
    assert "url(" not in page and "@import" not in page
    assert re.findall(r"<link[^>]*>", page) == ['<link rel="icon" href="data:,">']
    assert page.count("<script") == 2 and page.count("</script>") == 2
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")


def test_sections_come_in_order() -> None:
    page = render_html(realistic_report())
    ids = ["summary", "heatmap", "over-steps", "breakdown", "kernels", "skipped"]
    positions = [page.index(f'<section id="{i}">') for i in ids]
    assert positions == sorted(positions)
    assert "<title>rankscope report: /runs/exp&lt;1&gt;&amp;2</title>" in page


def test_names_are_escaped_in_the_markup() -> None:
    page = render_html(realistic_report())
    for name in (PWN_SCRIPT, PWN_IMG, QUOTES, KERNEL):
        assert name not in page
        assert html.escape(name) in page


def test_the_script_sets_text_never_markup() -> None:
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in _html._SCRIPT


def _embedded_text(page: str) -> str:
    return page.split('type="application/json">', 1)[1].split("</script>", 1)[0]


def test_embedded_data_round_trips_names_and_keeps_numbers_short() -> None:
    report = realistic_report()
    page = render_html(report)
    raw = _embedded_text(page)
    assert "<" not in raw and ">" not in raw and "&" not in raw
    data = _embedded(page)["heatmap"]
    assert data["labels"] == ["0", "1", "2", "3"] and data["rows"] == [1, 1, 1, 1]
    assert data["hosts"][3] == QUOTES
    assert [m["name"] for m in data["metrics"]] == ["step", *PHASE_KINDS]
    assert f"{PWN_SCRIPT} (compute)" in [m["label"] for m in data["metrics"]]
    assert data["marks"] == [[2, "slow in forward (+41%)"]]  # the waiting rank is not marked
    assert "selected>forward (compute)</option>" in page  # it opens on the finding's phase
    forward = data["metrics"][2]
    assert len(forward["values"]) == 4 * 30
    assert forward["values"][1 * 30 + 3] is None
    original = report["heatmaps"]["metrics"][2]["values"][0][5]
    assert forward["values"][5] == pytest.approx(original, rel=1e-3)
    for number in re.findall(r"-?\d+\.\d+(?:e[-+]\d+)?", raw):
        assert len(number.split("e")[0].replace("-", "").replace(".", "").lstrip("0")) <= 4
    # the colour scale leaves the warm-up step out, and the legend says so
    assert forward["lo"] < forward["hi"] < forward["max"]


def test_the_findings_read_in_words_and_in_a_table() -> None:
    page = render_html(realistic_report())
    assert html.escape(FINDING_SENTENCE) in page
    assert "at least 10% slower than the median on at least 50% of sampled steps" in page
    # Time lost in ms with its unit, as the sentences say a duration (core/_format.py).
    assert "+41%" in page and "95%" in page and '<td class="num">1,234 ms</td>' in page


def test_a_clean_run_says_no_straggler_was_found() -> None:
    page = render_html(clean_report())
    assert "No straggler found with the thresholds used" in page
    assert "at least 10% slower" in page


def test_missing_ranks_and_skipped_input_are_said() -> None:
    page = render_html(realistic_report())
    assert "1 missing: rank 4" in page
    assert "2 input lines or files skipped" in page
    assert html.escape(f"unknown phase kind {PWN_IMG}") in page


def test_kernels_show_the_top_15_of_each_window() -> None:
    page = render_html(realistic_report())
    kernels = page.split('<section id="kernels">')[1].split("</section>")[0]
    assert kernels.count("<details") == 2
    assert "Top 15 of 20 by total time; the other 5 take" in kernels
    assert "ampere_sgemm_11x64_tn" in kernels and "ampere_sgemm_12x64_tn" not in kernels
    assert "top-level CPU ops" in kernels
    assert "none" in kernels  # the CPU window's items carry no min/max/share


def test_a_report_with_nothing_but_the_run_dir_says_none() -> None:
    page = render_html({"run_dir": "/runs/empty"})
    for section in ("heatmap", "over-steps", "breakdown", "kernels"):
        part = page.split(f'<section id="{section}">')[1].split("</section>")[0]
        assert "none" in part
    assert "Nothing was skipped" in page
    assert "no straggler analysis" in page
    assert _embedded(page) == {"heatmap": None}
    assert "(run directory not given)" in render_html({})


@pytest.mark.parametrize(
    "broken",
    [
        {"ranks": 5, "steps": "x", "skipped": None, "phases": [1, "a", None]},
        {"heatmaps": {"ranks": [0, 1], "steps": [0], "metrics": [{"values": "x"}, 7]}},
        {"heatmaps": {"ranks": [0], "steps": [0, 1], "metrics": [{"values": [[1.0, "2", True]]}]}},
        {"heatmaps": {"ranks": [0], "steps": [0], "metrics": [{"values": [[float("nan")]]}]}},
        {"breakdown": {"ranks": [0, 1], "phases": ["a"], "median_ms": [[None], "x"]}},
        {"stragglers": {"findings": ["x", {"rank": "two"}], "summary": [None]}},
        {"kernels": {"windows": [None, {"items": [None, {"name": None, "share": "x"}]}]}},
        {"ranks": {"hosts": {"x": "h", "1": None}, "present": [0, "1"]}},
    ],
)
def test_malformed_parts_do_not_crash(broken: dict[str, Any]) -> None:
    page = render_html({"run_dir": "/r", **broken})
    assert (
        page.count("<section") == 7
    )  # summary, heatmap, details, over-steps, breakdown, kernels, skipped
    json.loads(_embedded_text(page))


def test_big_breakdown_shows_the_slowest_ranks_then_the_median(big_page: str) -> None:
    breakdown = big_page.split('<section id="breakdown">')[1].split("</section>", maxsplit=1)[0]
    assert "32 of 1024 ranks (the findings' slow ranks, then the most own work)" in breakdown
    rows = re.findall(r'<td class="rank">rank (\d+)', breakdown)
    assert len(rows) == 34 and rows[0] == "777"
    assert 'class="slow-tag">slow in forward, +41%' in breakdown


# --------------------------------------------------------------------------- in Chromium

_PIXELS = """(() => {
  const c = document.getElementById("heatmap-canvas");
  const g = Number(c.dataset.gutter), t = Number(c.dataset.top);
  const d = c.getContext("2d").getImageData(g, t, c.width - g, c.height - t).data;
  const colours = new Set();
  let hash = 0;
  for (let i = 0; i < d.length; i += 4) {
    const rgb = (d[i] << 16) | (d[i + 1] << 8) | d[i + 2];
    colours.add(rgb);
    hash = (hash * 31 + rgb) | 0;
  }
  return {colours: colours.size, hash, cells: c.dataset.cells, values: c.dataset.values,
          metric: c.dataset.metric, width: c.width, height: c.height};
})()"""


def _select_metric(browser: Chromium, name: str) -> None:
    browser.evaluate(
        f"""(() => {{
      const data = JSON.parse(document.getElementById("rankscope-data").textContent);
      const s = document.getElementById("metric");
      s.value = String(data.heatmap.metrics.findIndex((m) => m.name === {json.dumps(name)}));
      s.dispatchEvent(new Event("change"));
    }})()"""
    )


def _hover(browser: Chromium, rank_row: int, step_col: int) -> str:
    # the middle of a cell, in the canvas's own pixels, as client coordinates
    return str(
        browser.evaluate(
            f"""(() => {{
      const c = document.getElementById("heatmap-canvas");
      c.scrollIntoView();
      const box = c.getBoundingClientRect();
      const g = Number(c.dataset.gutter), t = Number(c.dataset.top);
      const cw = Number(c.dataset.cw), ch = Number(c.dataset.ch);
      const x = box.left + g + ({step_col} + 0.5) * cw, y = box.top + t + ({rank_row} + 0.5) * ch;
      c.dispatchEvent(new MouseEvent("mousemove", {{clientX: x, clientY: y, bubbles: true}}));
      const tip = document.getElementById("tip");
      return tip.hidden ? "" : tip.textContent;
    }})()"""
        )
    )


@pytest.mark.slow
def test_realistic_report_in_chromium(browser: Chromium, tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    path.write_text(render_html(realistic_report()), encoding="utf-8")
    assert browser.open(path) == []
    drawn = browser.evaluate(_PIXELS)  # it opens on the finding's phase: one record lost there
    assert drawn["cells"] == "120" and drawn["values"] == "119" and drawn["metric"] == "forward"
    assert drawn["colours"] >= 8

    _select_metric(browser, "step")
    redrawn = browser.evaluate(_PIXELS)
    assert redrawn["metric"] == "step" and redrawn["values"] == "120"
    assert redrawn["hash"] != drawn["hash"]
    _select_metric(browser, "forward")

    text = browser.evaluate("document.body.textContent")
    for name in (PWN_SCRIPT, PWN_IMG, QUOTES, KERNEL, FINDING_SENTENCE, "/runs/exp<1>&2"):
        assert name in text
    assert browser.evaluate("document.title") == "rankscope report: /runs/exp<1>&2"
    options = browser.evaluate("[...document.querySelectorAll('#metric option')].map(o => o.text)")
    assert options[0] == "step time" and f"{PWN_SCRIPT} (compute)" in options
    assert browser.evaluate("document.getElementById('metric').selectedOptions[0].text") == (
        "forward (compute)"
    )
    assert browser.evaluate("typeof window.__pwned") == "undefined"
    assert browser.evaluate("document.querySelectorAll('script').length") == 2
    assert browser.evaluate("document.querySelectorAll('b, img').length") == 0

    tip = _hover(browser, rank_row=3, step_col=5)
    assert tip.startswith(f"rank 3 on {QUOTES}\nstep 10\nforward (compute): ")
    assert tip.endswith(" ms")
    assert "straggler: slow in forward (+41%)" in _hover(browser, rank_row=2, step_col=0)
    assert "no record" in _hover(browser, rank_row=1, step_col=3)
    legend = browser.evaluate("document.getElementById('legend').textContent")
    assert legend.startswith("fast") and "slow" in legend
    assert browser.open(path) == []  # and nothing went wrong along the way
    # no element the page made is wider than the laptop-sized window
    assert browser.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")


@pytest.mark.slow
def test_clean_and_empty_reports_in_chromium(browser: Chromium, tmp_path: Path) -> None:
    clean = tmp_path / "clean.html"
    clean.write_text(render_html(clean_report()), encoding="utf-8")
    assert browser.open(clean) == []
    assert "No straggler found with the thresholds used" in browser.evaluate(
        "document.getElementById('summary').textContent"
    )
    assert browser.evaluate(_PIXELS)["cells"] == "120"

    empty = tmp_path / "empty.html"
    empty.write_text(render_html({"run_dir": "/runs/empty"}), encoding="utf-8")
    assert browser.open(empty) == []
    assert browser.evaluate("document.getElementById('heatmap-canvas')") is None
    assert "none" in browser.evaluate("document.getElementById('heatmap').textContent")


@pytest.mark.slow
def test_an_injected_script_would_be_refused(browser: Chromium, tmp_path: Path) -> None:
    # The page's policy is the second line of defence: prove it bites on a page that
    # carries an unescaped script.
    page = render_html(realistic_report()).replace(
        "</body>", "<script>window.__pwned = 1</script></body>"
    )
    path = tmp_path / "tampered.html"
    path.write_text(page, encoding="utf-8")
    errors = browser.open(path)
    assert browser.evaluate("typeof window.__pwned") == "undefined"
    assert any("Content Security Policy" in e for e in errors), errors


@pytest.mark.slow
def test_the_driver_times_out_instead_of_hanging() -> None:
    # Started with the usual time to start: on a loaded machine chromium took over 1 s to
    # write its port (the load loop's one failure), which is not what this checks.
    with chromium() as browser:
        usual, browser.timeout = browser.timeout, 1.0
        try:
            with pytest.raises(BrowserError, match=r"within 1\.0 s"):
                browser.evaluate("new Promise(() => {})")
        finally:
            browser.timeout = usual  # closing waits for the killed browser as long as ever


def test_the_driver_skips_without_chromium(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_chromium, "CHROMIUM", Path("/nonexistent/chromium"))
    with pytest.raises(pytest.skip.Exception, match="not found"), chromium():
        pass


def test_windows_say_who_asked_and_other_captures_are_listed() -> None:
    report = realistic_report()
    first = report["kernels"]["windows"][0]
    first["why"] = [f"rankscope trigger t-{PWN_IMG} asked for it (rank 0)"]
    report["captures"] = {
        "nsys": [{"window": "step-000002-000003", "first": 2, "last": 3, "ranks": [0, 1, 2]}],
        "memory": [
            {
                "window": "oom-step-000007",
                "path": "/r/memory/oom-step-000007",
                "ranks": [3],
                "bytes": 2_500_000,
            }
        ],
    }
    page = render_html(report)
    kernels = page.split('<section id="kernels">')[1].split("</section>")[0]
    assert html.escape(f"rankscope trigger t-{PWN_IMG} asked for it (rank 0)") in kernels
    assert PWN_IMG not in kernels  # escaped
    assert "nsys capture range <code>step-000002-000003</code> · steps 2-3 · ranks 0-2" in kernels
    assert (
        "CUDA memory snapshots <code>/r/memory/oom-step-000007</code> · rank 3 · 2.5 MB" in kernels
    )
    # Without traces the list still shows.
    report["kernels"] = {"windows": []}
    kernels = render_html(report).split('<section id="kernels">')[1].split("</section>")[0]
    assert "none (no traces captured)" in kernels and "nsys capture range" in kernels


# --------------------------------------------------------------------------- hangs


def hung_report(tmp_path: Path) -> dict[str, Any]:
    """The realistic report of a run that then hung: rank 2 stuck in a phase whose name
    is markup, its stack holding more."""
    from rankscope.analysis import find_hangs

    from .test_hang_analysis import NOW, data_stuck_run

    stack = [
        {"file": "train.py", "line": 40, "function": "<module>", "code": "main()"},
        {"file": f"data/{PWN_IMG}.py", "line": 7, "function": "load", "code": PWN_SCRIPT},
    ]
    run = data_stuck_run(tmp_path / "run", dead=True, stuck_phase=PWN_SCRIPT, stack=stack)
    report = realistic_report()
    report["hangs"] = find_hangs(run, now_ns=NOW).to_dict()
    return report


def test_the_hangs_section_says_who_is_stuck_and_shows_its_stack(tmp_path: Path) -> None:
    report = hung_report(tmp_path)
    page = render_html(report)
    # A hung run opens on who is stuck, before the stragglers' "no straggler found".
    ids = ["hangs", "summary", "heatmap", "over-steps", "breakdown", "kernels", "skipped"]
    positions = [page.index(f'<section id="{i}">') for i in ids]
    assert positions == sorted(positions)
    # A finished run's heartbeats are no headline: they come after the findings' tables.
    finished = render_html({**report, "hangs": {**report["hangs"], "state": "finished"}})
    ids = ["summary", "heatmap", "over-steps", "breakdown", "hangs", "kernels", "skipped"]
    positions = [finished.index(f'<section id="{i}">') for i in ids]
    assert positions == sorted(positions)
    assert '<a href="#hangs">hangs</a>' in page
    hangs = page.split('<section id="hangs">')[1].split("</section>")[0]
    assert html.escape(report["hangs"]["summary"]) in hangs
    assert "<b>hung</b>" in hangs
    assert "<td>waits</td><td>0-1, 3</td>" in hangs  # grouped: one row for 4095 ranks too
    assert f"data/{html.escape(PWN_IMG)}.py:7 in load" in hangs
    assert html.escape(PWN_SCRIPT) in hangs
    for name in (PWN_SCRIPT, PWN_IMG):
        assert name not in page
    assert "No Flight Recorder dump: NCCL is not in use (gloo)" in hangs
    # A run that had no watch gets no section, and a clean one says so in green.
    assert '<section id="hangs">' not in render_html(realistic_report())
    report["hangs"]["state"], report["hangs"]["summary"] = "finished", "the run finished"
    report["hangs"]["groups"] = report["hangs"]["findings"] = []
    clean = render_html(report).split('<section id="hangs">')[1].split("</section>")[0]
    assert '<p class="clean">finished: the run finished</p>' in clean


@pytest.mark.parametrize(
    "broken",
    [
        "x",
        None,
        {"groups": [None, {"ranks": "x", "for_s": float("nan"), "since": 1e300}]},
        {"findings": [{"role": "stuck", "frames": [None, 3, {"line": []}], "open": "x"}]},
        {"as_of": "now", "live": "yes", "rules": {"stall_factor": "x"}, "silent": [None]},
    ],
)
def test_malformed_hangs_do_not_crash(broken: Any) -> None:
    page = render_html({"run_dir": "/r", "hangs": broken})
    assert page.count("<section") == 8  # the seven sections, and hangs


@pytest.mark.slow
def test_a_hung_run_in_chromium(browser: Chromium, tmp_path: Path) -> None:
    report = hung_report(tmp_path)
    path = tmp_path / "hung.html"
    path.write_text(render_html(report), encoding="utf-8")
    assert browser.open(path) == []
    text = browser.evaluate("document.getElementById('hangs').textContent")
    assert report["hangs"]["summary"] in text
    assert f"data/{PWN_IMG}.py:7 in load" in text and PWN_SCRIPT in text
    assert browser.evaluate("typeof window.__pwned") == "undefined"
    assert (
        browser.evaluate("document.querySelectorAll('#hangs details[open] pre.stack').length") == 1
    )
    assert browser.evaluate(_PIXELS)["cells"] == "120"  # the heatmap still draws
    assert browser.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")


# --------------------------------------------------------------------------- real runs
# A 3-rank job whose rank 1 turns slow in host_to_device at step 20 (DDP: backward holds
# the all-reduce, so the others wait there), and a 1024-rank one whose rank 777 does at
# step 1000: the pictures must lead to that rank, and stay small however big the run.


def _real_page(root: Path, **run: Any) -> tuple[dict[str, Any], str]:
    from rankscope.analysis import build_report
    from rankscope.testing._synthetic import write_timings

    write_timings(root, **run)
    report = build_report(root)
    return report, render_html(report)


@pytest.fixture(scope="module")
def slow_h2d(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    from rankscope.testing._synthetic import Slowdown

    slow = [Slowdown(1, "host_to_device", 3.0, from_step=20)]
    return _real_page(tmp_path_factory.mktemp("h2d"), ranks=3, steps=40, slowdowns=slow)


@pytest.fixture(scope="module")
def slow_1024(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    from rankscope.testing._synthetic import Slowdown

    slow = [Slowdown(777, "host_to_device", 3.0, from_step=1000)]
    root = tmp_path_factory.mktemp("big")
    return _real_page(root, ranks=1024, steps=200, every_n_steps=10, slowdowns=slow)


def _offline(page: str) -> None:
    assert "http://" not in page and "https://" not in page
    assert " src=" not in page and "url(" not in page and "@import" not in page


def test_a_real_page_is_offline_and_small(
    slow_h2d: tuple[dict[str, Any], str], slow_1024: tuple[dict[str, Any], str]
) -> None:
    for report, page in (slow_h2d, slow_1024):
        _offline(page)
        assert report["stragglers"]["summary"][0].startswith(
            f"rank {report['stragglers']['findings'][0]['rank']} is slow in host_to_device (4.0x"
        )
    assert len(slow_h2d[1].encode()) < 60_000  # 3 ranks x 40 steps
    # 1024 ranks x 200 steps: bounded rows, columns and lines, not 1024 x 200 x 6 values
    assert len(slow_1024[1].encode()) < 400_000
    assert "and 1004 more findings, not listed here" in slow_1024[1]
    heat = slow_1024[0]["heatmaps"]
    assert heat["row_is"] == "slowest" and len(heat["rows"]) <= 65 and heat["rows"][0] == [777]
    assert sorted({r for row in heat["rows"][1:] for r in row}) == list(range(1024))
    assert len(heat["steps"]) <= 120 and heat["steps_per_column"] == 2
    for phase in slow_1024[0]["over_steps"]["phases"]:
        assert len(phase["lines"]) <= 8 and len(phase["flagged"]) <= 8


_FIRST_PICTURE = """(() => {
  // the first picture on the page, and each of its rows' mean green (viridis: the higher,
  // the slower) over the last quarter of the steps, after the slowdown began
  const first = document.querySelector("canvas, svg");
  const c = document.getElementById("heatmap-canvas");
  const g = Number(c.dataset.gutter), t = Number(c.dataset.top), ch = Number(c.dataset.ch);
  const rows = Number(c.dataset.rows), ctx = c.getContext("2d"), green = [];
  for (let r = 0; r < rows; r++) {
    const w = Math.floor((c.width - g) / 4);
    const d = ctx.getImageData(c.width - w, t + r * ch + Math.floor(ch / 2), w, 1).data;
    let sum = 0;
    for (let i = 1; i < d.length; i += 4) sum += d[i];
    green.push(sum / (d.length / 4));
  }
  const data = JSON.parse(document.getElementById("rankscope-data").textContent).heatmap;
  return {first: first.id, metric: c.dataset.metric, green, labels: data.labels,
          marks: data.marks.map((m) => m[0])};
})()"""

_CHARTS = """(() => [...document.querySelectorAll("#over-steps figure.chart")].map((f) => ({
  phase: f.dataset.phase,
  flagged: [...f.querySelectorAll("path.flagged")].map((p) => p.dataset.rank),
  faint: f.querySelectorAll("path.faint").length,
  onsets: [...f.querySelectorAll("line.onset")].map((l) => [l.dataset.step, l.getAttribute("x1")]),
  tops: [...f.querySelectorAll("line.onset")].map((l) => Number(l.getAttribute("y1"))),
  labels: [...f.querySelectorAll("text.onset-label")].map((t) => {
    const b = t.getBBox(); return [b.x, b.y, b.x + b.width, b.y + b.height]; }),
  width: f.querySelector("svg").viewBox.baseVal.width,
  ticks: [...f.querySelectorAll("text.tick")].map((t) => [t.textContent, t.getAttribute("x")]),
})))()"""

_BREAKDOWN = """(() => [...document.querySelectorAll("#breakdown tr[data-rank]")].map((r) =>
  [r.dataset.rank, r.className, r.querySelector("td.rank").textContent]))()"""


def _check_pictures(browser: Chromium, rank: int, onset: int, phases: int) -> list[Any]:
    first = browser.evaluate(_FIRST_PICTURE)
    assert first["first"] == "heatmap-canvas" and first["metric"] == "host_to_device"
    row = first["labels"].index(str(rank))
    assert first["marks"] == [row]
    green = first["green"]
    # the flagged rank is the standout: its row is the brightest (or as bright as the
    # group row that holds it), by far
    others = sorted(g for i, g in enumerate(green) if i != row)
    assert green[row] >= max(green) - 1 and green[row] > others[len(others) // 2] + 60, green
    rows = browser.evaluate(_BREAKDOWN)
    assert rows[0][0] == str(rank) and "flag-slow" in rows[0][1]
    assert "slow in host_to_device, 4.0x" in rows[0][2]
    charts: list[Any] = browser.evaluate(_CHARTS)
    assert len(charts) == phases and len({c["phase"] for c in charts}) == phases
    h2d = charts[0]  # the finding's phase comes first
    assert h2d["phase"] == "host_to_device" and h2d["flagged"] == [str(rank)]
    assert [step for step, _ in h2d["onsets"]] == [str(onset)]
    assert all(c["onsets"] == [] for c in charts if c["phase"] != "host_to_device")
    # "rank N from step S" sits in the margin above the plot, inside the drawing: on the
    # plot it lay over the slow rank's line, at the top from the onset on.
    ((left, top, right, bottom),) = h2d["labels"]
    assert top >= 0 and bottom <= h2d["tops"][0] + 0.5, h2d["labels"]
    assert left >= 0 and right <= h2d["width"], h2d["labels"]
    return charts


@pytest.mark.slow
def test_the_first_picture_shows_the_slow_rank_in_chromium(
    browser: Chromium, slow_h2d: tuple[dict[str, Any], str], tmp_path: Path
) -> None:
    path = tmp_path / "report.html"
    path.write_text(slow_h2d[1], encoding="utf-8")
    assert browser.open(path) == []
    charts = _check_pictures(browser, rank=1, onset=20, phases=6)
    # the onset line sits at step 20: halfway between the ticks of steps 0 and 39
    h2d = charts[0]
    ticks = {text: float(x) for text, x in h2d["ticks"]}
    x = float(h2d["onsets"][0][1])
    assert x == pytest.approx(
        ticks["step 0"] + (ticks["step 39"] - ticks["step 0"]) * 20 / 39, abs=1
    )
    assert all(c["faint"] == 2 for c in charts if c["phase"] == "host_to_device")
    assert browser.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")


@pytest.mark.slow
def test_a_1024_rank_report_stays_light_in_chromium(
    browser: Chromium, slow_1024: tuple[dict[str, Any], str], tmp_path: Path
) -> None:
    path = tmp_path / "big.html"
    path.write_text(slow_1024[1], encoding="utf-8")
    assert browser.open(path) == []
    charts = _check_pictures(browser, rank=777, onset=1000, phases=6)
    assert all(c["faint"] == 8 for c in charts)
    tip = _hover(browser, 1, 0)
    assert re.match(r"ranks 0-\d+ \(the slowest of these \d+\)\nsteps 0-19 \(mean\)\n", tip), tip
    note = browser.evaluate("document.querySelector('#heatmap .note').textContent")
    assert "rank 777, named by the findings, on rows of their own" in note


# --------------------------------------------------------------------------- the first screen

_FIRST_SCREEN = """(() => {
  // where the heatmap and its slow rank's mark are drawn, in a laptop's first screen
  const c = document.getElementById("heatmap-canvas");
  const box = c.getBoundingClientRect();
  const data = JSON.parse(document.getElementById("rankscope-data").textContent).heatmap;
  const g = Number(c.dataset.gutter), t = Number(c.dataset.top), ch = Number(c.dataset.ch);
  const ctx = c.getContext("2d");
  const marks = data.marks.map(([row]) => {
    const y = t + row * ch + Math.floor(ch / 2);
    const px = ctx.getImageData(g - 6, y, 1, 1).data;  // the mark's bar, beside the row
    return {row, label: data.labels[row], bottom: box.top + t + (row + 1) * ch,
            rgb: [px[0], px[1], px[2]]};
  });
  const tables = [...document.querySelectorAll("table")].map((e) => e.getBoundingClientRect().top);
  return {top: box.top, scrollY: window.scrollY, height: window.innerHeight,
          width: window.innerWidth, tables, marks, metric: c.dataset.metric,
          words: document.querySelector("#summary ul.findings").getBoundingClientRect().top};
})()"""


def _first_screen(browser: Chromium, path: Path) -> Any:
    browser.call(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False},
    )
    assert browser.open(path) == []
    return browser.evaluate(_FIRST_SCREEN)


@pytest.mark.slow
def test_the_page_opens_on_the_findings_picture_in_chromium(
    browser: Chromium, slow_h2d: tuple[dict[str, Any], str], tmp_path: Path
) -> None:
    pages = {
        "real": (slow_h2d[1], "1", "host_to_device"),
        "realistic": (render_html(realistic_report()), "2", "forward"),
    }
    for name, (page, rank, metric) in pages.items():
        path = tmp_path / f"{name}.html"
        path.write_text(page, encoding="utf-8")
        shown = _first_screen(browser, path)
        assert (shown["width"], shown["height"], shown["scrollY"]) == (1280, 800, 0), name
        # the finding in words, then its picture, whole on the first screen, above every table
        assert shown["words"] < shown["top"] < shown["height"], (name, shown)
        assert shown["tables"] and min(shown["tables"]) > shown["top"], (name, shown)
        assert shown["metric"] == metric
        # the slow rank is marked in it, in red beside its row, and that row is on screen
        (mark,) = shown["marks"]
        assert mark["label"] == rank and mark["rgb"] == [224, 48, 30], (name, mark)
        assert mark["bottom"] < shown["height"], (name, shown)
