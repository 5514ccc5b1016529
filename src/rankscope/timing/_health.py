"""The GPU's and the host's health, read off the training thread every few seconds.

On a CUDA rank, a HealthSampler reads NVML (the `nvidia-ml-py` package, imported as
`pynvml`) for its rank's GPU: SM and memory clocks, clock-throttle reasons, temperature,
power draw and limit, ECC error counts; and /proc for the host's load average and
available memory. It appends one line per reading to RUN_DIR/health/rank-NNNNN.jsonl,
each write opening with the attempt line, as the timer's do (timing/_timer.py).

The sampler has its own daemon thread. It reads at the first sampled step, then once
every `TimerConfig.health_every_s` seconds while sampled steps go on, and once more at
stop(); each reading carries the last sampled step the timer began, so the analysis
takes a rank's clock over the steps it found the rank slow (since its onset) with no
mapping from time to step, and a job that stops stepping stops reading. Clocks,
temperature and ECC counts move over seconds, not steps: read at every sampled step,
the sampler's Python work (six NVML calls, /proc, a JSON line) held the interpreter
lock the training loop needed for most of the profiled Python time on a GPU host. The
training thread's part is one store per sampled step (and one Event.set() at the
first); the sampler keeps its NVML handle, its file and the /proc files open.
"""

from __future__ import annotations

import importlib
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._log import get_logger
from ..rundir._attempt import current_attempt
from ..rundir._files import open_append, write_all
from ..rundir._health import HEALTH_VERSION, THROTTLE_REASONS
from ..rundir._layout import health_path
from ._record import format_attempt

__all__ = ["GpuSource", "HealthSampler", "gpu_source"]

logger = get_logger(__name__)

_PROC = Path("/proc")


@dataclass(frozen=True)
class GpuSource:
    """Which NVML to read, and which of its devices is this rank's."""

    nvml: Any
    """The pynvml module, or a stand-in with its call surface (testing/_nvml.py)."""
    device: int | str
    """The device's NVML index, or its UUID ("GPU-..."): NVML numbers every GPU of the
    host, CUDA only the visible ones, so the UUID is what ties a rank's GPU to NVML's."""
    index: int = 0
    """Where NVML finds no device of that UUID (an older driver): the index to read
    instead, CUDA's own (right where CUDA_VISIBLE_DEVICES does not reorder the GPUs)."""


