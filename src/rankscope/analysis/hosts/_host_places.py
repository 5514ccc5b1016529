"""Where each rank of a run ran in each of its attempts, for `hosts` (analysis/hosts/_hosts.py)."""

from __future__ import annotations

from ...rundir._layout import meta_path, timing_path
from ..read._attempts import AttemptMark, host_problem
from ..read._run import RunMeta

__all__ = ["Places"]

_SAME_HOSTS = "--same-hosts takes that host for every attempt"


class Places:
    """Each rank's host in each attempt of a run: from its attempt line, else from its meta
    file where that file is of the attempt (or `same_hosts`), else why it is not known."""

    def __init__(
        self, meta: RunMeta, marks: list[dict[int, AttemptMark]], same_hosts: bool
    ) -> None:
        self._meta = meta
        self._marks = marks  # per attempt, each rank's attempt line (read/_attempts.py)
        self._same = same_hosts or len(marks) <= 1

    def hosts(self, attempt: int, ranks: list[int]) -> tuple[dict[int, str], dict[int, str]]:
        """(rank -> host, rank -> why its host is not known) for `ranks` in `attempt`."""
        known: dict[int, str] = {}
        unknown: dict[int, str] = {}
        marks = self._marks[attempt - 1] if attempt <= len(self._marks) else {}
        for rank in ranks:
            mark = marks.get(rank, AttemptMark())
            host, why = (mark.host, "") if mark.host else self._from_meta(attempt, rank)
            if host is not None:
                known[rank] = host
            elif mark.host_problem is None:
                unknown[rank] = why
            else:
                unknown[rank] = f"its attempt line's host is {mark.host_problem}; {why}"
        return known, unknown

    def ignored(self) -> list[str]:
        """The attempt lines whose host was ignored, each said with its file."""
        return [
            f"{timing_path(self._meta.root, rank)}: the line that opens attempt {n} names no "
            f"usable host ({mark.host_problem}); ignored"
            for n, marks in enumerate(self._marks, start=1)
            for rank, mark in sorted(marks.items())
            if mark.host_problem is not None
        ]

    def _from_meta(self, attempt: int, rank: int) -> tuple[str | None, str]:
        """(the host the rank's meta file names, where it is of `attempt`; else why not)."""
        data = self._meta.meta.get(rank)
        path = meta_path(self._meta.root, rank)
        if data is None:
            return None, f"no usable meta file ({path})"
        host = data.get("host")
        if host_problem(host) is not None:
            return None, f"its meta file names no host ({path})"
        if self._same:
            return host, ""
        wrote = self._attempt_of(rank, data.get("attempt"))
        if wrote == attempt:
            return host, ""
        said = f"of attempt {wrote}" if wrote else "of no attempt its timings hold"
        return None, (
            f"its meta file is {said} (a rank's meta file holds its latest start; {_SAME_HOSTS})"
        )

    def _attempt_of(self, rank: int, said: object) -> int | None:
        """The attempt (1-based) whose start of `rank` wrote its meta file: the one whose
        attempt line has the meta's token (both come from one start); None where none has."""
        token = said.get("attempt") if isinstance(said, dict) else None
        if not isinstance(token, str):
            return None
        for n, marks in enumerate(self._marks, start=1):
            mark = marks.get(rank)
            if mark is not None and mark.token == token:
                return n
        return None
