from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

import pytest

from .._helpers import run_cli

pytestmark = pytest.mark.slow


# -- the analysis commands ------------------------------------------------------------


def _straggler_run(root: Path) -> Path:
    from rankscope.testing._synthetic import Slowdown, write_timings
    from rankscope.testing._synthetic_traces import write_run_traces

    write_timings(root, ranks=4, steps=20, slowdowns=[Slowdown(2, "forward", 0.41)])
    write_run_traces(root, "step-000003-000004", [0, 2], world_size=4, size_bytes=60_000)
    return root


def test_stragglers_names_the_rank_in_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _straggler_run(tmp_path)
    code, out, err = run_cli(["stragglers", str(run)], capsys)
    assert code == 0, err
    assert "rank 2 is slow in forward" in out and "ranks 0, 1, 3 wait for it in backward" in out
    code, out, _ = run_cli(["stragglers", str(run), "--json"], capsys)
    data = json.loads(out)
    assert {(f["rank"], f["role"]) for f in data["findings"]} == {
        (2, "slow"),
        (0, "waits"),
        (1, "waits"),
        (3, "waits"),
    }
    assert len(data["findings"][0]["ratios"]) == 20  # the ratio at every sampled step
    assert len(data["table"]) == 4 * 5


def test_kernels_prints_the_top_kernels_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _straggler_run(tmp_path)
    code, out, err = run_cli(["kernels", str(run), "--top", "3"], capsys)
    assert code == 0, err
    assert "GPU kernels: " in out and "in 2 trace(s)" in out
    assert "more (--top N, or --json)" in out
    code, out, _ = run_cli(["kernels", str(run), "--by", "category", "--json"], capsys)
    (table,) = json.loads(out)["tables"]
    assert {i["name"] for i in table["items"]} == {"computation", "communication", "memcpy"}


def test_report_writes_html_and_prints_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _straggler_run(tmp_path)
    code, out, err = run_cli(["report", str(run)], capsys)
    assert code == 0, err
    assert "ranks: 4 of 4" in out and "rank 2 is slow in forward" in out
    assert "Top GPU kernels, window step-000003-000004" in out
    html = run / "report.html"
    assert html.is_file() and str(html) in out
    code, out, _ = run_cli(
        ["report", str(run), "--json", "--no-html", "--threshold", "1.5"], capsys
    )
    data = json.loads(out)
    assert data["stragglers"]["threshold"] == 1.5 and data["stragglers"]["summary"] == []
    assert "html" not in data


@pytest.mark.parametrize("where", ["missing folder", "under a file", "a folder at the name"])
@pytest.mark.parametrize("as_json", [False, True])
def test_an_unwritable_report_still_prints_the_answer_and_says_the_page_failed_after_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, as_json: bool
) -> None:
    """A page that cannot be written (`-o` into no folder, a read-only run directory: as
    root, a folder where the page goes stands in for it) costs the page, not the answer."""
    run = _straggler_run(tmp_path / "run")
    (tmp_path / "file").write_text("x")
    target = {
        "missing folder": tmp_path / "no" / "such" / "report.html",
        "under a file": tmp_path / "file" / "report.html",
        "a folder at the name": run / "report.html",
    }[where]
    if where == "a folder at the name":
        target.mkdir()
    before = sorted(p.name for p in run.iterdir())
    argv = ["report", str(run), "-o", str(target), *(["--json"] if as_json else [])]
    code, out, err = run_cli(argv, capsys)
    assert code == 1, err
    if as_json:
        data = json.loads(out)  # the whole answer, as without the page
        assert data["stragglers"]["summary"] and "html" not in data
        assert data["html_error"].startswith(f"{target}: ")
    else:
        assert "rank 2 is slow in forward" in out and "HTML report:" not in out
    (line,) = err.strip().splitlines()
    assert line.startswith(f"rankscope report: the HTML report was not written ({target}: ")
    assert "Traceback" not in err
    assert sorted(p.name for p in run.iterdir()) == before  # no temporary left behind


def test_an_unwritable_report_says_so_after_the_answer_on_one_terminal(tmp_path: Path) -> None:
    """stdout and stderr on one terminal: the page's failure is the last line, not the first."""
    import subprocess

    run = _straggler_run(tmp_path)
    target = tmp_path / "missing" / "report.html"
    command = [sys.executable, "-m", "rankscope.cli", "report", str(run), "-o", str(target)]
    done = subprocess.run(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120, check=False
    )
    lines = done.stdout.decode().strip().splitlines()
    assert done.returncode == 1
    assert any("rank 2 is slow in forward" in line for line in lines)
    assert lines[-1].startswith("rankscope report: the HTML report was not written")


