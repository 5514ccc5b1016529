"""Combinations of a config and this process's torch that break the job or do nothing,
found before the run starts so that each can be said once, naming the fields."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config._config import ProfileConfig

__all__ = ["incompatibilities"]

# Trace-changing torch.profiler options under which the profiler keeps C++ weak references
# to the TensorImpl of every tensor an op received (measured on torch 2.13, see
# incompatibilities()). swap_tensors refuses such tensors.
_WEAKREF_OPTIONS = ("record_shapes", "with_stack", "with_flops")


def incompatibilities(config: ProfileConfig, torch: ModuleType) -> list[str]:
    """Known combinations of `config` and this process's torch settings that break or do
    nothing, one sentence each naming the fields and why; empty when there are none.

    What runs later (FSDP2's fully_shard, a model moved between devices) cannot be seen
    here; docs/memory.md says what to avoid.
    """
    found: list[str] = []
    trace = config.trace
    held = [name for name in _WEAKREF_OPTIONS if getattr(trace, name)]
    if trace.enable and trace.tool == "torch" and held and _swaps_module_params(torch):
        found.append(
            f"trace.{'/'.join(held)}=True with torch.__future__."
            f"set_swap_module_params_on_conversion(True): while a trace window is open and "
            f"until its profiler is released, torch.profiler holds weak references to every "
            f"tensor an op received, and torch.utils.swap_tensors (used by module.to(), "
            f".cuda(), .half() and load_state_dict(assign=True) under that flag) then fails "
            f"with 'Expected no weakrefs'; turn those trace options off or convert modules "
            f"outside trace windows"
        )
    return found


def _swaps_module_params(torch: ModuleType) -> bool:
    future = getattr(torch, "__future__", None)
    getter = getattr(future, "get_swap_module_params_on_conversion", None)
    return bool(getter()) if callable(getter) else False
