"""The one-warning rule that capture and memory snapshots share: the first fault turns the
part off and is said once; later ones are ignored."""

from __future__ import annotations

import threading

from .._log import get_logger

__all__ = ["OneFault"]

logger = get_logger(__name__)


class OneFault:
    """Mixed into a part of rankscope that a fault may turn off for the rest of the run.

    The part sets `enabled`, and `_part` ("trace capture") and `_rank` for the message.
    """

    _part: str
    _rank: int
    enabled: bool
    fault_reason: str | None

    def __init__(self) -> None:
        self._fault_lock = threading.Lock()
        self.fault_reason = None
        """Why a fault turned this part off (None: it did not)."""

    def _switch_off(self, what: str) -> bool:
        """Warn once and mark the part off; True if this call did (the first fault)."""
        with self._fault_lock:
            if not self.enabled:
                return False
            logger.warning(
                "rankscope: %s; %s %s off for the rest of this run (rank %d), training goes on",
                what,
                self._part,
                _verb(self._part),
                self._rank,
            )
            self.enabled = False
            self.fault_reason = what
            return True


def _verb(part: str) -> str:
    """ "are" for a part named in the plural ("memory snapshots"), else "is"."""
    return "are" if part.endswith("s") else "is"
