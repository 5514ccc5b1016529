"""Windows asked for outside the schedule: one door for every source.

A trigger file, SIGUSR2 and a stretch of slow steps each ask for a window; `WindowRequests`
turns any such request into a window on the rank's StepPlan, or a reason why not, under
the same rules, and remembers who asked so that the window's name and summary can say.
Pure: no torch, no files, no logging (the sources say what they were told).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config._trace import TraceConfig
from ..rundir._layout import step_window_name
from ._schedule import AddedWindow, StepPlan

if TYPE_CHECKING:
    from ..rundir._trigger import Trigger

__all__ = ["Asked", "WindowRequests"]


@dataclass(frozen=True, slots=True)
class Asked:
    """Who asked for a window outside the schedule, and with what figures."""

    who: str
    """In words, for log lines: "trigger ID", "SIGUSR2", "slow steps"."""
    tag: str
    """What the window's directory name ends with: "trigger-ID", "sigusr2", "slow-steps"."""
    figures: dict[str, Any] = field(default_factory=dict)
    """What the window's summary records under "captured_because"."""
    trigger: Trigger | None = None
    on_demand: bool = False
    """A trigger or SIGUSR2: its window counts against trace.trigger_max_windows."""


class WindowRequests:
    """The one door to a rank's StepPlan for windows the schedule did not plan.

    A request names its steps, or takes the next ones: a warm-up step first where the
    schedule has one, then `steps` steps. It is granted (an AddedWindow) unless it asks
    for more than trace.trigger_max_steps, begins too late, overlaps another window, or
    is on demand once trace.trigger_max_windows on-demand windows were granted.
    """

    def __init__(self, config: TraceConfig, plan: StepPlan) -> None:
        self.plan = plan
        self._warmup = config.schedule.warmup > 0
        self.signal_steps = min(config.schedule.active, config.trigger_max_steps)
        """How many steps a SIGUSR2 window records: the schedule's, within the cap."""
        self._max_steps = config.trigger_max_steps
        self.max_windows = config.trigger_max_windows
        self.on_demand = 0
        """On-demand windows granted and not given up."""
        self.past_bound = 0
        """On-demand requests declined because `max_windows` were granted: each would have
        been a window."""
        self._asked: dict[AddedWindow, Asked] = {}

    def ask(self, asked: Asked, first: int, steps: int, step: int) -> AddedWindow | str:
        """Steps first..first+steps-1, asked for during `step`: the window, or why not."""
        if steps > self._max_steps:
            return f"it asks for {steps} steps; trace.trigger_max_steps is {self._max_steps}"
        if first <= step:
            return f"seen at step {step}, too late for its start step {first}"
        conflict = self.plan.conflict(first, first + steps - 1)
        if conflict is not None:
            return conflict
        if asked.on_demand:
            # Checked last, so that what is counted is a window the bound alone declined.
            if self.on_demand >= self.max_windows:
                self.past_bound += 1
                return self.bound_reason
            self.on_demand += 1
        window = self.plan.add(first, first + steps - 1, warmup=self._warmup, after=step)
        self._asked[window] = asked
        return window

    @property
    def bound_reason(self) -> str:
        return (
            f"this rank has recorded trace.trigger_max_windows ({self.max_windows}) on-demand "
            "windows this run"
        )

    def ask_next(self, asked: Asked, steps: int, step: int) -> AddedWindow | str:
        """`steps` steps from the next one after `step` that can begin a window."""
        return self.ask(asked, step + 1 + int(self._warmup), steps, step)

    def name(self, window: AddedWindow) -> str:
        """The folder name of an added window: its steps and who asked."""
        asked = self._asked.get(window)
        return step_window_name(window.first, window.last, None if asked is None else asked.tag)

    def by_first(self, first: int) -> Asked | None:
        """Who asked for the added window that begins at `first`; None for the schedule's."""
        return next((a for w, a in self._asked.items() if w.first == first), None)

    def open_for(self, who: str, step: int) -> AddedWindow | None:
        """A window `who` asked for that is not over by `step`."""
        return next((w for w, a in self._asked.items() if a.who == who and w.last >= step), None)

    def drop_next(self, step: int) -> list[tuple[AddedWindow, Asked | None]]:
        """Give up the added windows that were to begin at the step after `step`."""
        plan = self.plan
        dropped = []
        for window in [w for w in plan.added if plan.next_added in (w.warmup, w.first)]:
            plan.drop(window, step)
            asked = self._asked.pop(window, None)
            if asked is not None and asked.on_demand:
                self.on_demand -= 1  # never recorded: it does not count
            dropped.append((window, asked))
        return dropped

    def not_begun(self, step: int) -> list[tuple[AddedWindow, Asked]]:
        """The asked-for windows that begin after `step` (a run that stops there misses them)."""
        out = []
        for window in self.plan.added:
            asked = self._asked.get(window)
            if asked is not None and step < window.first:
                out.append((window, asked))
        return out
