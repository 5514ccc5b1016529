"""rankscope.integrations.ray on a real local Ray: actors that hold ranks of a gloo group."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")  # the ray extra's: a GPU host's runtime may lack it

import ray
import ray.exceptions
import torch
import torch.distributed as dist

import rankscope
from rankscope.integrations import ray as rs_ray
from rankscope.integrations.ray import (
    RankscopeWorker,
    profile_actors,
    start_profiling,
    step_profiling,
    stop_profiling,
)

from .._helpers import event_names, final_files, read_trace, timing_records

REPO = Path(__file__).resolve().parents[2]
PHASES = {"forward", "backward", "grad_allreduce", "optimizer"}
LOGGER = "rankscope.integrations.ray"


class Worker(RankscopeWorker):
    """A tiny trainer: one rank of a gloo group in a Ray actor, or a lone process."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.rank, self.world_size = 0, 1

    def join(self, init_method: str, rank: int, world_size: int) -> None:
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
        self.rank, self.world_size = rank, world_size

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def reset(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.data = torch.Generator().manual_seed(seed + self.rank)

    def train_step(self) -> float:
        with self.profile_phase("forward"):
            x = torch.randn(16, 8, generator=self.data)
            loss = self.model(x).pow(2).mean()
        with self.profile_phase("backward"):
            loss.backward()
        if self.world_size > 1:
            with self.profile_phase("grad_allreduce", kind="comm", params=4):
                for p in self.model.parameters():
                    assert p.grad is not None
                    dist.all_reduce(p.grad)
                    p.grad /= self.world_size
        self.optimizer_step()
        return float(loss.item())

    @rankscope.annotate("optimizer")
    def optimizer_step(self) -> None:
        self.opt.step()
        self.opt.zero_grad()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def _records(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    return timing_records(run_dir, rank)


def _config(run_dir: Path, **timer: Any) -> rankscope.ProfileConfig:
    return rankscope.ProfileConfig(
        output_dir=run_dir,
        timer=rankscope.TimerConfig(enable=True, **{"every_n_steps": 2, **timer}),
        trace=rankscope.TraceConfig(
            enable=True, ranks="0", schedule=rankscope.Schedule(wait=1, warmup=1, active=1)
        ),
    )


# -- the mixin in this process (no Ray) -----------------------------------------------


def test_summary_before_start_is_off_and_plain_json() -> None:
    summary = Worker().profile_summary()
    assert summary["state"] == "off"
    assert summary["rank"] is None and summary["faults"] == []
    assert json.loads(json.dumps(summary)) == summary


def test_worker_profiles_its_own_steps_in_process(tmp_path: Path) -> None:
    worker = Worker()
    worker.reset(0)
    assert isinstance(worker.profile_phase("forward"), contextlib.nullcontext)
    started = worker.start_profile(_config(tmp_path, every_n_steps=1).to_dict(), 0, 1)
    assert started["state"] == "running"
    assert rankscope.current() is not None  # annotate() finds it
    for _ in range(3):
        worker.train_step()
        worker.step_profile()
    stopped = worker.stop_profile()
    assert stopped["state"] == "stopped", stopped
    assert worker.stop_profile()["state"] == "stopped"  # safe twice
    assert rankscope.current() is None
    records = _records(tmp_path, 0)
    assert {r["phase"] for r in records} == {"forward", "backward", "optimizer", "step"}
    assert sorted({r["step"] for r in records}) == [0, 1, 2]
    assert stopped["trace_windows"] == ["step-000002-000002"]
    assert stopped["timings_file"] == str(tmp_path / "timings" / "rank-00000.jsonl")
    assert stopped["last_summary"]["window"] == "step-000002-000002"
    assert json.loads(json.dumps(stopped)) == stopped
    # After stop, phases are no-ops again and write nothing.
    before = (tmp_path / "timings" / "rank-00000.jsonl").read_text()
    worker.train_step()
    assert (tmp_path / "timings" / "rank-00000.jsonl").read_text() == before


def test_start_while_running_warns_and_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    worker = Worker()
    worker.start_profile(_config(tmp_path / "a"), rank=0, world_size=1)
    try:
        with caplog.at_level(logging.WARNING, LOGGER):
            again = worker.start_profile(_config(tmp_path / "b"), rank=0, world_size=1)
        assert again["state"] == "running"
        assert again["run_dir"] == str(tmp_path / "a")
        assert "while profiling runs; ignored" in caplog.text
    finally:
        worker.stop_profile()
    # A new start after stop is a new run.
    assert worker.start_profile(_config(tmp_path / "b"), 0, 1)["run_dir"] == str(tmp_path / "b")
    worker.stop_profile()


def test_bad_config_on_the_worker_fails_that_worker_only(caplog: pytest.LogCaptureFixture) -> None:
    worker = Worker()
    worker.reset(0)
    with caplog.at_level(logging.WARNING, LOGGER):
        summary = worker.start_profile({"timer": {"every_n_steps": 0}}, 0, 1)
        worker.train_step()  # phases are no-ops
        worker.step_profile()
        stopped = worker.stop_profile()
    assert summary["state"].startswith("failed: start_profile failed: ConfigError: ")
    assert "timer.every_n_steps=0" in summary["state"]
    assert stopped["state"] == summary["state"]
    warnings = [r for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1, caplog.text
    assert "profiling off on this worker" in warnings[0].getMessage()


def test_worker_warnings_reach_stderr_where_no_logging_is_configured() -> None:
    # A Ray worker configures no logging; collecting warnings for the summary must not
    # keep them from Python's fallback to stderr.
    code = """
        from rankscope.integrations.ray import RankscopeWorker

        summary = RankscopeWorker().start_profile({"timer": {"every_n_steps": 0}}, 0, 1)
        print(summary["state"])
        """
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("failed: start_profile failed: ConfigError: ")
    assert done.stderr.startswith("rankscope: profiling off on this worker (rank 0)"), done.stderr


def test_a_fault_inside_the_profiler_is_caught_once_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    worker = Worker()
    worker.reset(0)
    worker.start_profile(_config(tmp_path, every_n_steps=1), 0, 1)
    worker.train_step()
    worker.step_profile()

    def broken(self: rankscope.Profiler) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(rankscope.Profiler, "step", broken)
    with caplog.at_level(logging.WARNING, LOGGER):
        for _ in range(3):
            worker.train_step()
            worker.step_profile()
    summary = worker.stop_profile()
    assert summary["state"] == "failed: step_profile failed: RuntimeError: injected"
    assert len([r for r in caplog.records if r.name == LOGGER]) == 1
    assert rankscope.current() is None  # the profiler was stopped
    # What was written before the fault is kept: step 0 in full.
    assert {(r["step"], r["phase"]) for r in _records(tmp_path, 0)} >= {(0, "step"), (0, "forward")}


def test_unwritable_run_dir_is_reported_with_its_cause(read_only_dir: Path) -> None:
    worker = Worker()
    worker.reset(0)
    summary = worker.start_profile(_config(read_only_dir / "run"), 0, 1)
    worker.train_step()
    worker.step_profile()
    stopped = worker.stop_profile()
    for seen in (summary, stopped):
        assert seen["state"].startswith(
            f"failed: trace capture: cannot write to {read_only_dir / 'run'} ("
        ), seen
        capture, timer = seen["faults"]  # as Profiler.faults names them
        assert capture.startswith(f"trace capture: cannot write to {read_only_dir / 'run'} (")
        assert timer.startswith(f"phase timer: cannot write to {read_only_dir / 'run'} (")
        assert seen["timings_file"] is None and seen["trace_windows"] == []


# -- on a real local Ray -----------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    """One local Ray for the module: 2 CPUs, no dashboard, a small object store, logs in /tmp."""
    # Workers inherit this environment through the raylet: keep RANKSCOPE_* out of it.
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("RANKSCOPE_")}
    temp = tempfile.mkdtemp(prefix="rsray")  # short: Ray puts unix sockets under it
    try:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=80 * 1024 * 1024,
            _temp_dir=temp,
            log_to_driver=False,
            runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},
        )
        yield
    finally:
        ray.shutdown()
        os.environ.update(saved)
        shutil.rmtree(temp, ignore_errors=True)


