"""trace.trigger_max_windows: on-demand windows per run on a rank are bounded, and the
requests past the bound are answered, counted and warned about once."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

import rankscope
from rankscope._errors import ConfigError
from rankscope.capture._requests import Asked, WindowRequests
from rankscope.capture._schedule import StepPlan
from rankscope.rundir._trigger import read_acks
from rankscope.testing._gloo import GlooRanks

from .._helpers import final_files, run_cli

# -- the rule, in the one door -------------------------------------------------------


def _requests(max_windows: int) -> WindowRequests:
    config = rankscope.TraceConfig(enable=True, trigger_max_windows=max_windows)
    return WindowRequests(config, StepPlan(None))


def _trigger(name: str) -> Asked:
    return Asked(f"trigger {name}", f"trigger-{name}", on_demand=True)


def test_on_demand_windows_past_the_bound_are_declined_and_counted() -> None:
    requests = _requests(2)
    assert not isinstance(requests.ask(_trigger("a"), 10, 1, 2), str)
    assert not isinstance(
        requests.ask_next(Asked("SIGUSR2", "sigusr2", on_demand=True), 1, 20), str
    )
    why = requests.ask(_trigger("c"), 30, 1, 22)
    assert why == "this rank has recorded trace.trigger_max_windows (2) on-demand windows this run"
    assert requests.ask_next(Asked("SIGUSR2", "sigusr2", on_demand=True), 1, 40) == why
    assert requests.past_bound == 2
    # An anomaly window has its own bound (auto.max_captures), not this one.
    assert not isinstance(requests.ask_next(Asked("slow steps", "slow-steps"), 1, 50), str)
    # A request declined for another reason is not counted as one the bound declined.
    assert requests.ask(_trigger("late"), 3, 1, 60).startswith("seen at step 60")
    assert requests.past_bound == 2


def test_a_window_given_up_before_it_began_gives_its_place_back() -> None:
    requests = _requests(1)
    window = requests.ask_next(_trigger("a"), 1, 5)
    assert not isinstance(window, str)
    # Its profiler could not start during step 5 (another one ran): the window is given up.
    assert [w.first for w, _ in requests.drop_next(5)] == [window.first]
    assert not isinstance(requests.ask(_trigger("b"), 20, 1, 10), str)
    assert requests.past_bound == 0


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "3"])
def test_the_bound_is_checked_naming_the_field(value: object) -> None:
    with pytest.raises(ConfigError, match=r"trace\.trigger_max_windows"):
        rankscope.TraceConfig(trigger_max_windows=value)  # type: ignore[arg-type]


# -- a real job, asked for more windows than it may record ---------------------------

WORLD = 2
MAX_WINDOWS = 3
STARTS = [8 + 3 * i for i in range(8)]  # one recorded step each, a warm-up step before
STEPS = STARTS[-1] + 3
ASK_AT = 2  # rank 0 runs `rankscope trigger` once per start during this step


def bounded_job(rank: int, world_size: int, run_dir: str) -> None:
    """Train with DDP; during step ASK_AT, `rankscope trigger RUN --ranks all` once per
    start in STARTS, as a user at a terminal would, each in its own process."""
    run = Path(run_dir)
    log = logging.FileHandler(run / f"log-{rank}.txt")
    log.setLevel(logging.INFO)
    logger = logging.getLogger("rankscope")
    logger.addHandler(log)
    logger.setLevel(logging.INFO)
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    config = rankscope.ProfileConfig(
        output_dir=run,
        trace=rankscope.TraceConfig(
            enable=True, trigger_check_every_n_steps=2, trigger_max_windows=MAX_WINDOWS
        ),
        timer=rankscope.TimerConfig(enable=True, every_n_steps=1, flush_every_n_steps=1),
    )
    try:
        with rankscope.Profiler(config) as prof:
            for step in range(STEPS):
                with prof.phase("forward"):
                    loss = model(torch.randn(8, 16)).sum()
                with prof.phase("backward"):
                    loss.backward()
                opt.step()
                opt.zero_grad()
                if step == ASK_AT:
                    dist.barrier()
                    if rank == 0:
                        _ask_from_the_cli(run)
                    dist.barrier()
                prof.step()
        dist.barrier()
    finally:
        logger.removeHandler(log)
        log.close()


def _ask_from_the_cli(run: Path) -> None:
    written = []
    for start in STARTS:
        command = [sys.executable, "-m", "rankscope.cli", "trigger", str(run), "--ranks", "all"]
        command += ["--at", str(start), "--steps", "1", "--json"]
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
        written.append({"code": done.returncode, "out": done.stdout, "err": done.stderr})
    (run / "asked.json").write_text(json.dumps(written))


@pytest.fixture(scope="module")
def bounded_run(tmp_path_factory: pytest.TempPathFactory, gloo_ranks: GlooRanks) -> Path:
    root = tmp_path_factory.mktemp("bounded")
    gloo_ranks.run(bounded_job, WORLD, root)
    return root


@pytest.mark.slow
def test_a_job_asked_for_more_windows_records_its_bound_and_answers_the_rest(
    bounded_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asked = json.loads((bounded_run / "asked.json").read_text())
    assert [a["code"] for a in asked] == [0] * len(STARTS), [a["err"] for a in asked]
    ids = [json.loads(a["out"])["id"] for a in asked]
    windows = sorted({f.split("/")[1] for f in final_files(bounded_run) if "-trigger-" in f})
    # The first MAX_WINDOWS triggers by id (each rank answers in id order) on every rank.
    first = sorted(ids)[:MAX_WINDOWS]
    assert windows == sorted(
        f"step-{s:06d}-{s:06d}-trigger-{i}" for s, i in zip(STARTS, ids, strict=True) if i in first
    )
    for rank in range(WORLD):
        saved = [f for f in final_files(bounded_run) if f.endswith(f"rank-{rank:05d}.summary.json")]
        assert sum("-trigger-" in f for f in saved) == MAX_WINDOWS
    # Every request past the bound is answered so on every rank, and counted in order.
    declined = sorted(ids)[MAX_WINDOWS:]
    for rank in range(WORLD):
        answers = [read_acks(bounded_run, i)[rank] for i in declined]
        assert {a["status"] for a in answers} == {"declined"}
        assert {a["reason"] for a in answers} == {
            f"this rank has recorded trace.trigger_max_windows ({MAX_WINDOWS}) on-demand "
            "windows this run"
        }
        assert [a["declined_past_bound"] for a in answers] == list(range(1, len(declined) + 1))
        lines = (bounded_run / f"log-{rank}.txt").read_text().splitlines()
        bound = [line for line in lines if "trace.trigger_max_windows" in line]
        assert len(bound) == 2, lines  # one warning at the first, the count at stop()
        assert "later on-demand requests are declined too" in bound[0]
        assert f"declined {len(declined)} on-demand requests past" in bound[1]
    # What `rankscope trigger --status` tells the one who asked.
    code, out, err = run_cli(["trigger", str(bounded_run), "--status", "--json"], capsys)
    assert code == 0, err
    states = {t["id"]: t for t in json.loads(out)["triggers"]}
    for i in declined:
        assert states[i]["ranks_by_state"]["declined"] == [0, 1]
        assert "trace.trigger_max_windows (3)" in states[i]["reasons"]["0"]
    for i in first:
        assert states[i]["ranks_by_state"]["saved"] == [0, 1]
