"""Host recurrence: the host that keeps holding a slow rank, across runs, attempts and windows."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

import rankscope
from rankscope import ConfigError
from rankscope.analysis import HostOptions
from rankscope.analysis.hosts._hosts import find_recurring_hosts
from rankscope.rundir import _attempt as attempt_module
from rankscope.rundir._layout import meta_path, timing_path
from rankscope.testing._gloo import GlooRanks
from rankscope.testing._synthetic import Slowdown, write_timings
from rankscope.timing._record import format_attempt

from .._helpers import run_cli

HOUR_NS = 3600 * 10**9


def _meta(
    run: Path, rank: int, world: int, host: Any, attempt: dict[str, Any] | None = None
) -> None:
    data: dict[str, Any] = {"v": 1, "rank": rank, "world_size": world, "host": host}
    if attempt is not None:
        data["attempt"] = attempt
    path = meta_path(run, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def _run(
    path: Path,
    hosts: list[str],
    slow: list[Slowdown],
    *,
    steps: int = 40,
    seed: int = 0,
    gpu: bool = False,
) -> Path:
    """A run of len(hosts) ranks, rank r on hosts[r] (`gpu`: its records have device times)."""
    write_timings(
        path, ranks=len(hosts), steps=steps, seed=seed, slowdowns=slow, gpu=gpu, write_meta=False
    )
    for rank, host in enumerate(hosts):
        _meta(path, rank, len(hosts), host)
    return path


def _hosts(*extra: str, **named: str) -> list[str]:
    """Eight distinct hosts, with the ranks in `named` (r3="node-17") placed on the host named."""
    hosts = [f"node-{r:02d}" for r in range(8)] + list(extra)
    for key, host in named.items():
        hosts[int(key[1:])] = host
    return hosts


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = run_cli(["hosts", *argv, "--json"], capsys)
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


def _host(data: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [h for h in data["hosts"] if h["host"] == name]
    return found


# -- across runs -------------------------------------------------------------------------


def test_a_host_slow_in_three_of_four_runs_as_different_ranks_is_named_to_drain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [
        _run(tmp_path / "a", _hosts(r3="node-17", r0="node-03"), [Slowdown(3, "forward", 0.5)]),
        _run(
            tmp_path / "b",
            _hosts(r5="node-17", r0="node-05"),
            [Slowdown(5, "forward", 0.5)],
            seed=1,
        ),
        _run(
            tmp_path / "c",
            _hosts(r1="node-17", r0="node-01"),
            [Slowdown(1, "forward", 0.5)],
            seed=2,
        ),
        _run(tmp_path / "d", _hosts(), [], seed=3),  # node-17 is not in this one
    ]
    data = _json([*map(str, runs), "--windows", "1"], capsys)
    assert data["counts"] == {"runs": 4, "attempts": 4, "windows": 0}
    assert [h["host"] for h in data["hosts"]] == ["node-17"]
    host = _host(data, "node-17")
    assert (host["runs"], host["attempts"], host["in_runs"]) == (3, 3, ["a", "b", "c"])
    assert [(r["run"], r["rank"]) for r in host["ranks"]] == [("a", 3), ("b", 5), ("c", 1)]
    assert host["phases"] == ["forward"]
    assert data["summary"] == [
        "node-17 held a slow rank in 3 of 4 runs (rank 3 in a, rank 5 in b and rank 1 in c; "
        "in forward): consider draining it"
    ]
    assert host["summary"] == data["summary"]
    assert data["unknown_hosts"] == [] and data["skipped"] == []


def test_a_host_slow_always_as_the_same_rank_may_be_the_rank_s_own_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [
        _run(tmp_path / name, _hosts(r3="node-17"), [Slowdown(3, "optimizer", 0.5)], seed=seed)
        for seed, name in enumerate(("a", "b"))
    ]
    data = _json([*map(str, runs), "--windows", "1"], capsys)
    (sentence,) = data["summary"]
    assert sentence.startswith("node-17 held a slow rank in 2 of 2 runs, always as rank 3")
    assert "may be the cause as much as the host" in sentence
    assert "draining" not in sentence


def test_slow_hosts_that_differ_from_run_to_run_recur_nowhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _run(tmp_path / "a", _hosts(), [Slowdown(2, "forward", 0.5)])
    b = _run(tmp_path / "b", _hosts(), [Slowdown(6, "forward", 0.5)], seed=1)
    data = _json([str(a), str(b), "--windows", "1"], capsys)
    assert data["summary"] == [
        "nothing recurs: no host held a slow rank in more than one run, attempt or window; "
        "once: node-02 (rank 2 of run a in forward) and node-06 (rank 6 of run b in forward)"
    ]
    assert {h["host"]: h["runs"] for h in data["hosts"]} == {"node-02": 1, "node-06": 1}


def test_runs_without_a_slow_rank_say_there_is_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [_run(tmp_path / n, _hosts(), [], seed=s) for s, n in enumerate("ab")]
    data = _json([*map(str, runs)], capsys)
    assert data["hosts"] == []
    assert data["summary"] == ["nothing recurs: no slow rank in any run, attempt or window"]


# -- across windows of one run ---------------------------------------------------------------


def test_a_host_slow_only_in_the_later_part_of_a_run_holds_those_windows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(
        tmp_path / "run",
        _hosts(r5="node-17"),
        [Slowdown(5, "optimizer", 1.0, from_step=40)],
        steps=80,
    )
    data = _json([str(run)], capsys)  # 8 windows of 10 sampled steps
    assert data["counts"] == {"runs": 1, "attempts": 1, "windows": 8}
    host = _host(data, "node-17")
    windows = sorted(h["window"] for h in host["held"] if h["window"] is not None)
    assert windows == [4, 5, 6, 7]
    assert host["windows"] == 4 and {h["rank"] for h in host["held"]} == {5}
    assert data["summary"] == [
        "node-17 held a slow rank in 4 of 8 windows of run run (steps 40-79; rank 5 in optimizer)"
    ]
    # The whole run finds it too, from the step it began.
    (whole,) = [h for h in host["held"] if h["window"] is None]
    assert whole["since_step"] == 40


def test_windows_are_fewer_where_a_run_has_few_sampled_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path / "short", _hosts(), [Slowdown(4, "forward", 0.5)], steps=25)
    data = _json([str(run), "--windows", "8"], capsys)
    assert data["counts"]["windows"] == 2  # 25 sampled steps: two windows of 10 or more
    run = _run(tmp_path / "shorter", _hosts(), [], steps=12)
    data = _json([str(run)], capsys)
    assert data["counts"]["windows"] == 0
    (note,) = data["runs"][0]["notes"]
    assert note == (
        "run shorter: 12 sampled steps, too few to split into windows (two windows need 20)"
    )


# -- across attempts --------------------------------------------------------------------------


def _attempt(n: int, started_ns: int, launcher: bool) -> dict[str, Any]:
    said = {"attempt": f"token{n}", "started_ns": started_ns, "pid": 100 + n}
    if launcher:
        said |= {"launcher": "torchelastic", "job": "job1", "restart": n - 1}
    else:
        said |= {"launcher": None, "job": None, "restart": None}
    return said


def _restarted(
    root: Path, parts: list[tuple[Path, dict[str, Any]]], hosts: list[list[Any]] | None = None
) -> Path:
    """One run directory whose rank files hold each part's records, in order, each after the
    line that opens its attempt (as a job restarted into one directory writes them). The
    lines name no host (as before they did), or hosts[part][rank]."""
    for i, (part, attempt) in enumerate(parts):
        for source in sorted((part / "timings").iterdir()):
            rank = int(json.loads(source.read_text().splitlines()[0])["rank"])
            target = timing_path(root, rank)
            target.parent.mkdir(parents=True, exist_ok=True)
            host = None if hosts is None else hosts[i][rank]
            with open(target, "a", encoding="utf-8") as out:
                out.write(format_attempt(rank, attempt, host) + source.read_text())
    return root


def test_a_rank_s_host_in_an_earlier_attempt_is_not_guessed_from_the_latest_meta(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attempt lines written before they named a host: the meta file alone places ranks."""
    parts, attempts = [], []
    for n in (1, 2, 3):
        part = tmp_path / f"part{n}"
        write_timings(
            part,
            ranks=8,
            steps=30,
            seed=n,
            slowdowns=[Slowdown(2, "forward", 0.5)],
            write_meta=False,
        )
        attempts.append(_attempt(n, n * HOUR_NS, launcher=True))
        parts.append((part, attempts[-1]))
    run = _restarted(tmp_path / "run", parts)
    for rank, host in enumerate(_hosts(r2="node-17")):
        _meta(run, rank, 8, host, attempts[-1])  # each rank's latest start wrote its meta
    data = _json([str(run), "--windows", "1"], capsys)
    # Attempts 1 and 2 have no known host to compare: the meta files are attempt 3's.
    assert data["counts"] == {"runs": 1, "attempts": 1, "windows": 0}
    assert _host(data, "node-17")["attempts"] == 1
    (unknown,) = {(u["attempt"], u["rank"]) for u in data["unknown_hosts"] if u["attempt"] == 1}
    assert unknown == (1, 2)
    assert (
        "run run: rank 2 was slow in forward in attempts 1-2; its host is not known: its meta "
        "file is of attempt 3 (a rank's meta file holds its latest start; --same-hosts takes "
        "that host for every attempt)"
    ) in data["summary"]
    assert not any("node-17 held" in s for s in data["summary"])

    same = _json([str(run), "--windows", "1", "--same-hosts"], capsys)
    assert same["unknown_hosts"] == []
    assert _host(same, "node-17")["attempts"] == 3
    assert same["summary"][0].startswith(
        "node-17 held a slow rank in 3 of 3 attempts of run run, always as rank 2"
    )


