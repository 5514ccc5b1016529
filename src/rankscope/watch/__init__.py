"""The watch layer: a heartbeat per rank and a watchdog for its stalls (docs/hangs.md).

The training thread only updates a `Pulse` in memory (the step, the open phases); a
`Watchdog` thread reads it, rewrites RUN_DIR/live/rank-NNNNN.json when something
changed, and writes RUN_DIR/hangs/step-NNNNNN-<attempt>/rank-NNNNN.json once per stall. Nothing
here calls a collective, and nothing raises into the job.
"""

from ._pulse import Pulse
from ._watchdog import Watchdog

__all__ = ["Pulse", "Watchdog"]
