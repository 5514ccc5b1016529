"""Writing the merged trace: one JSON object, under a temporary name until complete."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import zlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..._errors import TraceError
from ...rundir._layout import temp_name
from ..core._parallel import LaneWorkers, WorkerStopped
from ._events import _THREAD_BITS
from ._header import _Header
from ._plan import _Job
from ._result import MergedInput, MergeResult

_GZIP_LEVEL = 1  # level 6 compresses 3x slower for ~25% smaller output


class _Misread(Exception):
    """The cheap first read of an input disagreed with its full read."""

    def __init__(self, index: int, header: _Header) -> None:
        super().__init__(index)
        self.index = index
        self.header = header


class _Output:
    """The output file under its temporary name, compressed on the way when asked."""

    def __init__(self, path: Path, final: Path) -> None:
        self._final = final
        self._file = open(path, "xb")  # noqa: SIM115 - closed in close()
        gz = final.name.endswith(".gz")
        self._zip = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 31) if gz else None

    def write(self, data: bytes | memoryview) -> None:
        self.write_raw(data if self._zip is None else self._zip.compress(data))

    def finish(self) -> None:
        if self._zip is not None:
            self.write_raw(self._zip.flush())
        try:
            self._file.close()
        except OSError as exc:
            raise TraceError(f"{self._final}: cannot write ({exc.strerror or exc})") from None

    def write_raw(self, data: bytes | memoryview) -> None:
        try:
            self._file.write(data)
        except OSError as exc:
            raise TraceError(f"{self._final}: cannot write ({exc.strerror or exc})") from None

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()


class _Merger:
    """Writes the chunks that the lanes send, in one JSON object, and keeps the account."""

    def __init__(
        self,
        out: _Output,
        jobs: list[_Job],
        headers: list[_Header],
        progress: Callable[[int], None] | None,
    ) -> None:
        self._out = out
        self._jobs = jobs
        self._headers = headers
        self._progress = progress
        self._read_bytes = 0  # whole inputs plus the estimated part of those being read
        self._partial = [0] * len(jobs)
        self._ends: dict[int, dict[str, Any]] = {}
        self._first = True
        self.written = 0

    def start(self, base: int | None) -> None:
        head: dict[str, Any] = {"schemaVersion": 1, "displayTimeUnit": "ms"}
        if base is not None:
            head["baseTimeNanoseconds"] = base
        self._out.write(json.dumps(head)[:-1].encode() + b', "traceEvents": [\n')

    def handle(self, message: tuple[Any, ...]) -> None:
        kind, index = message[0], message[1]
        if kind == "chunk":
            if not self._first:
                self._out.write(b",\n")
            self._out.write(memoryview(message[2])[1:-1])  # the chunk is a JSON list
            self._first = False
            header = self._headers[index]
            guess = (
                header.size * min(message[3], header.events_guess) // max(1, header.events_guess)
            )
            self._advance(index, guess)
        else:
            self._end(index, message[2])

    def _end(self, index: int, info: dict[str, Any]) -> None:
        header = self._headers[index]
        base, info_rank = info["essentials"]
        if (base, info_rank) != (header.base, header.info_rank):
            raise _Misread(index, replace(header, base=base, info_rank=info_rank))
        self._ends[index] = info
        self.written += info["written"]
        self._advance(index, header.size)

    def _advance(self, index: int, done: int) -> None:
        self._read_bytes += done - self._partial[index]
        self._partial[index] = done
        if self._progress is not None:
            self._progress(self._read_bytes)

    def finish(self, final: Path, base: int | None) -> MergeResult:
        merged = []
        inputs = []
        for job, header in zip(self._jobs, self._headers, strict=True):
            info = self._ends[job.index]
            pid = job.rank << _THREAD_BITS
            entry: dict[str, Any] = {
                "rank": job.rank,
                "source": job.source,
                "pid": pid,
                "baseTimeNanoseconds": job.base,
                "distributedInfo": info["distributedInfo"],
            }
            if info["deviceProperties"] is not None:
                entry["deviceProperties"] = info["deviceProperties"]
            merged.append(entry)
            inputs.append(
                MergedInput(
                    source=job.source,
                    rank=job.rank,
                    rank_from=job.rank_from,
                    pid=pid,
                    base_time_ns=job.base,
                    events=info["read"],
                    bytes_read=header.size,
                    json_bytes=header.json_bytes,
                    not_finite=info["not_finite"],
                )
            )
        tail = json.dumps({"rankscope": {"version": 1, "merged": merged}})
        self._out.write(b"\n],\n" + tail[1:].encode() + b"\n")
        return MergeResult(
            output=final,
            ranks=tuple(job.rank for job in self._jobs),
            events_written=self.written,
            bytes_read=sum(header.size for header in self._headers),
            json_bytes=sum(header.json_bytes for header in self._headers),
            base_time_ns=base,
            inputs=tuple(inputs),
        )


def _write(
    *,
    jobs: list[_Job],
    base: int | None,
    headers: list[_Header],
    final: Path,
    progress: Callable[[int], None] | None,
    workers: LaneWorkers[_Job, tuple[Any, ...]],
) -> MergeResult:
    temp = temp_name(final, f"merge-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        out = _Output(temp, final)
    except OSError as exc:
        raise TraceError(f"{final}: cannot write ({exc.strerror or exc})") from None
    try:
        merger = _Merger(out, jobs, headers, progress)
        merger.start(base)
        try:
            workers.stream(jobs, merger.handle)
        except WorkerStopped as stopped:
            raise TraceError(
                f"{stopped.job.source}: the process reading it stopped (exit code {stopped.exit_code})"
            ) from None
        result = merger.finish(final, base)
        out.finish()
        try:
            os.replace(temp, final)
        except OSError as exc:
            raise TraceError(f"{final}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        out.discard()
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    return result
