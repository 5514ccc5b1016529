from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch

import rankscope
from rankscope import ConfigError, Profiler, Schedule
from rankscope.capture import windows

from .._helpers import (
    event_names,
    final_files,
    profiler_steps,
    read_trace,
    temp_files,
    tiny_model,
    tiny_step,
    trace_config,
)


def _run(prof: Profiler, steps: int) -> None:
    model, opt = tiny_model()
    with prof:
        for _ in range(steps):
            tiny_step(model, opt, prof)
            prof.step()


def test_windows_land_with_exactly_their_steps(tmp_path: Path) -> None:
    sched = Schedule(skip_first=1, wait=1, warmup=1, active=2, repeat=2)
    prof = Profiler(trace_config(tmp_path, schedule=sched), rank=0, world_size=1)
    _run(prof, steps=12)
    expected = windows(sched, stop_step=12)
    assert expected == [(3, 4), (7, 8)]
    names = [f"step-{a:06d}-{b:06d}" for a, b in expected]
    assert final_files(tmp_path) == sorted(
        ["meta/rank-00000.json"]
        + [f"traces/{n}/rank-00000.pt.trace.json.gz" for n in names]
        + [f"traces/{n}/rank-00000.summary.json" for n in names]
    )
    assert temp_files(tmp_path) == []
    for (first, last), name in zip(expected, names, strict=True):
        trace = read_trace(tmp_path / "traces" / name / "rank-00000.pt.trace.json.gz")
        assert profiler_steps(trace) == list(range(first, last + 1))
        assert trace["distributedInfo"]["rank"] == 0
        assert {"forward", "backward", "optimizer"} <= event_names(trace)
    latest = json.loads((tmp_path / "traces" / names[-1] / "rank-00000.summary.json").read_text())
    assert prof.last_summary() == latest
    assert latest["window"] == names[-1]
    assert latest["kind"] == "cpu_ops"
    assert latest["items"], "a CPU trace has top-level ops"


def test_uncompressed_traces(tmp_path: Path) -> None:
    prof = Profiler(trace_config(tmp_path, gzip=False), rank=0, world_size=1)
    _run(prof, steps=3)
    trace = tmp_path / "traces" / "step-000001-000001" / "rank-00000.pt.trace.json"
    assert profiler_steps(read_trace(trace)) == [1]


def test_meta_file_describes_the_rank(tmp_path: Path) -> None:
    prof = Profiler(trace_config(tmp_path, ranks="all"), rank=3, world_size=4)
    _run(prof, steps=2)
    meta = json.loads((tmp_path / "meta" / "rank-00003.json").read_text())
    assert (meta["rank"], meta["world_size"]) == (3, 4)
    assert meta["versions"]["torch"] == torch.__version__
    assert meta["config"] == prof.config.to_dict()
    assert meta["clock"]["time_ns"] > 0
    assert meta["cpus"] == len(os.sched_getaffinity(0))  # the CPUs the rank may run on
    trace = tmp_path / "traces" / "step-000001-000001" / "rank-00003.pt.trace.json.gz"
    assert read_trace(trace)["distributedInfo"]["rank"] == 3


def test_phase_target_records_only_inside_the_phase(tmp_path: Path) -> None:
    sched = Schedule(wait=1, warmup=0, active=2, repeat=1)
    prof = Profiler(
        trace_config(tmp_path, target="phase:train_actor", schedule=sched), rank=0, world_size=1
    )
    x = torch.randn(16)
    with prof:
        for _ in range(5):
            torch.cumsum(x, 0)  # outside the phase: never recorded
            with prof.phase("train_actor"):
                torch.cummax(x, 0)
            prof.step()
    dirs = sorted(p.name for p in (tmp_path / "traces").iterdir())
    assert dirs == ["phase-train_actor-000001", "phase-train_actor-000002"]
    for d in dirs:
        trace = read_trace(tmp_path / "traces" / d / "rank-00000.pt.trace.json.gz")
        names = event_names(trace)
        assert "train_actor" in names
        assert "aten::cummax" in names
        assert "aten::cumsum" not in names
        assert profiler_steps(trace) == []


def test_window_open_when_the_loop_raises_is_saved(tmp_path: Path) -> None:
    sched = Schedule(warmup=1, active=4)
    prof = Profiler(trace_config(tmp_path, schedule=sched), rank=0, world_size=1)
    model, opt = tiny_model()
    boom = RuntimeError("user bug")
    with pytest.raises(RuntimeError) as info, prof:
        for step in range(10):
            tiny_step(model, opt, prof)
            if step == 2:
                raise boom
            prof.step()
    assert info.value is boom
    trace = tmp_path / "traces" / "step-000001-000002" / "rank-00000.pt.trace.json.gz"
    assert profiler_steps(read_trace(trace)) == [1, 2]


