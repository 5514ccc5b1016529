"""Detect, capture the pair: a rank whose forward turns slow records its next steps, and
one healthy peer, asked through RUN_DIR/triggers, records the same steps into its window."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import rankscope
from rankscope import AutoTrigger
from rankscope.testing._gloo import GlooRanks

from .._helpers import run_cli

WORLD = 4
SLOW_RANK = 2
SLOW_FROM = 14  # the slow rank's forward does REPS matrix products from this step on
RUN_STEPS = 34
REPS = 60
SIZE = 256
BASE_S = 0.002  # every forward sleeps this long, so scheduler jitter is small beside it
AUTO = {"enable": True, "ratio": 4.0, "warmup_steps": 8, "history_steps": 20, "window_steps": 2}


def pair_job(rank: int, world_size: int, run_dir: str) -> None:
    """Every rank watches its own forward; rank SLOW_RANK's does REPS times the matrix
    products from step SLOW_FROM. The ranks name a parallel group: the even ranks share one."""
    import torch.distributed as dist

    config = rankscope.ProfileConfig(
        output_dir=run_dir,
        trace=rankscope.TraceConfig(
            enable=True,
            ranks="0",
            auto=AutoTrigger(**AUTO, ranks="all", phase="forward"),
            trigger_check_every_n_steps=2,
        ),
        timer=rankscope.TimerConfig(enable=True, every_n_steps=1, flush_every_n_steps=1),
    )
    a, b = torch.randn(SIZE, SIZE), torch.randn(SIZE, SIZE)
    with rankscope.Profiler(config, groups={"stage": rank % 2}) as prof:
        for i in range(RUN_STEPS):
            with prof.phase("forward"):
                time.sleep(BASE_S)
                reps = REPS if rank == SLOW_RANK and i >= SLOW_FROM else 1
                for _ in range(reps):
                    out = torch.mm(a, b)
            with prof.phase("loss_allreduce", kind="comm"):
                dist.all_reduce(out[:1, :1].clone())  # every rank waits here for the slow one
            prof.step()
    dist.barrier()


@pytest.fixture(scope="module")
def pair_run(gloo_ranks: GlooRanks, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("pair")
    gloo_ranks.run(pair_job, WORLD, run_dir)
    return run_dir


def _auto_lines(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted((run_dir / "auto").glob("rank-*.jsonl")):
        out[int(path.stem[5:])] = [json.loads(line) for line in path.read_text().splitlines()]
    return out


@pytest.mark.serial
def test_only_the_slow_rank_fires_and_its_peer_records_the_same_steps(pair_run: Path) -> None:
    fired = _auto_lines(pair_run)
    assert list(fired) == [SLOW_RANK]  # the waiting ranks do not fire, nor does the peer
    (line,) = fired[SLOW_RANK]
    assert line["status"] == "accepted", line
    peer = line["peer"]
    # rank 0 shares the slow rank's group (stage 0); rank 1 and 3 are nearer but do not
    assert peer["rank"] == 0, peer
    assert "same stage=0" in peer["why"] and "same host" in peer["why"]
    window = line["window"]
    assert window.endswith("-slow-forward")
    traced = sorted(p.name for p in (pair_run / "traces" / window).glob("*.pt.trace.json.gz"))
    assert traced == ["rank-00000.pt.trace.json.gz", f"rank-{SLOW_RANK:05d}.pt.trace.json.gz"]
    answer = json.loads((pair_run / "triggers" / peer["trigger"] / "rank-00000.json").read_text())
    assert answer["status"] == "accepted" and answer["window"] == window
    summary = json.loads((pair_run / "traces" / window / "rank-00000.summary.json").read_text())
    because = summary["captured_because"]
    assert because["by"] == "peer" and because["asked_by"] == SLOW_RANK


@pytest.mark.serial
def test_the_slow_finding_carries_the_matrix_product_that_grew_against_its_peer(
    pair_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(["stragglers", str(pair_run), "--json"], capsys)
    assert code == 0
    # Only this one is asserted: on a busy machine another (rank, phase) may be slow too.
    (finding,) = [
        f
        for f in json.loads(out)["findings"]
        if (f["rank"], f["phase"], f["role"]) == (SLOW_RANK, "forward", "slow")
    ]
    evidence = finding["evidence"]
    (line,) = _auto_lines(pair_run)[SLOW_RANK]
    assert evidence["window"] == line["window"] and evidence["peer_rank"] == 0
    assert evidence["steps"] == [line["first"], line["last"]]
    assert evidence["kind"] == "cpu_ops" and evidence["scope"] == "phase forward"
    assert evidence["asked"]["rank"] == 0 and evidence["asked"]["answer"] == "accepted"
    top = evidence["ops"][0]
    assert top["name"] == "aten::mm" and top["peer_rank"] == 0
    # REPS products a step against one: the delta is most of the slow rank's time in them
    assert top["delta_ms"] == pytest.approx(top["slow_ms"] - top["peer_ms"], abs=1e-3)
    assert top["slow_ms"] > 5 * top["peer_ms"] > 0
    deltas = [op["delta_ms"] for op in evidence["ops"]]
    assert deltas == sorted(deltas, reverse=True)
    # The phase's own growth in the window, and the products hold most of it.
    slow_phase, peer_phase = evidence["phase_ms"]
    assert slow_phase > peer_phase and top["delta_ms"] > 0.5 * (slow_phase - peer_phase)

    first, last = line["first"], line["last"]
    said = f"rank {SLOW_RANK} is slow in forward: aten::mm +{top['delta_ms']:.1f} ms a step"
    code, out, _ = run_cli(["stragglers", str(pair_run)], capsys)
    assert code == 0
    flat = " ".join(out.split())  # the terminal wraps between words
    assert said in flat and f"against rank 0 at steps {first}-{last}" in flat

    html = pair_run / "report.html"
    code, out, _ = run_cli(["report", str(pair_run), "-o", str(html)], capsys)
    assert code == 0
    assert said in " ".join(out.split())
    page = html.read_text()
    assert said in page and f"against rank 0 at steps {first}-{last}" in page


# -- choosing the peer, from the run directory's files ---------------------------------------


def _meta(run_dir: Path, rank: int, host: str, listens: bool = True, **groups: int) -> None:
    from rankscope.config._ranks import RankInfo
    from rankscope.rundir._meta import write_meta

    every = 5 if listens else 0
    config = rankscope.ProfileConfig(
        trace=rankscope.TraceConfig(enable=True, trigger_check_every_n_steps=every)
    )
    info = RankInfo(rank, rank % 2, 6, 2, host)
    write_meta(str(run_dir), info, config.to_dict(), {"attempt": f"t{rank}"}, groups)


def _heartbeat(run_dir: Path, rank: int, **fields: Any) -> None:
    (run_dir / "live").mkdir(exist_ok=True)
    beat = {"rank": rank, "step": 40, "state": "running", "hang": None, **fields}
    (run_dir / "live" / f"rank-{rank:05d}.json").write_text(json.dumps(beat))


def test_the_peer_shares_the_slow_rank_s_group_then_its_host_and_is_not_slow_itself(
    tmp_path: Path,
) -> None:
    from rankscope.capture._pair import choose_peer

    for rank, host in enumerate(["a", "a", "b", "b", "b", "a"]):
        _meta(tmp_path, rank, host, stage=rank % 3)
    # rank 2 is slow; rank 5 shares its stage (2), rank 3 and 4 its host, rank 1 is nearest
    _heartbeat(tmp_path, 5, step=43)
    peer = choose_peer(str(tmp_path), 2, 40)
    assert peer.rank == 5 and peer.why.startswith("same stage=2, not slow"), peer
    assert peer.lead == 5 + 3 + 3  # its check interval, how far it ran ahead, the margin
    # a peer that fired its own slow window, or whose heartbeat names a hang, is not asked
    (tmp_path / "auto").mkdir()
    (tmp_path / "auto" / "rank-00005.jsonl").write_text('{"rank": 5}\n')
    _heartbeat(tmp_path, 3, hang="step-40")
    peer = choose_peer(str(tmp_path), 2, 40)
    assert peer.rank == 4 and peer.why.startswith("same host b"), peer


def test_without_a_rank_that_listens_no_peer_is_asked_and_the_record_says_why(
    tmp_path: Path,
) -> None:
    from rankscope.capture._pair import choose_peer

    for rank in range(3):
        _meta(tmp_path, rank, "a", listens=rank == 2)
    peer = choose_peer(str(tmp_path), 2, 40)
    assert peer.rank is None
    assert peer.why == (
        "no rank can be asked (ranks 0, 1: checks for no triggers "
        "(trace.trigger_check_every_n_steps is 0))"
    )


# -- what the peer answers --------------------------------------------------------------------


def _peer_side(tmp_path: Path) -> tuple[Any, Any]:
    from rankscope.capture._ondemand import OnDemand
    from rankscope.capture._requests import WindowRequests
    from rankscope.capture._schedule import StepPlan

    config = rankscope.TraceConfig(enable=True, trigger_max_windows=1)
    requests = WindowRequests(config, StepPlan(None))
    return requests, OnDemand(str(tmp_path), 0, requests, 1)


def _ask(tmp_path: Path, trigger_id: str, first: int) -> dict[str, Any]:
    from rankscope.capture._pair import ask_peer

    ask_peer(str(tmp_path), trigger_id, rank=2, peer=0, tag="slow-forward", first=first, steps=2)
    return {"id": trigger_id, "window": f"step-{first:06d}-{first + 1:06d}-slow-forward"}


def _answer(tmp_path: Path, trigger_id: str) -> dict[str, Any]:
    path = tmp_path / "triggers" / trigger_id / "rank-00000.json"
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def test_a_peer_records_into_the_slow_rank_s_window_outside_its_on_demand_bound(
    tmp_path: Path,
) -> None:
    requests, asking = _peer_side(tmp_path)
    first = _ask(tmp_path, "auto-rank2-1-aaaaaa", 20)
    asking.check_triggers(10)
    answer = _answer(tmp_path, first["id"])
    assert answer["status"] == "accepted" and answer["window"] == first["window"]
    (window,) = requests.plan.added
    assert requests.name(window) == first["window"]
    assert requests.on_demand == 0  # the slow rank's max_captures bounds the pair, not this


def test_a_peer_busy_with_its_own_window_or_asked_too_late_declines_and_says_why(
    tmp_path: Path,
) -> None:
    _, asking = _peer_side(tmp_path)
    _ask(tmp_path, "auto-rank2-1-aaaaaa", 20)
    asking.check_triggers(10)
    _ask(tmp_path, "auto-rank3-1-bbbbbb", 21)
    _ask(tmp_path, "auto-rank1-1-cccccc", 8)
    time.sleep(0.01)
    asking.check_triggers(12)
    busy = _answer(tmp_path, "auto-rank3-1-bbbbbb")
    assert busy["status"] == "declined"
    assert busy["reason"] == "step 21 already belongs to an earlier trigger's window"
    late = _answer(tmp_path, "auto-rank1-1-cccccc")
    assert late["status"] == "declined"
    assert late["reason"] == "seen at step 12, too late for its start step 8"


# -- what the slow rank asks ------------------------------------------------------------------


def _slow_side(tmp_path: Path, phase: str, step: int = 40) -> tuple[Any, dict[str, Any]]:
    from rankscope.capture._auto import SlowSteps
    from rankscope.capture._ondemand import OnDemand

    requests, _ = _peer_side(tmp_path)
    asking = OnDemand(str(tmp_path), 2, requests, 0)
    slow = SlowSteps(
        step=step - 1, seconds=(0.5,) * 3, steps=(37, 38, 39), median=0.1, ratio=2.0, capture=1
    )
    asking.on_slow(slow, step, phase, 2)
    (line,) = _auto_lines(tmp_path)[2]
    return requests, line


def test_the_slow_rank_s_window_begins_late_enough_for_its_peer_and_names_the_peer_s_folder(
    tmp_path: Path,
) -> None:
    from rankscope.rundir._trigger import read_trigger

    for rank in range(3):
        _meta(tmp_path, rank, "a")
    _, line = _slow_side(tmp_path, "attn/fwd")
    # the peer checks every 5 steps; 3 more for its check's step, its warm-up and a margin
    assert line["status"] == "accepted" and (line["first"], line["last"]) == (48, 49)
    assert line["window"] == "step-000048-000049-slow-attn_fwd"
    assert line["peer"]["rank"] == 1
    trigger = read_trigger(tmp_path / "triggers" / f"{line['peer']['trigger']}.json")
    assert (trigger.ranks, trigger.asked_by, trigger.start, trigger.steps) == ("1", 2, 48, 2)
    assert trigger.window == line["window"]  # the peer's trace lands in the same folder


def test_a_slow_rank_whose_own_window_is_declined_asks_no_peer(tmp_path: Path) -> None:
    from rankscope.capture._requests import Asked

    for rank in range(3):
        _meta(tmp_path, rank, "a")
    requests, _ = _peer_side(tmp_path)
    requests.ask(Asked("trigger x", "trigger-x"), 48, 2, 1)  # the steps are taken
    from rankscope.capture._auto import SlowSteps
    from rankscope.capture._ondemand import OnDemand

    slow = SlowSteps(
        step=39, seconds=(0.5,) * 3, steps=(37, 38, 39), median=0.1, ratio=2.0, capture=1
    )
    OnDemand(str(tmp_path), 2, requests, 0).on_slow(slow, 40, "forward", 2)
    (line,) = _auto_lines(tmp_path)[2]
    assert line["status"] == "declined"
    assert line["peer"]["trigger"] is None and line["peer"]["not_asked"] == "no window"
    assert not (tmp_path / "triggers").exists() or not list((tmp_path / "triggers").glob("*.json"))


def test_a_peer_in_a_slow_stretch_of_its_own_declines_as_not_healthy(tmp_path: Path) -> None:
    from rankscope.capture._anomaly import AnomalyDetector

    watch = AnomalyDetector(AutoTrigger(enable=True, warmup_steps=3, history_steps=5), 0)
    began = 0.0
    for step, seconds in enumerate([0.1] * 8 + [0.5, 0.5]):  # two slow steps: not yet fired
        watch.step_began = began
        watch.observe(step, began + seconds, profiled=False, enabled=True)
        began += seconds
    requests, asking = _peer_side(tmp_path)
    asking.slow_itself = watch.slow_itself
    _ask(tmp_path, "auto-rank2-1-aaaaaa", 20)
    asking.check_triggers(10)
    answer = _answer(tmp_path, "auto-rank2-1-aaaaaa")
    assert answer["status"] == "declined"
    assert answer["reason"] == (
        "this rank is slow itself (its last 2 step times were slow): not a healthy peer"
    )
    assert requests.plan.added == ()


def test_a_trigger_that_names_its_tag_records_into_the_folder_its_answer_names(
    tmp_path: Path,
) -> None:
    from rankscope.rundir._trigger import Trigger, write_trigger

    requests, asking = _peer_side(tmp_path)
    write_trigger(str(tmp_path), Trigger("by-hand", 20, 2, "0", None, "mine"))
    asking.check_triggers(10)
    answer = _answer(tmp_path, "by-hand")
    (window,) = requests.plan.added
    assert answer["window"] == requests.name(window) == "step-000020-000021-mine"
    assert requests.on_demand == 1  # not a slow rank's peer: an on-demand window


def test_only_the_ranks_nearest_in_number_are_read_to_choose_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rankscope.capture import _pair

    for rank in range(6):
        _meta(tmp_path, rank, "a", stage=0 if rank in (0, 5) else 1)
    assert _pair.choose_peer(str(tmp_path), 0, 40).rank == 5  # it shares rank 0's stage
    monkeypatch.setattr(_pair, "CANDIDATES", 2)
    peer = _pair.choose_peer(str(tmp_path), 0, 40)
    assert peer.rank == 1 and peer.why.startswith("same host a"), peer