def test_a_host_slow_in_two_attempts_as_different_ranks_is_found_from_each_attempt_s_meta(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job scaled from 8 ranks to 4: ranks 4-7 keep the meta of the first attempt, ranks
    0-3 have the second's. Without a launcher, attempts are told apart by their start."""
    first, second = tmp_path / "first", tmp_path / "second"
    write_timings(
        first, ranks=8, steps=30, slowdowns=[Slowdown(6, "forward", 0.5)], write_meta=False
    )
    write_timings(
        second, ranks=4, steps=30, seed=1, slowdowns=[Slowdown(1, "forward", 0.5)], write_meta=False
    )
    one, two = _attempt(1, HOUR_NS, launcher=False), _attempt(2, 3 * HOUR_NS, launcher=False)
    run = _restarted(tmp_path / "run", [(first, one), (second, two)])
    for rank, host in enumerate(["node-a", "node-17", "node-b", "node-c"]):
        _meta(run, rank, 4, host, two)
    for rank, host in zip(range(4, 8), ["node-d", "node-e", "node-17", "node-f"], strict=True):
        _meta(run, rank, 8, host, one)
    data = _json([str(run), "--windows", "1"], capsys)
    host = _host(data, "node-17")
    assert host["attempts"] == 2
    assert [(r["attempt"], r["rank"]) for r in host["ranks"]] == [(1, 6), (2, 1)]
    assert data["summary"][0] == (
        "node-17 held a slow rank in 2 of 2 attempts of run run (rank 6 in attempt 1 and "
        "rank 1 in attempt 2; in forward): consider draining it"
    )
    assert data["runs"][0]["attempts"] == 2


RESTART_STEPS = 12


def _start_of(monkeypatch: pytest.MonkeyPatch, restart: int) -> None:
    """Make this process a new start: torchelastic's restart `restart` of job1."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(restart))
    monkeypatch.setattr(attempt_module, "_current", None)


def _profile(monkeypatch: pytest.MonkeyPatch, run: Path, hosts: list[str], slow: int) -> None:
    """The ranks of len(hosts), each on its host, with rank `slow` slow in forward.

    Their steps take turns, one step of each rank at a time, as real ranks share the
    same moments: ranks run one after another met different loads of a busy machine,
    and under the test suite's load a rank that ran through a busy stretch was found
    slow too (node-03 beside node-17, once)."""
    config = {"output_dir": str(run), "timer": {"enable": True, "every_n_steps": 1}}
    with contextlib.ExitStack() as started:
        profs = []
        for rank, host in enumerate(hosts):
            monkeypatch.setattr(socket, "gethostname", lambda host=host: host)  # as if on `host`
            prof = rankscope.Profiler(config, rank=rank, world_size=len(hosts))
            profs.append(started.enter_context(prof))
        for _ in range(RESTART_STEPS):
            for rank, prof in enumerate(profs):
                with prof.phase("forward"):
                    # 2 ms, not 0: a busy machine's pause of a fraction of a millisecond
                    # is not an excess of many times a phase that takes a few microseconds.
                    time.sleep(0.02 if rank == slow else 0.002)
                prof.step()


def test_a_restarted_job_s_attempts_each_name_the_host_they_ran_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart moved rank 2 off node-17 and rank 0 onto it; the meta files hold the latest
    start only, so attempt 1's hosts come from its timings' attempt lines."""
    run = tmp_path / "run"
    _start_of(monkeypatch, 0)
    _profile(monkeypatch, run, ["node-00", "node-01", "node-17", "node-03"], slow=2)
    _start_of(monkeypatch, 1)
    _profile(monkeypatch, run, ["node-17", "node-01", "node-02", "node-03"], slow=0)
    assert json.loads(meta_path(run, 2).read_text())["host"] == "node-02"  # the latest start's
    for argv in ([], ["--same-hosts"]):  # a host an attempt line names is never overridden
        data = _json([str(run), "--windows", "1", *argv], capsys)
        assert data["runs"][0]["attempts"] == 2 and data["counts"]["attempts"] == 2
        assert data["unknown_hosts"] == [] and data["skipped"] == []
        assert [h["host"] for h in data["hosts"]] == ["node-17"]
        held = _host(data, "node-17")["ranks"]
        assert [(r["attempt"], r["rank"]) for r in held] == [(1, 2), (2, 0)]
        assert data["summary"][0] == (
            "node-17 held a slow rank in 2 of 2 attempts of run run (rank 2 in attempt 1 and "
            "rank 0 in attempt 2; in forward): consider draining it"
        )


def test_an_attempt_line_s_bad_host_is_said_and_the_host_is_not_known(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parts, attempts = [], []
    for n in (1, 2):
        part = tmp_path / f"part{n}"
        slow = [Slowdown(2, "forward", 0.5)]
        write_timings(part, ranks=8, steps=30, seed=n, slowdowns=slow, write_meta=False)
        attempts.append(_attempt(n, n * HOUR_NS, launcher=True))
        parts.append((part, attempts[-1]))
    lines = [_hosts(r2=12), _hosts(r2="x" * 1000)]  # not a name; longer than any host's
    run = _restarted(tmp_path / "run", parts, lines)
    for rank, host in enumerate(_hosts(r2="node-17")):
        _meta(run, rank, 8, host, attempts[-1])  # rank 2's meta file: attempt 2's start
    data = _json([str(run), "--windows", "1"], capsys)
    path = timing_path(run, 2)
    assert data["skipped"] == [
        f"{path}: the line that opens attempt 1 names no usable host (12, not a host name); "
        "ignored",
        f"{path}: the line that opens attempt 2 names no usable host (a name of 1000 "
        "characters, longer than any host's); ignored",
    ]
    # Attempt 1: not known (the meta file is attempt 2's); attempt 2: from the meta file.
    (unknown,) = data["unknown_hosts"]
    assert (unknown["attempt"], unknown["rank"]) == (1, 2)
    assert unknown["why"] == (
        "its attempt line's host is 12, not a host name; its meta file is of attempt 2 (a "
        "rank's meta file holds its latest start; --same-hosts takes that host for every "
        "attempt)"
    )
    assert [(r["attempt"], r["rank"]) for r in _host(data, "node-17")["ranks"]] == [(2, 2)]
    # One attempt, read whole by DuckDB; no meta files: the lines alone place the ranks.
    one = _restarted(tmp_path / "one", parts[:1], [_hosts(r2=["node-17"])])
    data = _json([str(one), "--windows", "1"], capsys)
    assert data["runs"][0]["hosts"] == sorted(h for h in _hosts() if h != "node-02")
    (unknown,) = data["unknown_hosts"]
    assert (unknown["rank"], unknown["why"]) == (
        2,
        f'its attempt line\'s host is ["node-17"], not a host name; no usable meta file '
        f"({meta_path(one, 2)})",
    )
    assert data["hosts"] == []
    assert data["skipped"] == [
        f'{timing_path(one, 2)}: the line that opens attempt 1 names no usable host (["node-17"], '
        "not a host name); ignored"
    ]


# -- what cannot be told ------------------------------------------------------------------------


def test_a_slow_rank_without_meta_is_said_by_its_rank_and_given_no_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _run(tmp_path / "a", _hosts(r3="node-17"), [Slowdown(3, "forward", 0.5)])
    b = _run(tmp_path / "b", _hosts(r5="node-17"), [Slowdown(5, "forward", 0.5)], seed=1)
    meta_path(b, 5).unlink()
    _meta(a, 3, 8, {"name": "node-17"})  # a host that is no name
    data = _json([str(a), str(b), "--windows", "1"], capsys)
    assert data["hosts"] == []  # node-17 is never guessed
    assert {(u["run"], u["rank"]) for u in data["unknown_hosts"]} == {("a", 3), ("b", 5)}
    assert data["summary"][0].startswith("nothing recurs")
    assert (
        f"run b: rank 5 was slow in forward; its host is not known: no usable meta file ({meta_path(b, 5)})"
        in data["summary"]
    )
    assert (
        f"run a: rank 3 was slow in forward; its host is not known: its meta file names no host ({meta_path(a, 3)})"
        in data["summary"]
    )


def test_ranks_all_on_one_host_name_no_host_and_are_left_out_of_the_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run(tmp_path / "box", ["node-1"] * 4, [Slowdown(2, "forward", 0.5)])
    data = _json([str(run), "--windows", "1"], capsys)
    assert data["hosts"] == [] and data["counts"]["runs"] == 0
    assert data["single_host"] == [
        {
            "run": "box",
            "attempt": 1,
            "window": None,
            "steps": [0, 39],
            "host": "node-1",
            "ranks": [2],
        }
    ]
    assert data["summary"][-1] == (
        "run box: every rank ran on node-1, so its slow ranks (rank 2 in forward) say nothing "
        "of one host against another"
    )


def test_device_time_says_which_runs_have_none_and_leaves_them_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slow = [Slowdown(3, "forward", 0.5)]
    gpu = _run(tmp_path / "gpu", _hosts(r3="node-17"), slow, gpu=True)
    cpu = _run(tmp_path / "cpu", _hosts(r3="node-17"), slow, seed=1)
    data = _json([str(gpu), str(cpu), "--windows", "1", "--time", "device"], capsys)
    assert data["counts"] == {"runs": 1, "attempts": 1, "windows": 0}
    assert [(r["label"], r["no_device_times"]) for r in data["runs"]] == [("gpu", []), ("cpu", [1])]
    assert _host(data, "node-17")["in_runs"] == ["gpu"]
    assert (
        "run cpu: no device times (gpu_ms) in the timings, so left out (--time host compares "
        "host times)"
    ) in data["summary"]
    # Host time finds node-17 in both.
    assert _host(_json([str(gpu), str(cpu), "--windows", "1"], capsys), "node-17")["runs"] == 2


def test_device_time_of_runs_without_a_gpu_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [
        _run(tmp_path / n, _hosts(), [Slowdown(1, "forward", 0.5)], seed=s)
        for s, n in enumerate("ab")
    ]
    code, out, err = run_cli(["hosts", *map(str, runs), "--time", "device"], capsys)
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert "nothing to compare: no device times (gpu_ms) in the timings of" in err
    assert str(runs[0]) in err and str(runs[1]) in err


# -- bad input and the terminal ---------------------------------------------------------------


def test_a_bad_directory_among_good_ones_is_named_and_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _run(tmp_path / "good", _hosts(), [Slowdown(1, "forward", 0.5)])
    empty = tmp_path / "empty"
    empty.mkdir()
    a_file = tmp_path / "file.txt"
    a_file.write_text("not a run")
    data = _json([str(good), str(empty), str(a_file), str(tmp_path / "gone"), str(good)], capsys)
    assert [r["label"] for r in data["runs"]] == ["good"]
    skipped = data["skipped"]
    assert skipped[0] == f"{good}: given twice (as {good}); read once"
    assert skipped[1].startswith(f"{empty}: no timings")
    assert skipped[2] == f"{a_file}: not a directory (expected a run directory)"
    assert skipped[3] == f"{tmp_path / 'gone'}: no such directory"
    code, out, err = run_cli(["hosts", str(good), str(empty)], capsys)
    assert code == 0 and err == ""
    assert "Skipped input (1):" in out and str(empty) in out


def test_no_usable_directory_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inside = _run(tmp_path / "run", _hosts(), []) / "timings"
    code, out, err = run_cli(["hosts", str(tmp_path / "gone"), str(inside), "--json"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert err.startswith("rankscope hosts: no run directory to read: ")
    assert f"{tmp_path / 'gone'}: no such directory" in err
    assert f"{inside} lies inside the run directory {tmp_path / 'run'}" in err
    assert run_cli(["hosts", str(tmp_path / "run"), "--windows", "0"], capsys)[0] == 2
    with pytest.raises(ConfigError, match="windows"):
        find_recurring_hosts([tmp_path / "run"], HostOptions(windows=0))


def test_the_terminal_says_the_sentences_and_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [
        _run(tmp_path / n, _hosts(**{f"r{r}": "node-17"}), [Slowdown(r, "forward", 0.5)], seed=s)
        for s, (n, r) in enumerate((("a", 3), ("b", 5)))
    ]
    code, out, err = run_cli(["hosts", *map(str, runs), "--windows", "1"], capsys)
    assert code == 0, err
    text = " ".join(out.split())
    assert (
        "node-17 held a slow rank in 2 of 2 runs (rank 3 in a and rank 5 in b; in forward): consider draining it"
        in text
    )
    assert "node-17 2/2 2/2 0/0 3 (a), 5 (b) forward" in text


# -- a real job ---------------------------------------------------------------------------------

WORLD = 2
SLOW_RANK = 1
STEPS = 24


def _job(rank: int, world_size: int, run_dir: str) -> None:

    import torch
    import torch.distributed as dist

    import rankscope

    config = rankscope.ProfileConfig(
        output_dir=run_dir, timer=rankscope.TimerConfig(enable=True, every_n_steps=1)
    )
    x = torch.ones(4)
    with rankscope.Profiler(config) as prof:
        for _ in range(STEPS):
            with prof.phase("forward"):
                time.sleep(0.03 if rank == SLOW_RANK else 0.005)
            with prof.phase("allreduce", kind="comm"):
                dist.all_reduce(x)  # rank 0 waits here for the slow rank
            prof.step()
    dist.barrier()


@pytest.mark.serial
@pytest.mark.slow
def test_a_real_job_s_slow_rank_is_placed_on_the_host_its_meta_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gloo_ranks: GlooRanks
) -> None:
    run = tmp_path / "run"
    gloo_ranks.run(_job, WORLD, run)
    data = _json([str(run)], capsys)
    here = socket.gethostname()
    assert data["runs"][0]["hosts"] == [here]  # from the meta files the ranks wrote
    (whole,) = [u for u in data["single_host"] if u["window"] is None]
    assert whole["host"] == here and whole["ranks"] == [SLOW_RANK]
    assert data["counts"]["windows"] == 0  # one host: nothing to compare, in any window
    assert data["hosts"] == []
    assert (
        f"run run: every rank ran on {here}, so its slow ranks (rank {SLOW_RANK} in forward)"
        in data["summary"][-1]
    )


def test_one_launch_on_a_host_whose_clock_is_15_minutes_off_is_one_attempt(
    tmp_path: Path,
) -> None:
    # No launcher and no rendezvous say which starts are one launch: starts within ten
    # minutes are. Host B's clock 15 minutes behind made its ranks a second attempt.
    from rankscope.analysis import read_timings

    part = tmp_path / "part"
    write_timings(part, ranks=4, steps=12, slowdowns=[Slowdown(1, "forward", 0.5)])
    started = 1_795_000_000 * 10**9
    for rank in range(4):
        source = timing_path(part, rank)
        behind = 0 if rank < 2 else 900 * 10**9  # ranks 2, 3 on host B
        attempt = _attempt(1, started - behind, launcher=False)
        lines = [json.loads(line) for line in source.read_text().splitlines()]
        lines = [record for record in lines if "attempt" not in record]  # its own line
        for record in lines:
            record["start_ns"] -= behind
        target = timing_path(tmp_path / "run", rank)
        target.parent.mkdir(parents=True, exist_ok=True)
        host = "node-a" if rank < 2 else "node-b"
        target.write_text(
            format_attempt(rank, attempt | {"attempt": f"tok{rank}"}, host)
            + "".join(json.dumps(r) + "\n" for r in lines)
        )
    run = read_timings(tmp_path / "run")
    assert run.attempts.count == 1, run.attempts.described
    # A second start of the same ranks an hour later is a second attempt, as before.
    for rank in range(4):
        target = timing_path(tmp_path / "run", rank)
        again = _attempt(2, started + 3600 * 10**9, launcher=False)
        with open(target, "a", encoding="utf-8") as out:
            out.write(format_attempt(rank, again | {"attempt": f"again{rank}"}, "node-a"))
            out.write(timing_path(part, rank).read_text())
    assert read_timings(tmp_path / "run").attempts.count == 2
