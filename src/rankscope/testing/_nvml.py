"""A stand-in NVML for hosts without a GPU: the calls of pynvml that timing/_health.py
makes, with the same names, constants and error class, on GPUs that tests drive."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["StandInGpu", "StandInNvml"]

# pynvml's values, so that a reading of the stand-in means what the real one's would.
_THERMAL = 0x20 | 0x40  # nvmlClocksThrottleReasonSwThermalSlowdown | HwThermalSlowdown


@dataclass
class StandInGpu:
    """One stand-in device: what NVML would read on it now. A test changes the fields
    while the job runs (a GPU that starts to throttle at some step)."""

    sm_mhz: int = 1980
    mem_mhz: int = 2619
    throttle: int = 0
    """A bitmask of pynvml's nvmlClocksThrottleReason* values."""
    temp_c: int = 62
    power_mw: int = 420_000
    limit_mw: int = 700_000
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    failing: dict[str, int] = field(default_factory=dict)
    """pynvml function name -> the NVML error code it raises on this device."""

    @classmethod
    def throttling(cls, **fields: int) -> StandInGpu:
        """A GPU held back by heat: its SM clock down, both thermal reasons set."""
        return cls(**{"sm_mhz": 1410, "throttle": _THERMAL, "temp_c": 91, **fields})  # type: ignore[arg-type]


class StandInNvml:
    """pynvml's call surface over a list of StandInGpu, counting the calls per thread.

    Inject it where the real module would be imported (timing/_health.py's GpuSource).
    `init_error`: the NVML error code nvmlInit raises (the driver missing: 9). `stall`:
    while it is not set, every reading of a device waits for it (a GPU fallen off the bus
    can hold an NVML call that long).
    """

    NVML_SUCCESS = 0
    NVML_ERROR_UNINITIALIZED = 1
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NOT_FOUND = 6
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlClocksThrottleReasonGpuIdle = 0x1
    nvmlClocksThrottleReasonApplicationsClocksSetting = 0x2
    nvmlClocksThrottleReasonSwPowerCap = 0x4
    nvmlClocksThrottleReasonHwSlowdown = 0x8
    nvmlClocksThrottleReasonSyncBoost = 0x10
    nvmlClocksThrottleReasonSwThermalSlowdown = 0x20
    nvmlClocksThrottleReasonHwThermalSlowdown = 0x40
    nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 0x80
    nvmlClocksThrottleReasonDisplayClockSetting = 0x100

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

        def __str__(self) -> str:
            return f"NVML error {self.value}"

    def __init__(
        self,
        gpus: list[StandInGpu] | None = None,
        init_error: int | None = None,
        stall: threading.Event | None = None,
    ) -> None:
        self.gpus = gpus if gpus is not None else [StandInGpu()]
        self.init_error = init_error
        self.stall = stall
        self.calls: Counter[tuple[str, int]] = Counter()
        """(function, thread ident) -> calls."""
        self._lock = threading.Lock()
        self._inits = 0

    # -- what a test reads ------------------------------------------------------------

    def on(self, thread: int) -> dict[str, int]:
        """Calls made on `thread` (a threading.get_ident()), by function."""
        with self._lock:
            return {f: n for (f, ident), n in sorted(self.calls.items()) if ident == thread}

    @property
    def initialised(self) -> bool:
        """Whether an nvmlInit is not matched by its nvmlShutdown yet."""
        return self._inits > 0

    # -- pynvml's functions -----------------------------------------------------------

    def nvmlInit(self) -> None:
        self._call("nvmlInit")
        if self.init_error is not None:
            raise self.NVMLError(self.init_error)
        self._inits += 1

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        self._inits = max(0, self._inits - 1)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> StandInGpu:
        self._call("nvmlDeviceGetHandleByIndex")
        self._ready()
        if not 0 <= index < len(self.gpus):
            raise self.NVMLError(self.NVML_ERROR_NOT_FOUND)
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> StandInGpu:
        self._call("nvmlDeviceGetHandleByUUID")
        self._ready()
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        raise self.NVMLError(self.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetClockInfo(self, gpu: StandInGpu, clock: int) -> int:
        self._read(gpu, "nvmlDeviceGetClockInfo")
        return gpu.sm_mhz if clock == self.NVML_CLOCK_SM else gpu.mem_mhz

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, gpu: StandInGpu) -> int:
        self._read(gpu, "nvmlDeviceGetCurrentClocksThrottleReasons")
        return gpu.throttle

    def nvmlDeviceGetTemperature(self, gpu: StandInGpu, sensor: int) -> int:
        self._read(gpu, "nvmlDeviceGetTemperature")
        return gpu.temp_c

    def nvmlDeviceGetPowerUsage(self, gpu: StandInGpu) -> int:
        self._read(gpu, "nvmlDeviceGetPowerUsage")
        return gpu.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, gpu: StandInGpu) -> int:
        self._read(gpu, "nvmlDeviceGetEnforcedPowerLimit")
        return gpu.limit_mw

    def nvmlDeviceGetTotalEccErrors(self, gpu: StandInGpu, kind: int, counter: int) -> int:
        self._read(gpu, "nvmlDeviceGetTotalEccErrors")
        return (
            gpu.ecc_uncorrected
            if kind == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
            else gpu.ecc_corrected
        )

    # -- inside -----------------------------------------------------------------------

    def _call(self, name: str) -> None:
        with self._lock:
            self.calls[name, threading.get_ident()] += 1

    def _ready(self) -> None:
        if self._inits == 0:
            raise self.NVMLError(self.NVML_ERROR_UNINITIALIZED)

    def _read(self, gpu: StandInGpu, name: str) -> None:
        self._call(name)
        self._ready()
        if self.stall is not None:
            self.stall.wait()
        code = gpu.failing.get(name)
        if code is not None:
            raise self.NVMLError(code)
