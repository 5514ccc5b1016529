"""A run directory as tables a user can query: `rankscope sql RUN_DIR "select ..."`.

The tables are built the way the analysis reads the run, so a query sees what the
figures saw: the timings of every file DuckDB reads whole are a view over the JSONL
files (memory stays bounded however many ranks ran; each query reads the files again);
the files the line-by-line reader must read (bad lines, a restart's several attempts)
are read by it, and their usable records added as a table. The smaller files (meta,
window summaries, heartbeats, hang files) go through their own readers into tables.
What could not be used is said in `skipped`, as by every other command.

`rankscope sql` confines the connection (`allow_files=False`): once the tables are built,
the timings are copied into memory (the view's reads of the files would be refused),
DuckDB's access to files, the network and extensions is turned off, and the
configuration locked, so a query sees the run's tables and nothing else of the machine.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import RankscopeError, TraceError
from ..rundir._listing import RunDir
from .kernels._kernels import find_traces, read_summaries
from .read._attempts import latest_rows, run_attempts
from .read._duck import COLUMNS, connect, lines_sql
from .read._engine import read_line_by_line
from .read._rank_timings import RankTimings
from .read._run import read_run_meta, run_root
from .read._scan import WholeFile, verdict
from .read._timings import claim_ranks
from .read._watch import read_watch

__all__ = ["CONFINED", "TABLES", "RunDatabase", "open_run_database"]

TABLES: dict[str, tuple[str, list[tuple[str, str, str]]]] = {
    "timings": (
        "one row per timing record (RUN_DIR/timings)",
        [
            ("rank", "BIGINT", ""),
            ("step", "BIGINT", "global step"),
            ("phase", "VARCHAR", 'the phase name; "step" for the time between step() calls'),
            ("kind", "VARCHAR", "compute, comm, data, io or a user word"),
            ("start_ns", "BIGINT", "wall clock at entry (epoch ns)"),
            ("cpu_ms", "DOUBLE", "host time"),
            ("gpu_ms", "DOUBLE", "device time; NULL without a GPU"),
            ("depth", "BIGINT", "nesting level"),
            ("error", "BOOLEAN", "the phase ended in an exception"),
            ("coll", "BIGINT", "collectives the phase issued; NULL where the record does not say"),
            (
                "oncpu_ms",
                "DOUBLE",
                "the thread's CPU time in it; NULL where the record does not say",
            ),
            (
                "runq_ms",
                "DOUBLE",
                "the thread's wait for a CPU in it (ready to run, its cores busy); NULL where "
                "the record does not say",
            ),
            ("attempt", "BIGINT", "the run's attempt (1-based) that wrote it"),
            ("used", "BOOLEAN", "the analysis uses it (the latest attempt of its step)"),
        ],
    ),
    "meta": (
        "one row per rank's meta file (RUN_DIR/meta)",
        [
            ("rank", "BIGINT", ""),
            ("world_size", "BIGINT", ""),
            ("host", "VARCHAR", ""),
            ("pid", "BIGINT", ""),
            ("attempt", "VARCHAR", "the attempt token of the start that wrote it"),
            ("meta", "JSON", "the whole file (versions, device, config, clock)"),
        ],
    ),
    "kernels": (
        "one row per kernel (or CPU op) name per captured trace, from the window summaries",
        [
            ("window_name", "VARCHAR", "the capture window (traces/<window>)"),
            ("rank", "BIGINT", ""),
            ("kind", "VARCHAR", "gpu_kernels or cpu_ops"),
            ("name", "VARCHAR", ""),
            ("count", "BIGINT", ""),
            ("total_us", "DOUBLE", ""),
            ("mean_us", "DOUBLE", ""),
            ("min_us", "DOUBLE", ""),
            ("max_us", "DOUBLE", ""),
            ("share", "DOUBLE", "of the trace's kernel (or op) time"),
        ],
    ),
    "heartbeats": (
        "one row per rank's latest heartbeat (RUN_DIR/live)",
        [
            ("rank", "BIGINT", ""),
            ("host", "VARCHAR", ""),
            ("pid", "BIGINT", ""),
            ("attempt", "VARCHAR", "attempt token"),
            ("step", "BIGINT", "the step under way"),
            ("written_ns", "BIGINT", "when the heartbeat was written (epoch ns)"),
            ("moved_ns", "BIGINT", "when the rank last made progress"),
            ("median_step_s", "DOUBLE", ""),
            ("open_phases", "JSON", "the phases it was inside, outermost first"),
            ("stopped", "BOOLEAN", "its stop() ran: a clean end"),
            ("hang", "VARCHAR", "the stall folder while its watchdog sees a stall"),
        ],
    ),
    "hangs": (
        "one row per hang file a rank's watchdog wrote (RUN_DIR/hangs)",
        [
            ("stall", "VARCHAR", "the folder (step-NNNNNN-<attempt>)"),
            ("rank", "BIGINT", ""),
            ("host", "VARCHAR", ""),
            ("attempt", "VARCHAR", "attempt token"),
            ("step", "BIGINT", "the step that stalled"),
            ("detected_ns", "BIGINT", ""),
            ("threshold_s", "DOUBLE", ""),
            ("open_phases", "JSON", "the phases it was inside, outermost first"),
            ("thread", "VARCHAR", "the training thread's name"),
            ("frames", "JSON", "its innermost frames, outermost first"),
            ("ended_ns", "BIGINT", "when steps resumed; NULL if they never did"),
        ],
    ),
}


@dataclass(eq=False)
class RunDatabase:
    """A DuckDB connection holding a run's tables (see TABLES)."""

    con: Any
    skipped: list[str] = field(default_factory=list)
    confined: bool = False
    """Queries see the run's tables only: no file, no network, no extension (`confine`)."""

    def query(self, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """(column names, rows) of `sql`; a RankscopeError with DuckDB's complaint where it fails."""
        import duckdb

        try:
            result = self.con.execute(sql)
            rows = result.fetchall()
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            refused = isinstance(exc, duckdb.PermissionException) or "locked" in first
            why = f" ({CONFINED})" if self.confined and refused else ""
            raise RankscopeError(f"the query failed: {first}{why}") from None
        return [d[0] for d in result.description or []], rows

    def confine(self) -> None:
        """Leave queries the run's tables and nothing else: no file read or written
        (COPY, read_text, ATTACH), no extension installed or loaded, and a configuration
        no query can change back."""
        con = self.con
        # The timings view reads the JSONL files at each query, which the lock refuses;
        # allowing their paths instead would let `COPY ... TO` overwrite them. A table
        # of the same rows costs one read of the files, as one query over the view did.
        con.execute("CREATE TABLE _timings AS SELECT * FROM timings")
        con.execute("DROP VIEW timings")
        con.execute("ALTER TABLE _timings RENAME TO timings")
        con.execute("DROP TABLE _line_by_line")
        con.execute("DROP TABLE _fast_files")
        for setting in (
            "autoinstall_known_extensions = false",
            "autoload_known_extensions = false",
            "enable_external_access = false",
            "lock_configuration = true",  # last: a query could otherwise undo the others
        ):
            con.execute(f"SET {setting}")
        self.confined = True

    def export_parquet(self, folder: str | os.PathLike[str]) -> list[Path]:
        """Each table as FOLDER/<table>.parquet (written under a temporary name, then renamed)."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for table in TABLES:
            final = out / f"{table}.parquet"
            temp = out / f".{table}.parquet.tmp"
            literal = "'" + str(temp).replace("'", "''") + "'"
            self.con.execute(f"COPY (SELECT * FROM {table}) TO {literal} (FORMAT parquet)")
            os.replace(temp, final)
            written.append(final)
        return written


CONFINED = "queries see the run's tables only; rankscope sql --allow-files lifts this"
"""What a refused query is told, after DuckDB's own reason."""


def open_run_database(
    run_dir: str | os.PathLike[str],
    *,
    progress: Callable[[str, int, int], None] | None = None,
    workers: int | None = None,
    allow_files: bool = True,
) -> RunDatabase:
    """The run's tables (TABLES) in an in-memory DuckDB. A table whose files are absent is
    empty; a run directory that is none is a TraceError. `allow_files=False` confines
    the queries to these tables (`RunDatabase.confine`), as `rankscope sql` does."""
    root = run_root(run_dir)
    db = RunDatabase(connect(workers))
    _timings(db, root, workers)
    if progress is not None:
        progress("timings", 1, 1)
    _meta(db, root)
    _kernels(db, root, workers)
    _watch(db, root)
    if not allow_files:
        db.confine()
    return db


# -- timings -------------------------------------------------------------------


_PER_FILE = f"""WITH {lines_sql()}
SELECT filename,
    count(*) FILTER (WHERE NOT (known AND (record OR opens))) AS bad,
    count(DISTINCT attempt::VARCHAR) FILTER (WHERE known AND opens) AS opens,
    count(*) FILTER (WHERE known AND record) AS records,
    list(DISTINCT rank) FILTER (WHERE known) AS ranks
FROM lines GROUP BY filename"""


def _per_file(db: RunDatabase, files: list[Path]) -> list[tuple[Any, ...]]:
    """Per file, what DuckDB makes of its lines. Where DuckDB refuses the batch (a line
    past its object size), each file is asked alone: one it refuses is left out of the
    answer, and so read line by line, which says what is wrong with it."""
    try:
        rows: list[tuple[Any, ...]] = db.con.execute(
            _PER_FILE, {"files": [str(p) for p in files], "columns": COLUMNS}
        ).fetchall()
        return rows
    except Exception:  # DuckDB's errors (imported where a database is opened)
        if len(files) == 1:
            return []
    return [row for path in files for row in _per_file(db, [path])]


def _timings(db: RunDatabase, root: Path, workers: int | None) -> None:
    run = RunDir(root)
    found = {entry.path: entry.rank for entry in run.timings()}
    misnamed = run.misnamed_timings()
    db.skipped.extend(run.left_out)
    held: dict[Path, WholeFile | RankTimings | str] = {}
    slow: list[Path] = list(misnamed)
    if found:
        per_file = _per_file(db, sorted(found))
        seen = {
            Path(name): (bad, opens, records, ranks)
            for name, bad, opens, records, ranks in per_file
        }
        for path, rank in sorted(found.items()):
            bad, opens, records, ranks = seen.get(path, (1, 0, 0, []))
            marks = (
                verdict(path, rank, bad=bad, opens=opens, ranks=set(ranks or []))
                if records
                else None
            )
            if marks is None:
                slow.append(path)
            else:
                held[path] = WholeFile(rank, marks, records)
    held.update(zip(slow, read_line_by_line(slow, workers), strict=True))
    ranks = claim_ranks(held, db.skipped)
    _, of_rank = run_attempts(ranks)
    fast = [
        (str(p), int(of_rank[h.rank][0]) + 1)
        for p, h in held.items()
        if isinstance(h, WholeFile) and ranks.get(h.rank) is h
    ]
    db.con.execute("CREATE TABLE _fast_files (filename VARCHAR, attempt BIGINT)")
    if fast:
        db.con.executemany("INSERT INTO _fast_files VALUES (?, ?)", fast)
    columns = ", ".join(f"{name} {kind}" for name, kind, _ in TABLES["timings"][1])
    db.con.execute(f"CREATE TABLE _line_by_line ({columns})")
    slow_rows = [_rows_of(t, of_rank[t.rank]) for t in ranks.values() if isinstance(t, RankTimings)]
    for rows in slow_rows:
        db.con.register("_rows", rows)
        db.con.execute(
            "INSERT INTO _line_by_line SELECT * REPLACE "
            "(CASE WHEN isnan(gpu_ms) THEN NULL ELSE gpu_ms END AS gpu_ms, "
            "CASE WHEN coll < 0 THEN NULL ELSE coll END AS coll, "
            "CASE WHEN isnan(oncpu_ms) THEN NULL ELSE oncpu_ms END AS oncpu_ms, "
            "CASE WHEN isnan(runq_ms) THEN NULL ELSE runq_ms END AS runq_ms) FROM _rows"
        )
        db.con.unregister("_rows")
    if not fast:
        db.con.execute("CREATE VIEW timings AS SELECT * FROM _line_by_line")
        return
    files = "[" + ", ".join(_literal(name) for name, _ in fast) + "]"
    db.con.execute(
        f"""CREATE VIEW timings AS
        WITH {lines_sql(files, _literal_struct(COLUMNS))}
        SELECT lines.rank, step, phase->>'$' AS phase, kind->>'$' AS kind, start_ns, cpu_ms,
            gpu_ms, depth, error, coll, oncpu_ms, runq_ms, _fast_files.attempt, true AS used
        FROM lines JOIN _fast_files USING (filename)
        WHERE known AND record
        UNION ALL SELECT * FROM _line_by_line"""
    )


def _rows_of(timings: RankTimings, run_attempt: Any) -> dict[str, Any]:
    """A rank's records as columns for DuckDB, with the run's attempt and whether the
    analysis uses each (the latest attempt of its (step, phase))."""
    own = timings.attempt
    used = latest_rows(timings.step, timings.phase, own)[0] if len(timings.attempts) > 1 else None
    names = np.array(timings.names, dtype=object)
    kinds = np.array(timings.kinds, dtype=object)
    n = len(timings)
    return {
        "rank": np.full(n, timings.rank, np.int64),
        "step": timings.step,
        "phase": names[timings.phase] if n else np.zeros(0, object),
        "kind": kinds[timings.kind] if n else np.zeros(0, object),
        "start_ns": timings.start_ns,
        "cpu_ms": timings.cpu_ms,
        "gpu_ms": timings.gpu_ms,  # NaN: none; NULL in the table
        "depth": timings.depth,
        "error": timings.error,
        "coll": timings.coll.astype(np.int64),  # -1: none; NULL in the table
        "oncpu_ms": timings.oncpu_ms,  # NaN: none; NULL in the table
        "runq_ms": timings.runq_ms,  # NaN: none; NULL in the table
        "attempt": np.asarray(run_attempt, np.int64)[own] + 1,
        "used": np.ones(n, np.bool_) if used is None else used,
    }


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _literal_struct(columns: dict[str, str]) -> str:
    return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in columns.items()) + "}"


