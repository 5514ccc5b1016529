"""The SQL that reads timings files in DuckDB, shared by the engine (read/_engine.py), the
restart reader (read/_restarts.py) and `rankscope sql` (analysis/_sql.py)."""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from ..._errors import TraceError
from ._rank_timings import MAX_MS

__all__ = ["COLUMNS", "connect", "lines_sql", "name_of"]


def connect(threads: int | None = None) -> Any:
    """A DuckDB connection of its own (in memory), or a TraceError saying how to get DuckDB."""
    try:
        import duckdb
    except ImportError:
        raise TraceError(
            "reading timings needs DuckDB: pip install 'rankscope[analysis]'"
        ) from None
    con = duckdb.connect(":memory:")
    con.execute(f"SET threads = {max(1, threads or os.cpu_count() or 1)}")
    con.execute("SET preserve_insertion_order = false")
    con.execute("SET enable_progress_bar = false")
    return con


# Values are read as JSON, which keeps each one's text, and the text is checked before
# it is cast: DuckDB's own casts would turn 1.5 into the step 2, true into 1 and "5" into
# 5 without a word. (JSON text that starts with a digit is a number >= 0; digits alone,
# an integer; a leading quote, a string.)
COLUMNS = {
    "v": "JSON",
    "rank": "JSON",
    "step": "JSON",
    "phase": "JSON",
    "kind": "JSON",
    "start_ns": "JSON",
    "cpu_ms": "JSON",
    "gpu_ms": "JSON",
    "depth": "JSON",
    "error": "JSON",
    "attempt": "JSON",
    "coll": "JSON",
    "oncpu_ms": "JSON",
    "runq_ms": "JSON",
}
_INT = ("rank", "step", "start_ns", "depth")
_FLOAT = ("cpu_ms", "gpu_ms")
_CAST = ",\n        ".join(
    [f"try_cast(CAST({key} AS VARCHAR) AS BIGINT) AS {key}" for key in _INT]
    + [
        f"left(CAST({key} AS VARCHAR), 1) BETWEEN '0' AND '9' AS {key}_number, "
        f"try_cast(CAST({key} AS VARCHAR) AS DOUBLE) AS {key}"
        for key in _FLOAT
    ]
    # The cast to BIGINT refuses strings, true and null, but takes 1.5 (as 2) and 1e3: the
    # integers' texts, together, must hold no fraction and no exponent (one test for four).
    + ["concat(" + ", ".join(f"CAST({key} AS VARCHAR)" for key in _INT) + ") AS whole_text"]
    # The collectives a phase issued: digits alone, or no count (as the line-by-line reader).
    + [
        "CASE WHEN regexp_full_match(CAST(coll AS VARCHAR), '0|[1-9][0-9]{0,17}') "
        "THEN CAST(CAST(coll AS VARCHAR) AS BIGINT) END AS coll"
    ]
    # The thread's CPU time and its wait for a CPU in the phase: a finite time >= 0, or none.
    + [
        f"CASE WHEN left(CAST({c} AS VARCHAR), 1) BETWEEN '0' AND '9' "
        f"AND isfinite(try_cast(CAST({c} AS VARCHAR) AS DOUBLE)) "
        f"THEN try_cast(CAST({c} AS VARCHAR) AS DOUBLE) END AS {c}"
        for c in ("oncpu_ms", "runq_ms")
    ]
)
_STRING = "left(CAST({0} AS VARCHAR), 1) = '\"'"
# A record the fast path reads as the line-by-line reader does. The timer writes every
# key; a record without depth, or with gpu_ms anything but a time or null, is left to
# that reader, and so is any value this check is unsure of (it only costs time).
_RECORD = " AND ".join(
    [
        "step >= 0 AND start_ns >= 0 AND depth >= 0",
        f"{_STRING.format('phase')} AND {_STRING.format('kind')}",
        f"cpu_ms_number AND isfinite(cpu_ms) AND cpu_ms >= 0 AND cpu_ms <= {MAX_MS}",
        "(gpu_ms_number IS NULL OR (gpu_ms_number AND isfinite(gpu_ms) AND gpu_ms >= 0 "
        f"AND gpu_ms <= {MAX_MS}))",
    ]
)
_WHOLE = (
    "NOT contains(whole_text, '.') AND NOT contains(whole_text, 'e') "
    "AND NOT contains(whole_text, 'E')"
)


def lines_sql(files: str = "$files", columns: str = "$columns", extra: str = "") -> str:
    """The `values` and `lines` of a WITH clause over the timings files `files` (a SQL
    list, or a parameter): one row per line, its values cast, and whether it is a
    record (`known AND record`), an attempt line (`known AND opens`) or neither (a line
    the fast path cannot take). Each flag is true or false, never NULL. `extra`: more
    columns of `columns` to pass through as read (", meta")."""
    return f"""values AS (
    SELECT filename, phase, kind, v, error, attempt{extra},
        {_CAST}
    FROM read_json({files}, format = 'newline_delimited', ignore_errors = true,
                   filename = true, columns = {columns})
), lines AS (
    SELECT filename, phase, kind, rank, step, start_ns, cpu_ms, gpu_ms, depth, coll, oncpu_ms,
        runq_ms, attempt{extra},
        coalesce((v IS NULL OR CAST(v AS VARCHAR) = '1') AND rank >= 0 AND {_WHOLE}, false)
            AS known,
        coalesce({_RECORD}, false) AS record,
        coalesce(step IS NULL AND phase IS NULL AND {_STRING.format("attempt")}, false)
            AS opens,
        coalesce(CAST(error AS VARCHAR) = 'true', false) AS error
    FROM values
)"""


def name_of(raw: Any) -> str | None:
    """A phase or kind name from the JSON text DuckDB hands back; None where it is none."""
    return _decoded(raw) if isinstance(raw, str) else None


@functools.lru_cache(maxsize=4096)
def _decoded(raw: str) -> str | None:
    """A run has few names: each text is decoded once."""
    try:
        name = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return name if isinstance(name, str) else None
