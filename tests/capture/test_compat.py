"""Config and torch settings that break or do nothing together (capture/_compat.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from rankscope import ProfileConfig, TraceConfig
from rankscope.capture._compat import incompatibilities


@pytest.fixture
def swap_flag() -> Iterator[None]:
    """Turn torch's swap-on-conversion flag on for one test and restore it."""
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        yield
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)


# -- incompatibilities -------------------------------------------------------------


def _traced(tmp_path: Path, **options: bool) -> ProfileConfig:
    return ProfileConfig(output_dir=tmp_path, trace=TraceConfig(enable=True, **options))


@pytest.mark.parametrize("option", ["record_shapes", "with_stack", "with_flops"])
def test_swap_on_conversion_with_weakref_holding_trace_options_is_reported(
    tmp_path: Path, swap_flag: None, option: str
) -> None:
    found = incompatibilities(_traced(tmp_path, **{option: True}), torch)
    assert len(found) == 1
    assert f"trace.{option}=True" in found[0]
    assert "set_swap_module_params_on_conversion" in found[0]


def test_swap_flag_off_or_harmless_options_are_not_reported(
    tmp_path: Path, swap_flag: None
) -> None:
    assert incompatibilities(_traced(tmp_path, with_modules=True, profile_memory=True), torch) == []
    assert incompatibilities(ProfileConfig(output_dir=tmp_path), torch) == []
    torch.__future__.set_swap_module_params_on_conversion(False)
    assert incompatibilities(_traced(tmp_path, record_shapes=True), torch) == []


@pytest.mark.parametrize(("option", "breaks"), [("record_shapes", True), ("with_modules", False)])
def test_the_reported_conflict_is_real_in_this_torch(
    swap_flag: None, option: str, breaks: bool
) -> None:
    """What incompatibilities() says, checked against the installed torch: converting a
    module inside a window that records shapes fails, one that records modules does not."""
    model = nn.Linear(4, 4)
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], **{option: True}
    )
    prof.start()
    try:
        model(torch.randn(2, 4)).sum()
        if breaks:
            with pytest.raises(RuntimeError) as info:
                model.to(torch.float64)
            assert "weakref" in str(info.value.__cause__)
        else:
            model.to(torch.float64)
            assert model.weight.dtype == torch.float64
    finally:
        prof.stop()
