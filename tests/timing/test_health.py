"""GPU health read every few seconds (timing/_health.py), from a stand-in NVML that the
tests drive: what a line holds, when it is read, that the training thread makes no NVML
call, and NVML's own errors."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from rankscope import ConfigError, TimerConfig
from rankscope.config._ranks import RankInfo
from rankscope.rundir._health import THROTTLE_REASONS
from rankscope.testing._clock import CountingClock
from rankscope.testing._nvml import StandInGpu, StandInNvml
from rankscope.timing import PhaseTimer
from rankscope.timing._health import GpuSource
from rankscope.timing._timer import AUTO

HEALTH_KEYS = {
    "v",
    "rank",
    "step",
    "time_ns",
    "sm_mhz",
    "mem_mhz",
    "throttle",
    "temp_c",
    "power_w",
    "power_limit_w",
    "ecc_corrected",
    "ecc_uncorrected",
    "load1",
    "mem_available_mb",
}


def make_timer(tmp_path: Path, gpu: Any, **timer: Any) -> PhaseTimer:
    config = TimerConfig(enable=True, **timer)
    info = RankInfo(rank=1, local_rank=1, world_size=2, local_world_size=2, host="node-a")
    return PhaseTimer(config, str(tmp_path), info, clock=CountingClock(), gpu=gpu)


def run_steps(timer: PhaseTimer, steps: int, wait: bool = True) -> None:
    timer.start()
    for _ in range(steps):
        with_phase(timer)
        if wait:
            assert timer.wait_written()
        timer.step()
    timer.stop()


def with_phase(timer: PhaseTimer) -> None:
    span = timer.enter("forward", "compute", None, False)
    if span is not None:
        timer.exit(span, False)


def lines(tmp_path: Path, rank: int = 1) -> list[dict[str, Any]]:
    path = tmp_path / "health" / f"rank-{rank:05d}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def samples(tmp_path: Path) -> list[dict[str, Any]]:
    return [line for line in lines(tmp_path) if "attempt" not in line]


def test_a_throttling_gpu_is_written_with_the_step_it_was_read_at(tmp_path: Path) -> None:
    nvml = StandInNvml([StandInGpu(), StandInGpu.throttling(ecc_corrected=3)])
    timer = make_timer(tmp_path, GpuSource(nvml, 1), every_n_steps=2)
    run_steps(timer, 6)
    said = samples(tmp_path)
    # Read soon after the first sampled step, and at stop(): step 6 too, which stop()
    # ended before its timings.
    steps = [s["step"] for s in said]
    assert steps[-1] == 6 and steps == sorted(set(steps)) and set(steps) <= {0, 2, 4, 6}
    first = said[0]
    assert set(first) == HEALTH_KEYS
    assert first["rank"] == 1
    assert first["sm_mhz"] == 1410
    assert first["mem_mhz"] == 2619
    assert first["throttle"] == ["sw_thermal", "hw_thermal"]
    assert first["temp_c"] == 91
    assert first["power_w"] == 420.0
    assert first["power_limit_w"] == 700.0
    assert first["ecc_corrected"] == 3
    assert first["ecc_uncorrected"] == 0
    assert isinstance(first["load1"], float)
    assert isinstance(first["mem_available_mb"], float) and first["mem_available_mb"] > 0
    assert not nvml.initialised, "the sampler shuts NVML down when it ends"


def test_every_write_opens_with_the_timers_attempt_line(tmp_path: Path) -> None:
    nvml = StandInNvml()
    timer = make_timer(tmp_path, GpuSource(nvml, 0), every_n_steps=1)
    run_steps(timer, 3)
    written = lines(tmp_path)
    opening = [line for line in written[0::2]]
    assert all("attempt" in line and "step" not in line for line in opening)
    assert all("attempt" not in line for line in written[1::2])
    timings = [
        json.loads(line)
        for line in (tmp_path / "timings" / "rank-00001.jsonl").read_text().splitlines()
    ]
    token = next(line["attempt"] for line in timings if "attempt" in line)
    assert {line["attempt"] for line in opening} == {token}
    assert {line["host"] for line in opening} == {"node-a"}


def test_the_training_thread_makes_no_nvml_call(tmp_path: Path) -> None:
    nvml = StandInNvml()
    timer = make_timer(tmp_path, GpuSource(nvml, "GPU-00000000-0000-0000-0000-000000000000"))
    run_steps(timer, 25)
    assert nvml.on(threading.get_ident()) == {}
    assert nvml.calls, "the sampler's thread read it"
    steps = [s["step"] for s in samples(tmp_path)]
    assert steps[-1] == 20 and steps == sorted(set(steps)) and set(steps) <= {0, 10, 20}


def test_health_is_read_by_wall_time_not_at_every_sampled_step(tmp_path: Path) -> None:
    """Every step sampled, 60 steps: once a minute reads the first step and the last
    only; once in 20 ms, over steps of 40 ms, reads most of them."""
    run_steps(make_timer(tmp_path / "slow", GpuSource(StandInNvml(), 0), health_every_s=60), 60)
    steps = [s["step"] for s in samples(tmp_path / "slow")]
    assert 1 <= len(steps) <= 2 and steps[-1] == 60
    timer = make_timer(
        tmp_path / "fast", GpuSource(StandInNvml(), 0), every_n_steps=1, health_every_s=0.02
    )
    timer.start()
    for _ in range(12):
        with_phase(timer)
        time.sleep(0.04)
        timer.step()
    timer.stop()
    steps = [s["step"] for s in samples(tmp_path / "fast")]
    assert steps == sorted(set(steps)) and steps[-1] == 12
    assert len(steps) >= 4, steps  # 12 steps of 40 ms, read every 20 ms


def test_a_job_that_stops_stepping_stops_reading(tmp_path: Path) -> None:
    """No new line while no sampled step begins, however long the wait: a stalled job's
    file holds its last step once."""
    timer = make_timer(tmp_path, GpuSource(StandInNvml(), 0), every_n_steps=1, health_every_s=0.01)
    timer.start()
    with_phase(timer)
    timer.step()
    time.sleep(0.3)
    timer.stop()
    assert [s["step"] for s in samples(tmp_path)] in ([0, 1], [1])


def test_at_most_one_line_per_sampled_step(tmp_path: Path) -> None:
    """Wakes that come while a sample is read fold into the next one."""
    timer = make_timer(tmp_path, GpuSource(StandInNvml(), 0), every_n_steps=1)
    run_steps(timer, 200, wait=False)
    steps = [s["step"] for s in samples(tmp_path)]
    assert steps == sorted(set(steps))
    assert 1 <= len(steps) <= 200


def test_nvml_that_cannot_start_is_said_once_and_nothing_is_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nvml = StandInNvml(init_error=StandInNvml.NVML_ERROR_DRIVER_NOT_LOADED)
    timer = make_timer(tmp_path, GpuSource(nvml, 0), every_n_steps=1)
    with caplog.at_level(logging.INFO, logger="rankscope"):
        run_steps(timer, 5)
    said = [r.getMessage() for r in caplog.records if "GPU health" in r.getMessage()]
    assert said == ["rankscope: no GPU health on rank 1: NVML cannot start (NVML error 9)"]
    assert not (tmp_path / "health").exists()
    assert (tmp_path / "timings" / "rank-00001.jsonl").exists(), "the timer goes on"


def test_a_reading_nvml_refuses_is_null_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gpu = StandInGpu(failing={"nvmlDeviceGetTotalEccErrors": StandInNvml.NVML_ERROR_NOT_SUPPORTED})
    timer = make_timer(tmp_path, GpuSource(StandInNvml([gpu]), 0), every_n_steps=1)
    with caplog.at_level(logging.INFO, logger="rankscope"):
        run_steps(timer, 3)
    said = samples(tmp_path)
    assert said and {(s["ecc_corrected"], s["ecc_uncorrected"]) for s in said} == {(None, None)}
    assert {s["sm_mhz"] for s in said} == {1980}
    refused = [r.getMessage() for r in caplog.records if "NVML does not give" in r.getMessage()]
    assert refused == [
        "rankscope: NVML does not give ecc_corrected on rank 1 (NVML error 3): written as null",
        "rankscope: NVML does not give ecc_uncorrected on rank 1 (NVML error 3): written as null",
    ]


def test_a_lost_device_ends_the_sampling_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No handle for the device (it is not there): said once; the timer goes on."""
    timer = make_timer(tmp_path, GpuSource(StandInNvml(), 5), every_n_steps=1)
    with caplog.at_level(logging.INFO, logger="rankscope"):
        run_steps(timer, 3)
    said = [r.getMessage() for r in caplog.records if "GPU health" in r.getMessage()]
    assert said == [
        "rankscope: GPU health off for the rest of the run on rank 1: NVMLError: NVML error 6"
    ]
    assert timer.fault_reason is None


