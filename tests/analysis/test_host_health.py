"""`hosts` counts a host whose GPUs throttle (analysis/hosts/_host_health.py), from each
attempt's health samples, whether or not its ranks were found slow."""

from __future__ import annotations

import json
from pathlib import Path

from rankscope.analysis.hosts._hosts import find_recurring_hosts
from rankscope.rundir._layout import meta_path
from rankscope.testing._synthetic import Slowdown, write_timings

from .test_health_cause import HEALTHY, HOT, write_health


def _run(path: Path, hot: int | None, slow: int | None = None) -> Path:
    """Four ranks on four hosts (rank r on node-0r), rank `hot`'s GPU throttling at every
    sample, rank `slow` slow in forward."""
    slowdowns = [] if slow is None else [Slowdown(slow, "forward", 0.5)]
    write_timings(path, ranks=4, steps=40, slowdowns=slowdowns, write_meta=False)
    for rank in range(4):
        meta = meta_path(path, rank)
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(
            json.dumps({"v": 1, "rank": rank, "world_size": 4, "host": f"node-0{rank}"})
        )
    write_health(path, 4, 40, lambda r, s: HOT if r == hot else HEALTHY)
    return path


def test_a_host_whose_gpus_throttle_in_two_runs_is_counted(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", hot=2, slow=2)
    b = _run(tmp_path / "b", hot=2)
    c = _run(tmp_path / "c", hot=None)
    report = find_recurring_hosts([a, b, c])
    said = [s for s in report.summary if "throttled" in s]
    assert said == [
        "node-02's GPUs throttled in 2 of 3 attempts (rank 2 in run a; rank 2 in run b; "
        "thermal throttling): a machine to cool or drain, whether or not its ranks were found slow"
    ]
    runs = report.to_dict()["runs"]
    assert [r["throttled_gpus"] for r in runs] == [
        [
            {
                "run": "a",
                "attempt": 1,
                "rank": 2,
                "host": "node-02",
                "share": 1.0,
                "holds": ["thermal throttling"],
            }
        ],
        [
            {
                "run": "b",
                "attempt": 1,
                "rank": 2,
                "host": "node-02",
                "share": 1.0,
                "holds": ["thermal throttling"],
            }
        ],
        [],
    ]


def test_no_health_files_no_throttle_sentence(tmp_path: Path) -> None:
    a = tmp_path / "a"
    write_timings(a, ranks=4, steps=40, slowdowns=[Slowdown(1, "forward", 0.5)])
    report = find_recurring_hosts([a])
    assert not [s for s in report.summary if "throttled" in s]
    assert report.to_dict()["runs"][0]["throttled_gpus"] == []


def test_bad_health_lines_are_named_in_skipped(tmp_path: Path) -> None:
    a = _run(tmp_path / "a", hot=1)
    path = a / "health" / "rank-00001.jsonl"
    with path.open("a") as fh:
        fh.write("{not json\n")
    report = find_recurring_hosts([a])
    assert f"{path}: 1 line skipped (line 81: not JSON)" in report.skipped
    assert [s for s in report.summary if "throttled" in s] == [
        "node-01's GPUs throttled in the one attempt (rank 1 in run a; thermal throttling): a "
        "machine to cool or drain, whether or not its ranks were found slow"
    ]