def test_report_of_a_run_that_hung_says_who_is_stuck(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ..analysis.test_hang_analysis import data_stuck_run

    run = data_stuck_run(_straggler_run(tmp_path), dead=True)
    code, out, err = run_cli(["report", str(run), "--no-html"], capsys)
    assert code == 0, err
    assert "Hangs" in out
    assert "hung: rank 2 has been stuck in data_loading (data) at step 120" in out
    assert "stuck rank 2 on node000, step 120: data_loading" in out
    assert "rank 2 is slow in forward" in out  # the stragglers are still there


def _truncated_gz(path: Path) -> Path:
    path.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X"}]}')[:-9])
    return path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["stragglers", "{tmp}/absent"], "{tmp}/absent: no such directory"),
        (["stragglers", "{tmp}"], "no timings"),
        (["report", "{tmp}"], "nothing to report"),
        (["kernels", "{tmp}/absent.json.gz"], "absent.json.gz: no such file or directory"),
        (["kernels", "{tmp}/empty"], "empty: no trace files"),
        (["kernels", "{tmp}"], "no readable trace"),
        (["kernels", "{tmp}/cut.json.gz"], "cut.json.gz: truncated or corrupt gzip"),
        (["kernels", "{tmp}/notjson.json"], "notjson.json: not valid JSON"),
        (["kernels", "{tmp}/nottrace.json"], "nottrace.json: not a trace"),
        (["kernels", "{tmp}/numbers.json"], "numbers.json: not a trace (event 1 is a number"),
        (["kernels", "{tmp}", "--top", "0"], "--top: expected a number >= 1"),
        (["stragglers", "{tmp}", "--threshold", "abc"], "--threshold: invalid float value"),
        (["merge", "{tmp}/absent.json", "-o", "{tmp}/out.json"], "absent.json"),
        (["hang", "{tmp}"], "{tmp}: no heartbeats (live/) or hang files (hangs/) to read"),
        (["hang", "{tmp}/absent", "--json"], "{tmp}/absent: no such directory"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "notjson.json").write_text("{nope")
    (tmp_path / "nottrace.json").write_text('{"hello": 1}')
    (tmp_path / "numbers.json").write_text("[1, 2]")
    _truncated_gz(tmp_path / "cut.json.gz")
    argv = [a.format(tmp=tmp_path) for a in argv]
    code, out, err = run_cli(argv, capsys)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert message.format(tmp=tmp_path) in err
    assert "Traceback" not in err


def test_partial_input_is_read_and_what_was_skipped_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rankscope.testing._synthetic import Slowdown, write_timings

    write_timings(
        tmp_path,
        ranks=5,
        steps=20,
        slowdowns=[Slowdown(1, "forward", 0.5)],
        only_ranks=[0, 1, 2, 3],
    )
    timings = tmp_path / "timings"
    with open(timings / "rank-00002.jsonl", "r+") as fh:  # a bad line in the middle
        lines = fh.readlines()
        fh.seek(0)
        fh.writelines([*lines[:10], "not json\n", *lines[10:]])
    (timings / "rank-3.jsonl").write_text(
        (timings / "rank-00003.jsonl").read_text()
    )  # rank 3 twice
    code, out, err = run_cli(["stragglers", str(tmp_path)], capsys)
    assert code == 0, err
    assert "rank 1 is slow in forward" in out
    assert "rank-00002.jsonl:11: not valid JSON" in out
    assert "rank 3 is claimed by 2 files" in out
    # Rank 3 started (its meta file is there); rank 4 wrote nothing here at all.
    assert "rank 3: no timings (of a world of 5)" in out
    assert "rank 4: no timings (of a world of 5); no meta file either" in out