def gpu_source(torch: Any) -> GpuSource | str:
    """This rank's GPU as NVML sees it, or why there is none to read."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        return "nvidia-ml-py is not installed (pip install 'rankscope[torch]')"
    index = torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return GpuSource(nvml, index if uuid is None else f"GPU-{uuid}", index)


class HealthSampler:
    """Reads one GPU's and its host's health on its own thread, at the steps it is woken for.

    Nothing raises out of it: NVML that cannot start is said once and nothing is written;
    a reading NVML refuses (a field this GPU does not support) is null, its first refusal
    said once; any other fault is said once and ends the sampling.
    """

    def __init__(
        self,
        source: GpuSource,
        run_dir: str,
        rank: int,
        host: str | None,
        every_s: float = 5.0,
    ) -> None:
        self._source = source
        self._every_s = every_s
        self._run_dir = run_dir
        self._rank = rank
        self.path = health_path(run_dir, rank)
        self._opening = format_attempt(rank, current_attempt().to_dict(), host).encode()
        self._wake = threading.Event()
        self._step = -1  # the last sampled step begun; -1: none yet
        self._done = -1  # the step of the last line written
        self._stopping = False
        self._refused: set[str] = set()
        self._thread: threading.Thread | None = None
        self.written = 0
        """Lines written so far."""

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"rankscope-health-{self._rank}", daemon=True
        )
        self._thread.start()

    def at(self, step: int) -> None:
        """A sampled step begins (the training thread): one store; at the first, a wake."""
        first = self._step < 0
        self._step = step
        if first:
            self._wake.set()

    def close(self, timeout: float) -> bool:
        """End the thread once the last step begun is read; False if it outlived
        `timeout` (NVML stuck: the daemon thread is left behind)."""
        self._stopping = True
        self._wake.set()
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def abandon(self) -> None:
        """End without waiting (a fault): the thread leaves once it has read what it was woken for."""
        self._stopping = True
        self._wake.set()

    # -- the sampler's thread ----------------------------------------------------------

    def _run(self) -> None:
        nvml = self._source.nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:
            logger.info(
                "rankscope: no GPU health on rank %d: NVML cannot start (%s)", self._rank, exc
            )
            return
        try:
            handle = self._handle(nvml)
            with open_append(self._run_dir, self.path) as out, _Proc() as proc:
                while True:
                    self._wake.wait(self._every_s)
                    self._wake.clear()
                    # Whether to stop is read before the step: a stop() that comes while
                    # this reading is written sets the wake again, and the loop reads the
                    # last step once more (read after it, a stop() during a late first
                    # reading ended the thread without the last step: seen once in CI).
                    stopping = self._stopping
                    step = self._step
                    if step >= 0 and step != self._done:  # at stop() too, the last step begun
                        # One append per sample, opening with its attempt line (as the
                        # timer's writes do).
                        write_all(out, self._opening + self._sample(nvml, handle, step, proc))
                        self.written += 1
                        self._done = step
                    if stopping:
                        return
        except Exception as exc:
            logger.warning(
                "rankscope: GPU health off for the rest of the run on rank %d: %s: %s",
                self._rank,
                type(exc).__name__,
                exc,
            )
        finally:
            try:
                nvml.nvmlShutdown()
            except Exception:
                logger.debug("rankscope: nvmlShutdown failed", exc_info=True)

    def _handle(self, nvml: Any) -> Any:
        device = self._source.device
        if isinstance(device, str):
            try:
                return nvml.nvmlDeviceGetHandleByUUID(device)
            except nvml.NVMLError:
                device = self._source.index
        return nvml.nvmlDeviceGetHandleByIndex(device)

    def _sample(self, nvml: Any, gpu: Any, step: int, proc: _Proc) -> bytes:
        def read(name: str, call: Any, *args: Any) -> Any:
            try:
                return call(gpu, *args)
            except nvml.NVMLError as exc:
                if name not in self._refused:
                    self._refused.add(name)
                    logger.info(
                        "rankscope: NVML does not give %s on rank %d (%s): written as null",
                        name,
                        self._rank,
                        exc,
                    )
                return None

        # Newer pynvml names it ClocksEvent and keeps the old name as a deprecated alias.
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        throttle = read("throttle", reasons or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)
        power = read("power_w", nvml.nvmlDeviceGetPowerUsage)
        limit = read("power_limit_w", nvml.nvmlDeviceGetEnforcedPowerLimit)
        ecc = nvml.nvmlDeviceGetTotalEccErrors
        sample = {
            "v": HEALTH_VERSION,
            "rank": self._rank,
            "step": step,
            "time_ns": time.time_ns(),
            "sm_mhz": read("sm_mhz", nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM),
            "mem_mhz": read("mem_mhz", nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_MEM),
            "throttle": None if throttle is None else _reasons(int(throttle)),
            "temp_c": read("temp_c", nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU),
            "power_w": None if power is None else power / 1000,
            "power_limit_w": None if limit is None else limit / 1000,
            "ecc_corrected": read(
                "ecc_corrected",
                ecc,
                nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                nvml.NVML_VOLATILE_ECC,
            ),
            "ecc_uncorrected": read(
                "ecc_uncorrected",
                ecc,
                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvml.NVML_VOLATILE_ECC,
            ),
            "load1": proc.load_average(),
            "mem_available_mb": proc.available_mb(),
        }
        return (json.dumps(sample, separators=(",", ":")) + "\n").encode()


def _reasons(mask: int) -> list[str]:
    return [word for bit, word in THROTTLE_REASONS if mask & bit]


class _Proc:
    """The host's /proc/loadavg and /proc/meminfo, opened once and read from their start at
    each sample; a file that cannot be opened or read gives None."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        for name in ("loadavg", "meminfo"):
            try:
                self._fds[name] = os.open(_PROC / name, os.O_RDONLY)
            except OSError:
                continue

    def __enter__(self) -> _Proc:
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _read(self, name: str) -> str | None:
        fd = self._fds.get(name)
        if fd is None:
            return None
        try:
            return os.pread(fd, 8192, 0).decode("ascii", "replace")
        except OSError:
            return None

    def load_average(self) -> float | None:
        """The host's 1-minute load average; None where it cannot be read."""
        text = self._read("loadavg")
        try:
            return None if text is None else float(text.split()[0])
        except (ValueError, IndexError):
            return None

    def available_mb(self) -> float | None:
        """The host's available memory in MiB (MemAvailable)."""
        text = self._read("meminfo")
        for line in (text or "").splitlines():
            if line.startswith("MemAvailable:"):
                try:
                    return int(line.split()[1]) / 1024
                except (ValueError, IndexError):
                    return None
        return None
