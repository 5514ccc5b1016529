"""Making and unmaking the profiler a window records with: a torch.profiler.profile driven
by the rank's StepPlan, or an NsysWindows with trace.tool="nsys"."""

from __future__ import annotations

import json
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .._log import get_logger
from ..config._trace import TraceConfig
from ._export import let_go
from ._nsys import NsysWindows
from ._schedule import Action, StepPlan
from ._settle import settling_profile

__all__ = ["ProfilerMaker", "abandon", "disable_autograd_profiler"]

logger = get_logger(__name__)

_KINDS = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU"}


class ProfilerMaker:
    """Builds this rank's profilers from its trace config and its StepPlan."""

    def __init__(
        self, config: TraceConfig, torch: ModuleType, rank: int, plan: StepPlan, resolve: bool
    ) -> None:
        self._config = config
        self._torch = torch
        self._rank = rank
        self._plan = plan
        self.nsys = config.tool == "nsys"
        # Resolved (and warned about) where windows are certain; elsewhere when one is asked for.
        self._activities: tuple[str, ...] | None = self._resolve() if resolve else None

    def new(
        self,
        on_ready: Callable[[Any], None] | None,
        step: int,
        base: int | None = None,
    ) -> Any:
        """A profiler whose windows the plan decides, calling `on_ready` as each ends; with
        `on_ready` None, one for a single window its caller starts and stops (a phase's).

        `step`: the step it is made in. With `base`, it is made during step `base` for an
        added window and records nothing before base + 1.
        """
        torch = self._torch
        plan = self._plan
        live = 0 if base is None else base + 1
        stepped = on_ready is not None
        if self.nsys:
            windows = NsysWindows(
                torch,
                (lambda s: plan.action(s) if s >= live else Action.NONE) if stepped else None,
                on_ready,
            )
            windows.step_num = step if base is None else base
            return windows
        if self._activities is None:
            self._activities = self._resolve()
        activities = [getattr(torch.profiler.ProfilerActivity, _KINDS[a]) for a in self._activities]
        schedule = None
        if stepped:
            actions = {a: getattr(torch.profiler.ProfilerAction, a.name) for a in Action}
            # torch asks for step 0 once, as it is made, and for step_num + 1 after each
            # step(); a profiler made at a resumed job's first step (step_num set to it
            # below) must answer that first question for that step, not for step 0.
            made_at = step if base is None else 0

            def schedule(s: int) -> Any:
                s = s or made_at
                return actions[plan.action(s) if s >= live else Action.NONE]

        cfg = self._config
        prof = settling_profile(torch)(
            activities=activities,
            schedule=schedule,
            on_trace_ready=on_ready,
            record_shapes=cfg.record_shapes,
            profile_memory=cfg.profile_memory,
            with_stack=cfg.with_stack,
            with_flops=cfg.with_flops,
            with_modules=cfg.with_modules,
        )
        if base is not None or step:
            # Count as the run does, so the trace's ProfilerStep#N is global step N.
            prof.step_num = step if base is None else base
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()) and hasattr(
            prof, "preset_metadata_json"
        ):
            # torch writes distributedInfo only for an initialised process group; a Ray
            # worker or a test that passed its rank explicitly gets it from us.
            info = {"rank": self._rank, "backend": None}
            prof.preset_metadata_json("distributedInfo", json.dumps(info))
        return prof

    def _resolve(self) -> tuple[str, ...]:
        requested = self._config.activities
        cuda = bool(self._torch.cuda.is_available())
        if requested is None:
            return ("cpu", "cuda") if cuda else ("cpu",)
        chosen = tuple(requested)
        if "cuda" in chosen and not cuda:
            logger.warning(
                "rankscope: trace.activities asks for cuda but CUDA is not available; "
                "capturing %s only",
                ", ".join(a for a in chosen if a != "cuda") or "cpu",
            )
            chosen = tuple(a for a in chosen if a != "cuda") or ("cpu",)
        return chosen


def abandon(prof: Any, torch: ModuleType) -> None:
    """Stop a profiler after a fault without exporting, so it cannot keep collecting."""
    if prof is None:
        return
    prof.on_trace_ready = None
    try:
        if isinstance(prof, NsysWindows):
            prof.abort()  # no synchronize: the device may be what failed
        else:
            prof.stop()
    except Exception:
        logger.debug("rankscope: stopping a faulty profiler failed", exc_info=True)
    let_go(prof)
    disable_autograd_profiler(torch)


def disable_autograd_profiler(torch: ModuleType) -> None:
    """Switch off the profiler torch keeps on this thread, whatever state it is in."""
    autograd = torch.autograd
    try:
        if autograd._profiler_enabled():
            autograd._disable_profiler()
    except Exception:
        logger.debug("rankscope: disabling the autograd profiler failed", exc_info=True)