def test_without_a_gpu_it_is_said_once_and_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CPU host's answer")
    timer = make_timer(tmp_path, AUTO)
    with caplog.at_level(logging.INFO, logger="rankscope"):
        run_steps(timer, 3)
        timer.start()  # a second start says nothing more
        timer.stop()
    said = [r.getMessage() for r in caplog.records if "GPU health" in r.getMessage()]
    assert said == ["rankscope: no GPU health on rank 1: no CUDA device"]
    assert not (tmp_path / "health").exists()


def test_health_off_reads_nothing(tmp_path: Path) -> None:
    nvml = StandInNvml()
    run_steps(make_timer(tmp_path, GpuSource(nvml, 0), health=False), 3)
    assert not nvml.calls
    assert not (tmp_path / "health").exists()


def test_health_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match=r"timer\.health"):
        TimerConfig(enable=True, health="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("every", [0, -1, float("nan"), float("inf"), "5", True])
def test_health_every_s_must_be_a_number_of_seconds(every: Any) -> None:
    with pytest.raises(ConfigError, match=r"timer\.health_every_s"):
        TimerConfig(enable=True, health_every_s=every)


def test_the_gpu_is_found_by_its_uuid_else_by_cudas_index(tmp_path: Path) -> None:
    """NVML numbers every GPU of the host: the UUID finds this rank's among them; where
    NVML knows no such UUID, CUDA's index is read."""
    gpus = [StandInGpu(), StandInGpu.throttling(uuid="GPU-hot"), StandInGpu(sm_mhz=1700)]
    run_steps(make_timer(tmp_path / "a", GpuSource(StandInNvml(gpus), "GPU-hot", 2)), 1)
    assert [s["sm_mhz"] for s in samples(tmp_path / "a")] == [1410]
    run_steps(make_timer(tmp_path / "b", GpuSource(StandInNvml(gpus), "GPU-gone", 2)), 1)
    assert [s["sm_mhz"] for s in samples(tmp_path / "b")] == [1700]


def test_the_reason_bits_are_nvmls_own() -> None:
    """The words a line writes stand for the bits the real pynvml names (no GPU needed)."""
    pynvml = pytest.importorskip("pynvml")
    names = (
        "GpuIdle",
        "ApplicationsClocksSetting",
        "SwPowerCap",
        "HwSlowdown",
        "SyncBoost",
        "SwThermalSlowdown",
        "HwThermalSlowdown",
        "HwPowerBrakeSlowdown",
        "DisplayClockSetting",
    )
    bits = [getattr(pynvml, f"nvmlClocksThrottleReason{name}") for name in names]
    assert bits == [bit for bit, _ in THROTTLE_REASONS]
    # The stand-in's call surface is pynvml's: every name it offers, the real one has too.
    offered = [n for n in vars(StandInNvml) if n.lower().startswith("nvml")]
    assert len(offered) > 20
    assert [n for n in offered if not hasattr(pynvml, n)] == []
    values = {n: v for n, v in vars(StandInNvml).items() if isinstance(v, int) and n in offered}
    assert {n: getattr(pynvml, n) for n in values} == values


def test_a_stuck_nvml_call_holds_stop_back_a_few_seconds_at_most(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stall = threading.Event()
    timer = make_timer(tmp_path, GpuSource(StandInNvml(stall=stall), 0), every_n_steps=1)
    try:
        with caplog.at_level(logging.INFO, logger="rankscope"):
            t0 = time.monotonic()
            run_steps(timer, 2, wait=False)
            took = time.monotonic() - t0
        assert took < 20
        said = [r.getMessage() for r in caplog.records if "sampler did not end" in r.getMessage()]
        assert said == [
            "rankscope: the GPU health sampler did not end within 5 s (NVML stuck?); left behind"
        ]
        assert timer.fault_reason is None
        assert (tmp_path / "timings" / "rank-00001.jsonl").read_text().count('"phase"') == 4
    finally:
        stall.set()