def test_without_rich_the_cli_names_the_extra_and_json_still_works(tmp_path: Path) -> None:
    import subprocess
    import sys
    import textwrap

    run = _straggler_run(tmp_path)
    code = textwrap.dedent(
        f"""
        import sys
        class _NoRich:
            def find_spec(self, name, path=None, target=None):
                if name == "rich" or name.startswith("rich."):
                    raise ImportError(f"No module named {{name!r}}")
        sys.meta_path.insert(0, _NoRich())
        from rankscope.cli import main
        print("json:", main(["kernels", {str(run)!r}, "--json"]))
        print("terminal:", main(["kernels", {str(run)!r}]))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert "json: 0" in done.stdout and "terminal: 2" in done.stdout
    assert (
        "rankscope kernels: needs rich, not installed: pip install 'rankscope[cli]'" in done.stderr
    )


def test_a_reader_that_goes_away_stops_the_command_quietly(tmp_path: Path) -> None:
    """`rankscope report RUN --json | head -c 10`: no traceback, no error line."""
    import subprocess
    import sys

    from rankscope.testing._synthetic import write_timings

    write_timings(tmp_path, ranks=32, steps=200)
    command = [sys.executable, "-m", "rankscope.cli", "report", str(tmp_path), "--json"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        head = proc.stdout.read(10)
        proc.stdout.close()  # the reader goes away with most of the report unread
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
    assert head.startswith(b"{")
    assert (code, err) == (0, "")  # the reader had what it wanted: nothing failed


_PIPED = [
    ["stragglers", "{run}"],
    ["stragglers", "{run}", "--json"],
    ["report", "{run}", "--no-html"],
    ["report", "{run}", "--json", "--no-html"],
    ["sql", "{run}", "select * from timings limit 500"],
    ["sql", "{run}", "--csv", "select * from timings"],
    ["sql", "--schema", "{run}"],
    ["hang", "{run}"],
    ["top", "{run}", "--once"],
    ["kernels", "{run}"],
    ["hosts", "{run}"],
    ["trigger", "--status", "{run}"],
    ["stragglers", "--help"],
    [],
]


@pytest.fixture(scope="module")
def piped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ..analysis.test_hang_analysis import data_stuck_run

    return data_stuck_run(_straggler_run(tmp_path_factory.mktemp("piped")), dead=True)


@pytest.mark.parametrize(
    "argv", _PIPED, ids=lambda a: " ".join(x for x in a if x != "{run}") or "alone"
)
def test_a_pipe_closed_before_the_first_line_ends_every_command_quietly(
    piped_run: Path, argv: list[str]
) -> None:
    """`rankscope ... | head -1` where head is gone before the command writes: exit 0, and
    nothing on stderr (rich alone would exit 1, the interpreter's last flush 120)."""
    import os
    import subprocess

    read, write = os.pipe()
    os.close(read)  # the reader is gone: every write and the last flush meet EPIPE
    command = [sys.executable, "-m", "rankscope.cli", *(a.format(run=piped_run) for a in argv)]
    try:
        done = subprocess.run(
            command, stdout=write, stderr=subprocess.PIPE, timeout=120, check=False
        )
    finally:
        os.close(write)
    err = done.stderr.decode()
    assert (done.returncode, err) == (0, ""), err


def test_head_1_reads_one_line_and_the_pipeline_exits_0(piped_run: Path) -> None:
    """The shell's own `| head -1`, with pipefail so the command's exit code counts."""
    import shlex
    import subprocess

    command = f"{shlex.quote(sys.executable)} -m rankscope.cli stragglers {piped_run} | head -1"
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert len(done.stdout.splitlines()) == 1


# -- the command line itself ---------------------------------------------------------


def _command_names() -> list[str]:
    from rankscope.cli._main import _parser

    return list(_parser()._commands().choices)


@pytest.mark.parametrize("argv", [[], ["-v"]])
def test_rankscope_alone_lists_every_command_on_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, out, err = run_cli(argv, capsys)
    assert (code, err) == (0, "")
    names = _command_names()
    assert {"demo", "report", "stragglers", "kernels", "merge", "trigger"} <= set(names)
    rows = [line.split(maxsplit=1) for line in out.splitlines() if line.startswith("  ")]
    assert [row[0] for row in rows] == names  # each command once, in the order of --help
    assert all(len(row) == 2 and row[1] for row in rows)  # each with what it does
    assert re.search(r"stragglers +which rank is slow in which phase, and who waits for it", out)
    assert out.startswith("usage: rankscope COMMAND") and "rankscope COMMAND --help" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["stragler", "runs/x"],
            "rankscope: unknown command 'stragler'; did you mean 'stragglers'?",
        ),
        (["repot"], "rankscope: unknown command 'repot'; did you mean 'report'?"),
        (["kernel", "--top", "3"], "rankscope: unknown command 'kernel'; did you mean 'kernels'?"),
        (["-v", "Merge"], "rankscope: unknown command 'Merge'; did you mean 'merge'?"),
        (["xyzzy"], "rankscope: unknown command 'xyzzy'; the commands are demo, report, "),
    ],
)
def test_a_misspelled_command_is_one_line_with_did_you_mean(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run_cli(argv, capsys)
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(message), err
    assert "Traceback" not in err and "invalid choice" not in err


def test_the_installed_command_exits_0_alone_and_2_misspelled() -> None:
    """The exit codes a shell sees, through `python -m rankscope.cli` as the script runs it."""
    import subprocess
    import sys

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "rankscope.cli", *argv]
        return subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)

    alone = run()
    assert (alone.returncode, alone.stderr) == (0, "")
    assert "  stragglers  " in alone.stdout
    wrong = run("stragler")
    assert (wrong.returncode, wrong.stdout) == (2, "")
    assert wrong.stderr == "rankscope: unknown command 'stragler'; did you mean 'stragglers'?\n"