def _actors(n: int, env: dict[str, str] | None = None) -> list[Any]:
    cls = ray.remote(num_cpus=0)(Worker)
    options = {"runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1", **env}}} if env else {}
    return [cls.options(**options).remote() for _ in range(n)]


def _group(actors: list[Any], rendezvous: Path) -> None:
    init = f"file://{rendezvous}"
    ray.get([a.join.remote(init, i, len(actors)) for i, a in enumerate(actors)], timeout=120)


def _kill(actors: list[Any]) -> None:
    for actor in actors:
        ray.kill(actor)


def _kill_and_wait(actor: Any) -> None:
    """ray.kill() returns before the actor is gone; wait until calls to it fail."""
    ray.kill(actor)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ray.get(actor.profile_summary.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.1)
    pytest.fail("the killed actor still answers")


@pytest.fixture(scope="module")
def pair(ray_session: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Any]]:
    """Two actors holding ranks 0 and 1 of one gloo group."""
    actors = _actors(2)
    try:
        _group(actors, tmp_path_factory.mktemp("rendezvous") / "store")
        yield actors
    finally:
        ray.get([a.leave.remote() for a in actors], timeout=60)
        _kill(actors)


def _train(actors: list[Any], steps: int, profiling: rs_ray.ActorProfiling | None = None) -> list:
    losses = []
    for _ in range(steps):
        losses.append(ray.get([a.train_step.remote() for a in actors], timeout=60))
        if profiling is not None:
            profiling.step()
    return losses


