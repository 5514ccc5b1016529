"""`rankscope sql`: a run directory as DuckDB tables, checked against the readers.

Each table is compared with what the analysis's own readers make of the same files,
so a query sees what the figures saw: the records DuckDB reads whole, the records of
files read line by line (a bad line, a restart), attempts and which records are used.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

pytest.importorskip("duckdb")  # the analysis extra's: a GPU host's runtime may lack it

import duckdb
import numpy as np

from rankscope._errors import RankscopeError
from rankscope.analysis import read_timings
from rankscope.analysis._sql import TABLES, open_run_database
from rankscope.cli import main
from rankscope.testing._synthetic import Slowdown, write_timings
from rankscope.testing._synthetic_traces import write_run_traces

from .test_attempts import _attempt_lines, _write
from .test_hang_analysis import data_stuck_run


def _run(root: Path, gpu: bool = False) -> Path:
    write_timings(root, ranks=4, steps=12, gpu=gpu, slowdowns=[Slowdown(1, "forward", 0.5)])
    return root


def _by_rank_phase(root: Path) -> dict[tuple[int, str], tuple[int, float]]:
    """(records, summed cpu_ms) per (rank, phase), from the line-by-line reader."""
    out = {}
    for rank, t in read_timings(root).ranks.items():
        for index, name in enumerate(t.names):
            mine = t.phase == index
            out[(rank, name)] = (int(mine.sum()), float(t.cpu_ms[mine].sum()))
    return out


def test_the_timings_table_holds_every_record_as_the_reader_reads_it(tmp_path: Path) -> None:
    root = _run(tmp_path, gpu=True)
    db = open_run_database(root)
    _, rows = db.query(
        "select rank, phase, count(*), sum(cpu_ms), bool_and(used), max(attempt) "
        "from timings group by all"
    )
    want = _by_rank_phase(root)
    got = {(r, p): (n, s) for r, p, n, s, _, _ in rows}
    assert got.keys() == want.keys()
    for key, (n, total) in want.items():
        assert got[key][0] == n and got[key][1] == pytest.approx(total, rel=1e-12)
    assert all(used and attempt == 1 for *_, used, attempt in rows)
    _, nulls = db.query("select count(*) from timings where gpu_ms is null")
    assert nulls == [(0,)]  # gpu=True: every record has device time
    assert db.skipped == []


def test_a_file_with_a_bad_line_keeps_its_other_records_and_names_the_line(
    tmp_path: Path,
) -> None:
    root = _run(tmp_path)
    path = root / "timings" / "rank-00002.jsonl"
    lines = path.read_text().splitlines()
    lines[4] = lines[4].replace('"step":', '"step":1.5,"x":')  # a step that is no integer
    path.write_text("\n".join(lines) + "\n")
    db = open_run_database(root)
    want = _by_rank_phase(root)  # the reader leaves the line out
    _, rows = db.query("select rank, phase, count(*) from timings group by all")
    assert {(r, p): n for r, p, n in rows} == {k: n for k, (n, _) in want.items()}
    _, (count,) = db.query("select count(*) from timings where rank = 2")
    assert count[0] == sum(n for (r, _), (n, _) in want.items() if r == 2) == 12 * 6 - 1
    assert db.skipped == [f"{path}:5: step, start_ns and depth must be integers >= 0"]


def test_collectives_and_time_on_cpu_read_alike_whole_and_line_by_line(tmp_path: Path) -> None:
    # rank 0's file is read whole; rank 1's has a bad line, so it is read line by line.
    record = (
        '{{"v":1,"rank":{rank},"step":{step},"phase":"{phase}","kind":"compute",'
        '"start_ns":{start},"cpu_ms":1.0,"gpu_ms":null,"depth":0,"error":false{coll}}}'
    )
    counts = {
        "forward": ',"coll":0,"oncpu_ms":0.5,"runq_ms":0.25',
        "backward": ',"coll":3',
        "optimizer": "",
    }
    (tmp_path / "timings").mkdir()
    for rank in range(2):
        lines = [
            record.format(rank=rank, step=step, phase=phase, start=1000 * step + i, coll=coll)
            for step in range(3)
            for i, (phase, coll) in enumerate(counts.items())
        ]
        if rank == 1:
            lines.insert(1, "not json")
        (tmp_path / "timings" / f"rank-{rank:05d}.jsonl").write_text("\n".join(lines) + "\n")
    db = open_run_database(tmp_path)
    _, rows = db.query(
        "select rank, phase, min(coll), max(coll), max(oncpu_ms), max(runq_ms) from timings "
        "group by all"
    )
    got = {(r, p): tuple(rest) for r, p, *rest in rows}
    for rank in range(2):
        assert got[rank, "forward"] == (0, 0, 0.5, 0.25)
        assert got[rank, "backward"] == (3, 3, None, None)
        assert got[rank, "optimizer"] == (None, None, None, None)  # the record does not say
    assert len(db.skipped) == 1


def test_a_restart_numbers_its_attempts_and_marks_the_records_the_analysis_uses(
    tmp_path: Path,
) -> None:
    for rank in range(2):  # attempt 1 ran steps 0-5; attempt 2 resumed at 4 and ran 4-9
        lines = _attempt_lines(rank, f"a{rank}", range(6), 10.0)
        _write(tmp_path, rank, lines + _attempt_lines(rank, f"b{rank}", range(4, 10), 20.0))
    db = open_run_database(tmp_path)
    _, rows = db.query(
        "select attempt, used, min(step), max(step), count(distinct rank) "
        "from timings where phase = 'forward' group by all order by all"
    )
    # steps 4 and 5 ran in both: the second attempt's records are the ones used
    assert rows == [(1, False, 4, 5, 2), (1, True, 0, 3, 2), (2, True, 4, 9, 2)]
    timings = read_timings(tmp_path)
    _, (kept,) = db.query("select count(*) from timings where used")
    assert kept[0] == sum(len(t) for t in timings.ranks.values())


def test_meta_kernels_heartbeats_and_hangs_are_tables(tmp_path: Path) -> None:
    data_stuck_run(tmp_path, dead=True)  # meta, heartbeats and hang files of 4 ranks
    write_run_traces(tmp_path, "step-000003-000004", [0, 1], world_size=4)
    db = open_run_database(tmp_path)
    _, meta = db.query("select rank, world_size, meta->>'$.host' from meta order by rank")
    assert [(r, w) for r, w, _ in meta] == [(r, 4) for r in range(4)]
    _, beats = db.query(
        "select rank, json_array_length(open_phases), hang is not null from heartbeats "
        "order by rank"
    )
    assert beats == [(0, 2, True), (1, 2, True), (2, 1, True), (3, 2, True)]
    _, stuck = db.query("select rank from hangs where open_phases->>'$[0].phase' = 'data_loading'")
    assert stuck == [(2,)]
    _, kernels = db.query(
        "select rank, count(*), sum(share) from kernels "
        "where window_name = 'step-000003-000004' group by rank order by rank"
    )
    assert [r for r, _, _ in kernels] == [0, 1]
    assert all(n > 0 and 0 < share <= 1.0 + 1e-9 for _, n, share in kernels)


def test_a_query_that_fails_says_duckdbs_reason(tmp_path: Path) -> None:
    db = open_run_database(_run(tmp_path))
    with pytest.raises(RankscopeError, match=r"the query failed: Catalog Error: .*nope"):
        db.query("select * from nope")


def test_the_cli_prints_json_csv_and_the_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _run(tmp_path)
    query = "select rank, median(cpu_ms) as ms from timings where phase = 'forward' group by rank order by rank"
    assert main(["sql", str(root), query, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in rows] == [0, 1, 2, 3]
    slow = max(rows, key=lambda r: r["ms"])
    assert slow["rank"] == 1  # the rank write_timings slowed down
    assert main(["sql", str(root), query, "--csv"]) == 0
    table = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert table[0] == ["rank", "ms"] and len(table) == 5
    assert float(table[2][1]) == pytest.approx(slow["ms"])
    assert main(["sql", str(root), "--schema"]) == 0
    schema = capsys.readouterr().out
    for name, (_, columns) in TABLES.items():
        assert name in schema
        assert all(column in schema for column, _, _ in columns)


def test_the_cli_says_a_bad_query_in_one_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _run(tmp_path)
    assert main(["sql", str(root), "selec 1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "syntax error" in err and "Traceback" not in err


def test_json_output_is_strict_where_a_value_is_not_a_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _run(tmp_path)
    assert main(["sql", str(root), "select 'nan'::double as x, 1::hugeint as y", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"x": None, "y": 1}]


def _escapes(tmp_path: Path) -> dict[str, tuple[str, Path | None]]:
    """What a query must not do by default: (its SQL, the file it would make or read)."""
    secret = tmp_path / "secret.txt"
    secret.write_text("the password\n")
    written, attached = tmp_path / "written.csv", tmp_path / "made.duckdb"
    return {
        "copy to": (f"COPY (select 1 as one) TO '{written}'", written),
        "read_text": (f"select content from read_text('{secret}')", None),
        "attach": (f"ATTACH '{attached}' AS made", attached),
        "install": ("INSTALL httpfs", None),
        "unlock": ("SET enable_external_access = true", None),
    }


@pytest.mark.parametrize("escape", ["copy to", "read_text", "attach", "install", "unlock"])
def test_a_confined_database_refuses_what_reaches_past_the_run(tmp_path: Path, escape: str) -> None:
    sql, made = _escapes(tmp_path)[escape]
    db = open_run_database(_run(tmp_path / "run"), allow_files=False)
    with pytest.raises(RankscopeError, match=r"the query failed: .*tables only") as caught:
        db.query(sql)
    assert "the password" not in str(caught.value)
    assert made is None or not made.exists()


def test_a_confined_database_still_answers_from_every_table(tmp_path: Path) -> None:
    root = data_stuck_run(_run(tmp_path), dead=True)
    query = (
        "select rank, phase, count(*), sum(cpu_ms), bool_and(used) from timings "
        "group by all order by all"
    )
    _, free = open_run_database(root).query(query)
    db = open_run_database(root, allow_files=False)
    _, rows = db.query(query)
    assert rows == free and len(rows) == 4 * 6
    _, meta = db.query("select count(*), min(meta->>'$.host') from meta")
    assert meta[0][0] == 4 and meta[0][1]
    _, stuck = db.query("select rank from hangs where open_phases->>'$[0].phase' = 'data_loading'")
    assert stuck == [(2,)]
    _, names = db.query("select table_name from duckdb_tables() order by 1")
    assert [n for (n,) in names] == sorted(TABLES)  # the run's tables, no helper left


@pytest.mark.parametrize("escape", ["copy to", "read_text", "attach", "install", "unlock"])
def test_the_cli_refuses_each_escape_in_one_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], escape: str
) -> None:
    sql, made = _escapes(tmp_path)[escape]
    root = _run(tmp_path / "run")
    assert main(["sql", str(root), sql]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err and "the password" not in err
    (line,) = err.strip().splitlines()
    assert line.startswith("rankscope sql: the query failed: ")
    assert line.endswith(
        "(queries see the run's tables only; rankscope sql --allow-files lifts this)"
    )
    assert made is None or not made.exists()


def test_allow_files_lets_copy_to_write_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _run(tmp_path / "run")
    out = tmp_path / "forward.csv"
    query = f"COPY (select rank, cpu_ms from timings where phase = 'forward') TO '{out}'"
    assert main(["sql", str(root), "--allow-files", query]) == 0, capsys.readouterr().err
    assert len(out.read_text().splitlines()) == 1 + 4 * 12  # a header, then every record


def test_export_writes_parquet_that_reads_back(tmp_path: Path) -> None:
    root = _run(tmp_path / "run")
    out = tmp_path / "kept"
    assert main(["export", str(root), "--parquet", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{t}.parquet" for t in TABLES)
    con = duckdb.connect()
    (n,) = con.execute(f"select count(*) from '{out / 'timings.parquet'}'").fetchone() or (0,)
    assert n == sum(len(t) for t in read_timings(root).ranks.values())
    ms = con.execute(f"select cpu_ms from '{out / 'timings.parquet'}' order by all").fetchnumpy()
    want = np.sort(np.concatenate([t.cpu_ms for t in read_timings(root).ranks.values()]))
    assert np.array_equal(ms["cpu_ms"], want)


def _documented(command: str) -> list[list[str]]:
    """Every `rankscope COMMAND ...` line of the README and docs/, as argv."""
    import shlex

    repo = Path(__file__).resolve().parents[2]
    out = []
    for page in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]:
        for line in page.read_text(encoding="utf-8").splitlines():
            words = line.strip().strip("`").split("#")[0]
            if words.startswith(f"rankscope {command} "):
                out.append(shlex.split(words)[1:])
    return out


def test_every_documented_order_of_options_parses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The docs put --csv between RUN_DIR and QUERY; argparse alone stops filling the
    # positionals at the first option and called the query an unrecognized argument.
    root = _run(tmp_path / "run")
    forms = _documented("sql")
    assert any(argv.index("--csv") < len(argv) - 1 for argv in forms if "--csv" in argv)
    for argv in forms:
        code = main([str(root) if word == "runs/exp1" else word for word in argv])
        out, err = capsys.readouterr()
        assert code == 0, (argv, err)
        if "--csv" in argv:
            assert out.splitlines()[0] in ("step,cpu_ms", "rank,step,cpu_ms"), out
    query = "select rank from timings where step = 0 and phase = 'forward' order by rank"
    for argv in (
        ["sql", str(root), "--csv", query],
        ["sql", "--csv", str(root), query],
        ["sql", str(root), query, "--csv"],
    ):
        assert main(argv) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.split() == ["rank", "0", "1", "2", "3"]


def test_the_terminal_table_rounds_floats_and_json_and_csv_keep_them_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _run(tmp_path)
    query = (
        "select 2.1652899999999997::double as ms, 12345.678::double as big, "
        "0.000012346::double as tiny, 5::double as whole, 'nan'::double as nan, 7 as n, "
        "null::double as missing"
    )
    assert main(["sql", str(root), query]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].replace("│", " ").split() == [
        "2.165",
        "12346",
        "1.235e-05",
        "5",
        "nan",
        "7",
        "-",  # NULL, as every terminal table spells a missing value (core/_format.py)
    ], out
    assert "2.16528" not in out
    assert main(["sql", str(root), query, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["ms"] == 2.1652899999999997 and row["big"] == 12345.678
    assert main(["sql", str(root), "--csv", query]) == 0
    assert "2.1652899999999997,12345.678" in capsys.readouterr().out