@pytest.mark.parametrize("msgspec_present", [True, False])
def test_json_is_strict_with_msgspec_and_without(
    msgspec_present: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rankscope.cli._output import print_json

    if not msgspec_present:
        monkeypatch.setitem(sys.modules, "msgspec", None)  # import msgspec now fails
    print_json({"a": float("nan"), "b": (1.5, float("inf")), 3: ["x", None, True]})
    assert capsys.readouterr().out == '{"a":null,"b":[1.5,null],"3":["x",null,true]}\n'


# -- a folder that holds runs, and names that are not UTF-8 ------------------------------


@pytest.fixture
def folder_of_runs(tmp_path: Path) -> Path:
    """runs/ holding two runs, a and b, each with timings, heartbeats and a window."""
    from rankscope.testing._synthetic import write_timings
    from rankscope.testing._synthetic_traces import write_run_traces

    runs = tmp_path / "runs"
    for name in ("a", "b"):
        write_timings(runs / name, ranks=2, steps=10)
        write_run_traces(runs / name, "step-000003-000004", [0, 1], world_size=2, size_bytes=20_000)
    return runs


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "{runs}"],
        ["report", "{runs}", "--json"],
        ["stragglers", "{runs}"],
        ["stragglers", "{runs}", "--json"],
        ["hang", "{runs}"],
        ["top", "--once", "{runs}"],
        ["top", "{runs}", "--json"],
        ["sql", "{runs}", "select count(*) from timings"],
        ["export", "{runs}", "--parquet", "{runs}/../parquet"],
        ["hosts", "{runs}"],
        ["diff", "{runs}", "{runs}/a"],
        ["diff", "{runs}/a", "{runs}", "--json"],
        ["trigger", "--status", "{runs}"],
        ["trigger", "{runs}"],
        ["collectives", "{runs}"],
    ],
)
def test_a_folder_of_runs_is_said_as_such_by_every_command(
    folder_of_runs: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    runs = folder_of_runs
    code, out, err = run_cli([a.format(runs=runs) for a in argv], capsys)
    assert (code, out) == (2, ""), (out, err)
    assert len(err.strip().splitlines()) == 1, err
    said = f"{runs}: a folder holding 2 runs (a, b), not a run; give one of them, e.g. {runs / 'a'}"
    assert said in err
    # nothing written into it: no report of the two runs added together, no trigger
    assert sorted(p.name for p in runs.iterdir()) == ["a", "b"]


def test_one_run_of_the_folder_is_read_alone(
    folder_of_runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["report", str(folder_of_runs / "a"), "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    (window,) = report["kernels"]["windows"]
    assert window["ranks"] == [0, 1]  # the run's own two traces, not the folder's four
    assert report["ranks"]["present"] == [0, 1]


def _not_utf8_run(root: Path) -> tuple[Path, str]:
    """A run whose timings/ holds a file whose name is not valid UTF-8, and that name as
    the output writes it."""
    import os

    from rankscope.testing._synthetic import write_timings

    write_timings(root, ranks=2, steps=10)
    bad = os.path.join(os.fsencode(root / "timings"), b"rank-00009\xff.jsonl")
    with open(bad, "wb") as fh:
        fh.write(b"not json\n")
    return root, "rank-00009\\xff.jsonl"


def test_a_name_that_is_not_utf8_is_printed_escaped_in_every_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, shown = _not_utf8_run(tmp_path / "run")
    for argv in (["report", str(run)], ["stragglers", str(run)]):
        code, out, err = run_cli(argv, capsys)
        assert code == 0 and "Traceback" not in err, err
        assert f"{run / 'timings' / shown}: not a timings file" in out
    page = (run / "report.html").read_bytes().decode("utf-8")  # strict: it is UTF-8
    assert shown in page and "\udcff" not in page
    for argv in (["report", str(run), "--json"], ["stragglers", str(run), "--json"]):
        code, out, err = run_cli(argv, capsys)
        assert code == 0, err
        out.encode("utf-8")  # no lone surrogate, escaped or not: any JSON parser reads it
        assert "\\ud" not in out
        skipped = json.loads(out)["skipped"]
        assert any(line.startswith(str(run / "timings" / shown)) for line in skipped)
    # written whole or not at all: no temporary left beside it
    assert sorted(p.name for p in run.iterdir() if p.is_file()) == ["report.html"]


def test_what_was_skipped_is_summed_up_on_the_terminal_and_listed_in_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rankscope.testing._synthetic import write_timings

    write_timings(tmp_path, ranks=4, steps=10)
    timings = tmp_path / "timings"
    for n in range(12):  # 12 files of rank 3 besides its own: one line naming 13 files
        own = (timings / "rank-00003.jsonl").read_text()
        (timings / f"rank-{'0' * (n + 6)}3.jsonl").write_text(own)
    for n in (10, 11):  # and two files that are not timings: two lines each
        (timings / f"rank-000{n}.jsonl").write_text("not json\n")
    code, out, err = run_cli(["stragglers", str(tmp_path)], capsys)
    assert code == 0, err
    listed = out.split("Skipped input: ", 1)[1].splitlines()
    assert listed[0] == "6 files or lines (the first 5 below; --json lists all):"
    assert len(listed) == 7 and listed[6] == "  ... and 1 more"
    assert all(len(line) <= 152 for line in listed), listed  # the 13 names: cut short
    assert any(line.endswith("...") and "rank 3 is claimed by 13 files" in line for line in listed)
    code, out, _ = run_cli(["stragglers", str(tmp_path), "--json"], capsys)
    skipped = json.loads(out)["skipped"]
    assert len(skipped) == 6 and skipped[-1] == "rank 3: no timings (of a world of 4)"
    claimed = next(line for line in skipped if "rank 3 is claimed by 13 files" in line)
    assert claimed.count(str(timings)) == 13  # the JSON keeps every name


def _words_of(text: str) -> list[str]:
    return text.replace("│", " ").split()


@pytest.mark.parametrize("columns", [60, 100])
def test_sentences_wrap_at_word_boundaries_to_the_width_columns_gives(
    tmp_path: Path, columns: int
) -> None:
    # Piped output (a log, `| less`) takes the width COLUMNS says: a sentence of 200
    # characters is wrapped by rich between words, never by the terminal mid-word.
    import os
    import subprocess

    import rankscope

    run = _straggler_run(tmp_path / "run")
    source = str(Path(rankscope.__file__).resolve().parents[1])
    env = {**os.environ, "COLUMNS": str(columns)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [source, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "rankscope.cli", "stragglers", str(run)]
    shown = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    data = json.loads(
        subprocess.run(
            [*command, "--json"], env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    lines = shown.splitlines()
    assert max(len(line) for line in lines) <= columns, shown
    # Each sentence is there whole: its words in order, none cut in two.
    words = _words_of(shown)
    sentences = [
        *data["summary"],
        *(f["cause"]["text"] for f in data["findings"] if f.get("cause")),
    ]
    assert sentences and max(len(s) for s in sentences) > columns  # there is something to wrap
    for sentence in sentences:
        want = sentence.split()
        assert any(words[i : i + len(want)] == want for i in range(len(words))), (sentence, shown)
    # A wrapped sentence's next lines keep its indent: the sentence reads as one block.
    (first,) = [i for i, line in enumerate(lines) if line.startswith("  why rank")]
    assert lines[first + 1].startswith("  ") and lines[first + 1][2] != " "


_BASE_INSTALL = (
    "import sys\n"
    "for name in ('duckdb', 'rich', 'msgspec'):\n"
    "    sys.modules[name] = None  # as pip install rankscope (no extra) leaves them\n"
    "from rankscope.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.parametrize(
    ("argv", "lacks"),
    [
        (["stragglers", "{run}"], "DuckDB and rich"),
        (["stragglers", "{run}", "--json"], "DuckDB"),
        (["report", "{run}", "--json"], "DuckDB"),
        (["report", "{run}"], "DuckDB and rich"),
        (["sql", "{run}", "select 1"], "DuckDB and rich"),
    ],
)
def test_a_base_install_says_the_one_extra_and_writes_nothing(
    tmp_path: Path, argv: list[str], lacks: str
) -> None:
    import subprocess

    from rankscope.testing._synthetic import write_timings

    run = tmp_path / "run"
    write_timings(run, ranks=2, steps=8)
    page = run / "report.html"
    page.write_text("<p>a good report</p>")
    done = subprocess.run(
        [sys.executable, "-c", _BASE_INSTALL, *(a.format(run=run) for a in argv)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        f"rankscope {argv[0]}: needs {lacks}, not installed: pip install 'rankscope[cli]'\n"
    )
    assert page.read_text() == "<p>a good report</p>"  # nothing written over