# -- the smaller files ---------------------------------------------------------


def _table(db: RunDatabase, name: str, rows: Sequence[Sequence[Any]]) -> None:
    """Create table `name` (its columns as TABLES says) holding `rows`."""
    spec = TABLES[name][1]
    columns = ", ".join(f'"{column}" {kind}' for column, kind, _ in spec)
    db.con.execute(f"CREATE TABLE {name} ({columns})")
    if rows:
        marks = ", ".join("?" for _ in spec)
        db.con.executemany(f"INSERT INTO {name} VALUES ({marks})", [list(r) for r in rows])


def _meta(db: RunDatabase, root: Path) -> None:
    meta = read_run_meta(root)
    db.skipped.extend(meta.skipped)
    rows = []
    for rank, data in sorted(meta.meta.items()):
        attempt = data.get("attempt")
        token = attempt.get("token") if isinstance(attempt, dict) else None
        rows.append(
            (
                rank,
                _int(data.get("world_size")),
                _str(data.get("host")),
                _int(data.get("pid")),
                _str(token),
                json.dumps(data),
            )
        )
    _table(db, "meta", rows)


def _kernels(db: RunDatabase, root: Path, workers: int | None) -> None:
    rows: list[tuple[Any, ...]] = []
    try:
        traces = find_traces([root], left_out=db.skipped)
    except TraceError:
        traces = []  # no traces: an empty table
    for _, summary in read_summaries(traces, db.skipped, workers=workers):
        for item in summary.get("items", []):
            rows.append(
                (
                    summary.get("window"),
                    summary.get("rank"),
                    summary.get("kind"),
                    item.get("name"),
                    item.get("count"),
                    item.get("total_us"),
                    item.get("mean_us"),
                    item.get("min_us"),
                    item.get("max_us"),
                    item.get("share"),
                )
            )
    _table(db, "kernels", rows)


def _watch(db: RunDatabase, root: Path) -> None:
    watch = read_watch(root)
    db.skipped.extend(watch.skipped)
    beats = [
        (
            b.rank,
            b.host,
            b.pid,
            b.attempt,
            b.step,
            b.written_ns,
            b.moved_ns,
            b.median_step_s,
            _phases(b.open),
            b.stopped,
            b.hang,
        )
        for _, b in sorted(watch.heartbeats.items())
    ]
    _table(db, "heartbeats", beats)
    hangs = [
        (
            h.stall,
            h.rank,
            h.host,
            h.attempt,
            h.step,
            h.detected_ns,
            h.threshold_s,
            _phases(h.open),
            h.thread,
            json.dumps(
                [{"file": f.file, "line": f.line, "function": f.function} for f in h.frames]
            ),
            h.ended_ns,
        )
        for h in watch.hangs
    ]
    _table(db, "hangs", hangs)


def _phases(phases: Sequence[Any]) -> str:
    return json.dumps(
        [
            {"phase": p.phase, "kind": p.kind, "since_ns": p.since_ns, "depth": p.depth}
            for p in phases
        ]
    )


def _int(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
    return value if ok else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None