def _unprofiled_losses(actors: list[Any], steps: int) -> list:
    ray.get([a.reset.remote(0) for a in actors])
    return _train(actors, steps)


@pytest.mark.slow
def test_profile_actors_writes_every_rank_and_changes_no_loss(
    pair: list[Any], tmp_path: Path
) -> None:
    baseline = _unprofiled_losses(pair, 5)
    assert baseline[0][0] != baseline[0][1]  # the ranks see different data
    ray.get([a.reset.remote(0) for a in pair])
    with profile_actors(pair, _config(tmp_path)) as profiling:
        assert [s["state"] for s in profiling.summaries] == ["running", "running"]
        losses = _train(pair, 5, profiling)
    assert losses == baseline

    summaries = profiling.summaries
    assert [s["rank"] for s in summaries] == [0, 1]
    assert [s["world_size"] for s in summaries] == [2, 2]
    assert [s["state"] for s in summaries] == ["stopped", "stopped"], summaries
    assert [s["run_dir"] for s in summaries] == [str(tmp_path)] * 2
    assert summaries[0]["pid"] != summaries[1]["pid"] != os.getpid()
    assert [s["trace_windows"] for s in summaries] == [["step-000002-000002"], []]
    assert summaries[0]["last_summary"]["window"] == "step-000002-000002"
    assert summaries[0]["last_summary"]["rank"] == 0
    assert summaries[1]["last_summary"] is None
    assert all(s["faults"] == [] for s in summaries)
    assert json.loads(json.dumps(summaries)) == summaries

    for rank in (0, 1):
        records = _records(tmp_path, rank)
        assert {r["rank"] for r in records} == {rank}
        assert sorted({r["step"] for r in records}) == [0, 2, 4]
        for step in (0, 2, 4):
            assert {r["phase"] for r in records if r["step"] == step} == {*PHASES, "step"}
        assert {r["kind"] for r in records if r["phase"] == "grad_allreduce"} == {"comm"}
        meta = json.loads((tmp_path / "meta" / f"rank-{rank:05d}.json").read_text())
        assert (meta["rank"], meta["world_size"]) == (rank, 2)
    assert final_files(tmp_path / "traces") == [
        "step-000002-000002/rank-00000.pt.trace.json.gz",
        "step-000002-000002/rank-00000.summary.json",
    ]
    trace = read_trace(tmp_path / "traces" / "step-000002-000002" / "rank-00000.pt.trace.json.gz")
    assert event_names(trace) >= PHASES  # phases are ranges in the trace


@pytest.mark.slow
def test_actors_are_stopped_when_the_drivers_block_raises(pair: list[Any], tmp_path: Path) -> None:
    ray.get([a.reset.remote(0) for a in pair])
    config = _config(tmp_path, every_n_steps=1, flush_every_n_steps=100)
    with (
        pytest.raises(RuntimeError, match="driver failed"),
        profile_actors(pair, config) as profiling,
    ):
        _train(pair, 2, profiling)
        raise RuntimeError("driver failed")
    assert [s["state"] for s in profiling.summaries] == ["stopped", "stopped"]
    assert [ray.get(a.profile_summary.remote())["state"] for a in pair] == ["stopped"] * 2
    for rank in (0, 1):  # records reach the file only at stop (flush_every_n_steps=100)
        assert sorted({r["step"] for r in _records(tmp_path, rank)}) == [0, 1]