def test_exception_inside_a_phase_passes_through_and_the_phase_window_is_saved(
    tmp_path: Path,
) -> None:
    sched = Schedule(warmup=0, active=1)
    prof = Profiler(
        trace_config(tmp_path, target="phase:update", schedule=sched), rank=0, world_size=1
    )
    with prof, pytest.raises(KeyError), prof.phase("update"):
        torch.ones(3).sum()
        raise KeyError("x")
    assert (tmp_path / "traces" / "phase-update-000000" / "rank-00000.pt.trace.json.gz").is_file()


def test_lifecycle_is_forgiving(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    prof = Profiler(trace_config(tmp_path), rank=0, world_size=1)
    prof.stop()  # never started
    prof.step()  # before start: not counted
    prof.step()
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        prof.start()
        prof.start()
    assert sum("already started" in r.getMessage() for r in caplog.records) == 1
    prof.step()
    prof.step()
    prof.stop()
    prof.stop()
    prof.step()  # after stop
    # Steps before start() did not count: the default window is still step 1.
    assert (tmp_path / "traces" / "step-000001-000001").is_dir()
    assert len(list((tmp_path / "traces").iterdir())) == 1


class _CountingProfile(torch.profiler.profile):
    created = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _CountingProfile.created += 1  # counted on this class: rankscope extends it
        super().__init__(*args, **kwargs)


def test_unselected_rank_creates_no_profiler_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.profiler, "profile", _CountingProfile)
    _CountingProfile.created = 0
    # Triggers may name any rank, so a rank outside trace.ranks listens: it holds a capture
    # but no profiler, and writes only its meta file.
    prof = Profiler(trace_config(tmp_path, ranks="0"), rank=1, world_size=2)
    _run(prof, steps=4)
    assert _CountingProfile.created == 0
    assert prof._capture is not None
    assert final_files(tmp_path) == ["meta/rank-00001.json"]
    assert prof.last_summary() is None
    # Nothing that could ask it for a window: no capture at all, phases do nothing.
    quiet = trace_config(tmp_path / "quiet", ranks="0", trigger_check_every_n_steps=0)
    prof = Profiler(quiet, rank=1, world_size=2)
    _run(prof, steps=4)
    assert prof._capture is None
    assert type(prof.phase("forward")).__name__ == "_NoPhase"  # does nothing
    assert not (tmp_path / "quiet").exists()
    selected = Profiler(trace_config(tmp_path, ranks="0"), rank=0, world_size=2)
    _run(selected, steps=4)
    assert _CountingProfile.created == 1


def test_disabled_profiler_does_nothing(tmp_path: Path) -> None:
    prof = Profiler(rankscope.ProfileConfig(output_dir=tmp_path / "run"), rank=0, world_size=1)
    _run(prof, steps=3)
    assert not (tmp_path / "run").exists()


def test_profiler_is_released_after_the_last_window(tmp_path: Path) -> None:
    prof = Profiler(trace_config(tmp_path), rank=0, world_size=1)
    with prof:
        prof.step()
        prof.step()  # step 1 (the window) saved; step 2 is past the last window
        capture = prof._capture
        assert capture._prof is None
        assert not capture.recording


def test_ranks_beyond_the_world_size_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"trace\.ranks"):
        Profiler(trace_config(tmp_path, ranks="0,4"), rank=0, world_size=2)


def test_env_ranks_beyond_the_world_size_name_the_variable(tmp_path: Path) -> None:
    config = rankscope.ProfileConfig(output_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"^RANKSCOPE_TRACE_RANKS='0,4'"):
        Profiler(config, rank=0, world_size=2, environ={"RANKSCOPE_TRACE_RANKS": "0,4"})


def test_a_mapping_is_read_as_a_config(tmp_path: Path) -> None:
    prof = Profiler({"output_dir": str(tmp_path), "trace": {"ranks": "1"}}, rank=0, world_size=2)
    assert prof.config.output_dir == str(tmp_path)
    assert prof.config.trace.rank_set.spec() == "1"


@pytest.mark.parametrize("config", [3, b"runs/x", ["trace"]])
def test_anything_else_as_config_is_named(config: Any) -> None:
    with pytest.raises(ConfigError, match=r"^config="):
        Profiler(config, rank=0, world_size=1)


