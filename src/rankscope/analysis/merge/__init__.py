"""Merging several ranks' Kineto traces into one timeline (`rankscope merge`).

Every input is streamed event by event (`scan_trace`), rewritten and written out at
once, so memory stays bounded whatever the traces' size. The choices, and why:

- One process per rank. All of rank N's events get pid ``N << 12``, named "rank N" and
  sorted by rank (``process_sort_index``), so Perfetto and chrome://tracing show one
  collapsible group per rank. Perfetto sorts processes by activity, not by pid, so a
  process per (rank, original pid) would scatter a rank's CPU and GPU rows. Each of the
  rank's original (pid, tid) pairs becomes a thread ``pid + k`` (k = 1..4095) named after
  its origin ("CPU · thread 4037 (python)", "GPU 0 · stream 7"), CPU before GPU as
  Kineto sorts them. Thread ids are unique across the whole file and never equal a
  pid, because Perfetto's JSON importer names threads by tid alone. The inputs' own
  process/thread metadata is absorbed into these names (their process names become the
  rank's ``process_labels``). Ranks go up to 2**20 - 1, threads and streams to 4095.
- Clocks. The output's ``baseTimeNanoseconds`` is the smallest input base and every
  input's ``ts`` moves by its own base minus that, computed in integer nanoseconds so
  times keep their 3 decimals without float noise. An input without a base (older
  torch) holds absolute microseconds: its base counts as 0. Without any base, ``ts``
  stays as written. Kineto writes the base after the events, so each input's top-level
  fields are found first by a cheap pass (decompress, parse the head, look the keys up
  at the tail); should the full read disagree, the merge runs again with what it read.
- Ids. Flow ids (``id``, ``bind_id``, ``id2.global``) and the args ``correlation`` and
  ``External id`` of rank N become ``N << 32`` plus the id (negative ids minus it),
  which stays below 2**53 where JavaScript numbers are exact; a flow id written as a hex
  string (Perfetto reads it so) is read as that number first. Anything else becomes
  the string ``"rankN:<id>"``. Flows therefore pair up within a rank and never across.
  Global instant events become process-scoped: one rank's marker is not the world's.
- The rank comes from the caller's ``ranks`` when given (it overrides the files: two
  single-GPU runs both say rank 0), else ``distributedInfo.rank``, else the file name,
  read by the run directory's one rule (`rankscope.rundir._layout.rank_of_file`); a trace with
  none of these is an error, never silently rank 0.
- Each input's distributedInfo and deviceProperties are kept under the output's
  top-level ``"rankscope": {"merged": [...]}``, with its rank, source, pid and base.
- Inputs are read by worker processes (one per core) when there is enough to read,
  while this process compresses (gzip level 1) and writes. The workers are
  `analysis._parallel.LaneWorkers`: fresh interpreters, never forks, each a bounded
  number of chunks ahead. This process takes one chunk from each worker in turn, so
  the same inputs always give the same bytes. The output is written under a hidden
  temporary name and renamed when complete; after an error none is left.

One module per job, each importing only those before it: `_header` (the cheap first
read), `_plan` (ranks and clocks), `_events` (rewriting a rank's events: the hot path,
and a worker's job), `_result`, `_writer` (the output, fed by the workers) and
`_merge_traces` (the front door).
"""

from __future__ import annotations

from ._merge_traces import merge_traces
from ._result import MergedInput, MergeResult

__all__ = ["MergeResult", "MergedInput", "merge_traces"]