@pytest.mark.slow
def test_a_fault_on_one_worker_disables_only_that_worker(
    ray_session: None, tmp_path: Path, read_only_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Rank 1's node points rankscope at a directory it cannot write (its environment wins).
    actors = [*_actors(1), *_actors(1, {"RANKSCOPE_OUTPUT_DIR": str(read_only_dir)})]
    try:
        _group(actors, tmp_path / "store")
        baseline = _unprofiled_losses(actors, 4)
        ray.get([a.reset.remote(0) for a in actors])
        run_dir = tmp_path / "run"
        with (
            caplog.at_level(logging.WARNING, LOGGER),
            profile_actors(actors, _config(run_dir, every_n_steps=1)) as profiling,
        ):
            losses = _train(actors, 4, profiling)
        assert losses == baseline
        good, bad = profiling.summaries
        assert good["state"] == "stopped" and good["faults"] == []
        # The first part the fault turned off: capture (it holds one on every rank), then the timer.
        assert bad["state"].startswith("failed: trace capture: cannot write to")
        assert "cannot write to " + str(read_only_dir) in bad["state"]
        assert bad["run_dir"] == str(read_only_dir)
        logged = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        assert len([m for m in logged if "rank 1 (actor 1): profiling failed: " in m]) == 1, logged
        assert not [m for m in logged if "rank 0" in m], logged
        # Rank 0's files are complete; rank 1 wrote nothing anywhere.
        assert sorted({r["step"] for r in _records(run_dir, 0)}) == [0, 1, 2, 3]
        assert final_files(run_dir) == [
            "meta/rank-00000.json",
            "timings/rank-00000.jsonl",
            "traces/step-000002-000002/rank-00000.pt.trace.json.gz",
            "traces/step-000002-000002/rank-00000.summary.json",
        ]
        assert final_files(read_only_dir) == []
        ray.get([a.leave.remote() for a in actors], timeout=60)
    finally:
        _kill(actors)


@pytest.mark.slow
def test_config_is_checked_on_the_driver_and_a_bad_worker_environment_is_reported(
    ray_session: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (actor,) = _actors(1, {"RANKSCOPE_TIMER": "sometimes"})
    try:
        bad: list[tuple[dict[str, Any], str]] = [
            ({"config": {"timer": {"every_n_steps": 0}}}, "timer.every_n_steps"),
            ({"config": {"trace": {"ranks": "3"}}}, "trace.ranks"),
            ({"config": {}, "ranks": [1]}, "ranks"),
            ({"config": {}, "ranks": [0], "world_size": 0}, "world_size"),
            ({"config": "profile.yaml"}, "config"),
            ({"config": {}, "stop_timeout": 0}, "stop_timeout"),
        ]
        for kwargs, field in bad:
            with pytest.raises(rankscope.ConfigError) as info, profile_actors([actor], **kwargs):
                pytest.fail("the block ran")
            assert info.value.field == field
        with pytest.raises(rankscope.ConfigError, match="actors="):
            start_profiling([object()], {})
        # No actor was touched by any of that.
        assert ray.get(actor.profile_summary.remote())["state"] == "off"

        with caplog.at_level(logging.WARNING, LOGGER):
            (started,) = start_profiling([actor], _config(tmp_path), ranks=[3], world_size=4)
            ray.get(actor.reset.remote(0))
            assert isinstance(ray.get(actor.train_step.remote()), float)  # training goes on
            step_profiling([actor])
            (stopped,) = stop_profiling([actor], ranks=[3])
        assert started["rank"] == 3 and started["world_size"] == 4
        assert "ConfigError: RANKSCOPE_TIMER='sometimes'" in started["state"]
        assert stopped["state"] == started["state"]
        assert "RANKSCOPE_TIMER='sometimes'" in caplog.text
        assert "rank 3 (actor 0): profiling failed: " in caplog.text
        assert not (tmp_path / "timings").exists()
    finally:
        _kill([actor])


@pytest.mark.slow
def test_dead_and_silent_actors_are_reported_not_raised(
    ray_session: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    actors = _actors(3)
    try:
        summaries = start_profiling(actors, rankscope.ProfileConfig(output_dir=tmp_path))
        assert [s["state"] for s in summaries] == ["running"] * 3
        _kill_and_wait(actors[0])
        actors[1].sleep.remote(30)  # busy: its stop_profile() waits behind this
        with caplog.at_level(logging.WARNING, LOGGER):
            dead, silent, fine = stop_profiling(actors, timeout=2)
        assert dead["state"].startswith("failed: stop_profile() failed: ActorDiedError: ")
        assert dead["rank"] == 0 and dead["faults"] == [dead["state"].removeprefix("failed: ")]
        assert silent["state"] == "failed: no answer to stop_profile() within 2 s"
        assert fine["state"] == "stopped"
        assert "rank 0 (actor 0): profiling failed: " in caplog.text
        assert "rank 1 (actor 1): profiling failed: " in caplog.text
        assert sorted(dead) == sorted(fine)  # the same keys either way
    finally:
        _kill(actors)


def test_all_is_sorted() -> None:
    assert rs_ray.__all__ == sorted(rs_ray.__all__)


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


@pytest.mark.slow
def test_example_runs(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "RAY_"))}
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "ray_actors.py"), str(run_dir), "--steps", "4"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=tmp_path,
        env={**env, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        records = _records(run_dir, rank)
        assert sorted({r["step"] for r in records}) == [0, 1, 2, 3]
        assert {"rollout", "update_actor", "grad_allreduce", "step"} <= {
            r["phase"] for r in records
        }
    assert final_files(run_dir / "traces") == [
        "phase-update_actor-000002/rank-00000.pt.trace.json.gz",
        "phase-update_actor-000002/rank-00000.summary.json",
    ]
    assert f"rankscope report {run_dir}" in done.stderr