def test_a_path_as_config_is_read_as_yaml(tmp_path: Path) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text(f"output_dir: {tmp_path / 'run'}\ntimer: {{enable: true, every_n_steps: 3}}\n")
    for config in (path, str(path)):
        prof = Profiler(config, rank=0, world_size=1)
        assert prof.config.timer.every_n_steps == 3
        assert prof.config.output_dir == str(tmp_path / "run")
    with pytest.raises(ConfigError, match=r"^path='runs/x.yaml'.*a readable YAML file"):
        Profiler("runs/x.yaml", rank=0, world_size=1)


def test_environment_turns_capture_on(tmp_path: Path) -> None:
    config = rankscope.ProfileConfig(output_dir=tmp_path)
    prof = Profiler(
        config,
        rank=1,
        world_size=2,
        environ={"RANKSCOPE_TRACE": "yes", "RANKSCOPE_TRACE_RANKS": "1"},
    )
    assert prof.config.trace.enable
    _run(prof, steps=3)
    assert (tmp_path / "traces" / "step-000001-000001" / "rank-00001.pt.trace.json.gz").is_file()


def test_effective_config_is_logged_once_on_rank_zero(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="rankscope"):
        _run(Profiler(trace_config(tmp_path), rank=0, world_size=2), steps=1)
        _run(Profiler(trace_config(tmp_path, ranks="1"), rank=1, world_size=2), steps=1)
    logged = [r for r in caplog.records if "effective config" in r.getMessage()]
    assert len(logged) == 1
    assert str(tmp_path) in logged[0].getMessage()


