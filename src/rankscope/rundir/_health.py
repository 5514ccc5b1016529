"""The health line's schema (RUN_DIR/health/rank-NNNNN.jsonl): the figures a line holds
and the words for NVML's throttle reasons. The sampler (timing/_health.py) writes them,
the analysis (analysis/read/_health.py) reads them; docs/run-directory.md tells users."""

from __future__ import annotations

__all__ = ["FIGURES", "HEALTH_VERSION", "THROTTLE_REASONS"]

HEALTH_VERSION = 1

FIGURES = (
    "sm_mhz",
    "mem_mhz",
    "temp_c",
    "power_w",
    "power_limit_w",
    "ecc_corrected",
    "ecc_uncorrected",
    "load1",
    "mem_available_mb",
)
"""The numbers a health line holds, each null where it was not read."""

THROTTLE_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clocks"),
)
"""NVML's clock-throttle reason bits (pynvml's nvmlClocksThrottleReason* constants, renamed
nvmlClocksEventReason* in newer releases with the same values) -> the word a line's
`throttle` list writes for each."""