def test_cuda_requested_without_cuda_warns_once_and_captures_cpu(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        prof = Profiler(trace_config(tmp_path, activities=["cpu", "cuda"]), rank=0, world_size=1)
        _run(prof, steps=3)
    assert sum("CUDA is not available" in r.getMessage() for r in caplog.records) == 1
    assert (tmp_path / "traces" / "step-000001-000001" / "rank-00000.pt.trace.json.gz").is_file()


def test_decorator_forms_open_ranges_in_the_window(tmp_path: Path) -> None:
    prof = Profiler(
        trace_config(tmp_path, schedule=Schedule(warmup=0, active=1)), rank=0, world_size=1
    )

    @prof.phase("plain")
    def plain(x: int) -> int:
        return x + 1

    class Model:
        @prof.phase("method")
        def method(self, x: int) -> int:
            return x * 2

        @prof.phase("static")
        @staticmethod
        def static(x: int) -> int:
            return x - 1

        @prof.phase("klass")
        @classmethod
        def klass(cls, x: int) -> str:
            return f"{cls.__name__}{x}"

    @prof.phase("coroutine")
    async def coroutine(x: int) -> int:
        await asyncio.sleep(0)
        return x

    assert plain.__name__ == "plain"
    with prof:
        m = Model()
        assert plain(1) == 2
        assert m.method(2) == 4
        assert Model.static(3) == 2
        assert Model.klass(4) == "Model4"
        assert asyncio.run(coroutine(5)) == 5
        prof.step()
    trace = read_trace(tmp_path / "traces" / "step-000000-000000" / "rank-00000.pt.trace.json.gz")
    assert {"plain", "method", "static", "klass", "coroutine"} <= event_names(trace)


def test_phase_outside_a_window_opens_no_range(tmp_path: Path) -> None:
    sched = Schedule(wait=2, warmup=0, active=1)
    prof = Profiler(trace_config(tmp_path, schedule=sched), rank=0, world_size=1)
    with prof:
        with prof.phase("early"):
            pass
        prof.step()
        prof.step()
        with prof.phase("inside"):
            pass
        prof.step()
    trace = read_trace(tmp_path / "traces" / "step-000002-000002" / "rank-00000.pt.trace.json.gz")
    assert "inside" in event_names(trace)
    assert "early" not in event_names(trace)


def test_stop_inside_a_target_phase_saves_its_window(tmp_path: Path) -> None:
    sched = Schedule(warmup=0, active=1)
    prof = Profiler(
        trace_config(tmp_path, target="phase:update", schedule=sched), rank=0, world_size=1
    )
    prof.start()
    with prof.phase("update"):
        torch.ones(3).sum()
        prof.stop()
    trace = read_trace(tmp_path / "traces" / "phase-update-000000" / "rank-00000.pt.trace.json.gz")
    assert "aten::sum" in event_names(trace)
    assert not torch.autograd._profiler_enabled()


def test_step_inside_a_target_phase_does_not_drive_its_window(tmp_path: Path) -> None:
    sched = Schedule(warmup=0, active=1, repeat=0)
    prof = Profiler(
        trace_config(tmp_path, target="phase:rollout", schedule=sched), rank=0, world_size=1
    )
    with prof:
        for _ in range(2):
            with prof.phase("rollout"):
                torch.ones(2).sum()
                prof.step()  # a loop that steps inside the phase
    for n in range(2):
        trace = read_trace(
            tmp_path / "traces" / f"phase-rollout-{n:06d}" / "rank-00000.pt.trace.json.gz"
        )
        assert profiler_steps(trace) == []
        assert "aten::sum" in event_names(trace)


def test_a_run_that_never_reaches_its_window_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    prof = Profiler(trace_config(tmp_path, schedule=Schedule(wait=10)), rank=0, world_size=1)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        _run(prof, steps=3)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1
    assert "captured nothing" in warned[0]
    assert "stopped during step 3" in warned[0]
    assert "steps 11-11" in warned[0]


def test_a_phase_target_never_entered_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    prof = Profiler(trace_config(tmp_path, target="phase:train_actor"), rank=0, world_size=1)
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        _run(prof, steps=3)  # phases forward/backward/optimizer only
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1
    assert "'train_actor' was entered 0 time(s)" in warned[0]


def test_a_run_that_captured_says_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        _run(Profiler(trace_config(tmp_path), rank=0, world_size=1), steps=3)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_module_can_be_converted_after_a_window_that_recorded_shapes(tmp_path: Path) -> None:
    """torch.profiler holds weak references to the tensors ops received (record_shapes);
    swap_tensors (FSDP2, module.to() under swap-on-conversion) fails while they live.
    rankscope lets them go when the window is exported, not at the next GC pass."""
    config = trace_config(tmp_path, record_shapes=True, schedule=rankscope.Schedule(active=1))
    model, opt = tiny_model()
    torch.__future__.set_swap_module_params_on_conversion(True)
    gc.disable()  # no collection pass frees the profiler's results by chance
    try:
        with Profiler(config, rank=0, world_size=1) as prof:
            for _ in range(3):  # step 1 is the window
                tiny_step(model, opt, prof)
                prof.step()
            model.to(torch.float64)  # swaps every parameter
    finally:
        gc.enable()
        torch.__future__.set_swap_module_params_on_conversion(False)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    assert final_files(tmp_path)[-1] == "traces/step-000001-000001/rank-00000.summary.json"


def test_a_loop_that_raises_before_the_first_window_is_not_told_to_call_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = trace_config(tmp_path, schedule=rankscope.Schedule(wait=5))
    prof = Profiler(config, rank=0, world_size=1)
    with (
        caplog.at_level(logging.WARNING, logger="rankscope"),
        pytest.raises(ZeroDivisionError),
        prof,
    ):
        prof.step()
        _ = 1 / 0
    (warned,) = [r.getMessage() for r in caplog.records]
    assert "captured nothing: the training loop raised during step 1" in warned
    assert "is step() called" not in warned


def test_a_callers_window_records_the_steps_between_its_open_and_close(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # trace.target "caller": no schedule; a framework that picks its own profiled steps
    # (verl's start_profile / stop_profile) opens and closes the window.
    prof = Profiler(trace_config(tmp_path, target="caller"), rank=0, world_size=1)
    model, opt = tiny_model()
    window = prof.trace_window("verl")
    said = []
    with prof:
        for step in range(7):
            if step == 3:
                said.append(window.__enter__())
                said.append(prof.trace_window("again").__enter__())  # one at a time
            tiny_step(model, opt, prof)
            if step == 4:
                window.__exit__(None, None, None)
                window.__exit__(None, None, None)  # twice: nothing more
            prof.step()
    assert said[0] is None
    assert said[1] == "a window is open"
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == ["step-000003-000004-verl"]
    trace = read_trace(
        tmp_path / "traces" / "step-000003-000004-verl" / "rank-00000.pt.trace.json.gz"
    )
    assert {"forward", "backward", "optimizer"} <= event_names(trace)


@pytest.mark.parametrize(
    ("target", "rank", "why"),
    [("step", 0, 'not "caller"'), ("caller", 1, "not in trace.ranks")],
)
def test_a_callers_window_where_none_may_open_says_why(
    tmp_path: Path, target: str, rank: int, why: str
) -> None:
    config = trace_config(tmp_path, target=target, ranks="0", trigger_check_every_n_steps=1)
    prof = Profiler(config, rank=rank, world_size=2)
    with prof, prof.trace_window("verl") as said:
        prof.step()
    assert said is not None and why in said
    assert not any((tmp_path / "traces").glob("*-verl"))
