"""Terminal output of the analysis commands (rich, from the `cli` extra).

Names from traces go into Text objects, never markup: a kernel name like
`void f<[T]>()` must print as it is.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as _RichProgress
from rich.table import Table
from rich.text import Text

from ..analysis.core._format import SENTENCE, TERMINAL
from ..analysis.kernels._kernels import KernelReport
from ..analysis.stragglers._evidence import evidence_line
from ..analysis.stragglers._findings import cost_lines, in_groups
from ..analysis.stragglers._stragglers import StragglerReport
from ..rundir._layout import GZIP_SUFFIX, MERGED, TRACE_SUFFIX, rank_name, timing_path
from ..rundir._listing import RunDir
from ._columns import rank_list
from ._render_live import hang, live_view, top, trigger_status, trigger_written
from ._terminal import console
from ._terminal import name as _name
from ._terminal import out as _console
from ._terminal import sentence as _sentence
from ._terminal import skipped as _skipped

__all__ = [
    "Progress",
    "console",
    "demo_end",
    "demo_start",
    "hang",
    "kernels",
    "live_view",
    "merged",
    "report",
    "stragglers",
    "top",
    "trigger_status",
    "trigger_written",
]


class Progress:
    """A transient bar per stage ("timings", "traces"), on stderr."""

    def __init__(self, what: str) -> None:
        self._bar = _RichProgress(
            TextColumn(f"{what} {{task.description}}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> Progress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(None, None, None)

    def update(self, stage: str, done: int, total: int) -> None:
        task = self._tasks.get(stage)
        if task is None:
            task = self._tasks[stage] = self._bar.add_task(stage, total=total)
        self._bar.update(task, completed=done, total=total)


def _findings_table(findings: list[dict[str, Any]], reference: str, limit: int | None) -> Table:
    versus = "vs median rank" if reference == "median" else f"vs {reference}"
    table = Table(
        box=box.SIMPLE_HEAD,
        title="Findings (slow ranks first, then the ranks that wait for them)",
        title_justify="left",
    )
    for column in (
        "rank",
        "phase",
        "role",
        versus,
        "steps above",
        "time lost ms",
        "since step",
        "waits for",
        "fix saves ms/step",
        "speedup if fixed",
    ):
        table.add_column(
            column, justify="left" if column in ("phase", "role", "waits for") else "right"
        )
    for f in findings[:limit]:
        table.add_row(
            str(f["rank"]),
            _name(f["phase"], 30),
            f["role"],
            TERMINAL.ratio(f["median_ratio"]),
            TERMINAL.share(f["share_above"]),
            TERMINAL.ms(f["lost_ms"]),
            str(f["since_step"]),
            ", ".join(str(r) for r in f["waits_for"]),
            TERMINAL.ms(f["cost"]["step_ms_saved"]) if f.get("cost") else _cost_of(f),
            # Blank for a waiting rank: its fix is the rank it waits for, priced there.
            TERMINAL.speedup(f["cost"]["speedup"]) if f.get("cost") else "",
        )
    return table


def _cost_of(finding: dict[str, Any]) -> str:
    """A waiting rank's fix is the slow rank's: said so, not priced twice."""
    cause = finding.get("cost_of")
    if not isinstance(cause, dict):
        return ""
    return f"{cause['group']}'s" if "group" in cause else f"rank {cause['rank']}'s"


def _causes(findings: list[dict[str, Any]], notes: list[str]) -> None:
    """Why each slow rank is slow (the first few), and what the causes could not use."""
    slow = [f for f in findings if f.get("cause")]
    for f in slow[:_CAUSES]:
        _sentence(f"why rank {f['rank']} is slow in {f['phase']}: {f['cause']['text']}")
    if len(slow) > _CAUSES:
        _console.print(f"  ... {len(slow) - _CAUSES} more slow ranks (--json has each one's cause)")
    for note in notes:
        _sentence(f"note: {note}", style="yellow")


_CAUSES = 5


def _evidence(findings: list[dict[str, Any]]) -> None:
    """What the traces show of each slow rank (the first few): the ops that grew against a peer."""
    lines = [line for f in findings if f.get("role") == "slow" and (line := evidence_line(f))]
    for line in lines[:_CAUSES]:
        _sentence(line)


def _costs(strag: dict[str, Any]) -> None:
    """What fixing the findings would save: each slow finding, all of them, each host."""
    if not strag.get("cost"):
        return
    for line in cost_lines(strag):
        _sentence(line)


def _sentences(summary: list[str], threshold: float, persistence: float) -> None:
    if summary:
        for sentence in summary:
            _sentence(sentence, style="bold")
    else:
        _console.print(
            f"  No straggler: no rank is {SENTENCE.pct_over(threshold)} above the others "
            f"at {SENTENCE.share(persistence)} of sampled steps with a fix worth its price."
        )


def report(data: dict[str, Any], html: Path | None) -> None:
    ranks = data["ranks"]
    _console.print(Text(f"rankscope report: {data['run_dir']}", style="bold"))
    missing = f", missing {rank_list(ranks['missing'])}" if ranks["missing"] else ""
    _console.print(f"ranks: {len(ranks['present'])} of {ranks['world_size']}{missing}")
    _attempts(data.get("attempts", {}).get("note"))
    hangs: dict[str, Any] | None = data.get("hangs")
    hung = hangs is not None and hangs.get("state") == "hung"
    if hangs is not None and hung:  # who is stuck is a hung run's headline, as on the page
        _console.print("[bold]Hangs[/bold]")
        hang(hangs, title=False)
    steps = data.get("steps")
    if steps:
        _console.print(
            f"sampled steps: {len(steps['sampled'])} (steps {steps['first']}-{steps['last']}), "
            f"{data.get('clock', str(data['time']) + ' time')}"
        )
        table = Table(
            box=box.SIMPLE_HEAD, title="Phases across ranks and sampled steps", title_justify="left"
        )
        for column in ("phase", "kind", "records", "median ms", "p90 ms"):
            table.add_column(column, justify="left" if column in ("phase", "kind") else "right")
        for p in data["phases"]:
            table.add_row(
                _name(p["name"], 30),
                p["kind"],
                str(p["records"]),
                TERMINAL.ms(p["median_ms"]),
                TERMINAL.ms(p["p90_ms"]),
            )
        _console.print(table)
        strag = data["stragglers"]
        _console.print("[bold]Stragglers[/bold]")
        _sentences(strag["summary"], strag["threshold"], strag["min_persistence"])
        _costs(strag)  # in the order `rankscope stragglers` says them
        _causes(strag["findings"], strag.get("notes", []))
        _evidence(strag["findings"])
        if strag["findings"]:
            _console.print(_findings_table(strag["findings"], strag["reference"], 10))
    else:
        _console.print("no timings in this run (was the timer on?)")
    for window in data.get("kernels", {}).get("windows", []):
        what = "GPU kernels" if window["kind"] == "gpu_kernels" else "CPU ops by self time"
        title = f"Top {what}, window {window['window']}, {rank_list(window['ranks'])}"
        for reason in window.get("why", []):
            _console.print(Text(f"window {window['window']}: {reason}"))
        _console.print(_items_table(window["items"][:10], title))
    captures = data.get("captures", {})
    for entry in captures.get("nsys", []):
        _console.print(
            Text(
                f"nsys capture range {entry['window']} (steps {entry['first']}-{entry['last']}): "
                f"{rank_list(entry['ranks'])}; the report is where nsys -o put it"
            )
        )
    for entry in captures.get("memory", []):
        _console.print(
            Text(
                f"memory snapshots {entry['path']}: {rank_list(entry['ranks'])}, "
                f"{entry['bytes'] / 1e6:.1f} MB (open at https://pytorch.org/memory_viz)"
            )
        )
    _collectives(data.get("collectives"))
    if hangs is not None and not hung:
        _console.print("[bold]Hangs[/bold]")
        hang(hangs, title=False)
    _skipped(data.get("skipped", []))
    if html is not None:
        _console.print(Text(f"\nHTML report: {html}"))


def _collectives(part: dict[str, Any] | None) -> None:
    """The report's collectives part in a few lines; `rankscope collectives` has the tables."""
    for window in (part or {}).get("windows", []):
        _console.print(
            Text(f"Last arrivals at collectives, window {window['window']}", style="bold")
        )
        if "summary" in window:
            _console.print(Text(f"  {window['summary']} (clocks: {window['alignment']})"))
        else:
            _console.print(Text(f"  not read: {window.get('not_read') or window.get('error')}"))
        _console.print(Text(f"  per rank and collective: rankscope collectives {window['folder']}"))


def _attempts(note: str | None) -> None:
    if note is not None:
        _console.print(Text(f"attempts: {note}", style="yellow"))


def stragglers(
    found: StragglerReport, skipped: list[str], limit: int | None, note: str | None = None
) -> None:
    _attempts(note)
    one = ";" not in found.clock  # every phase on one clock, said in the header
    _console.print(
        f"[bold]Stragglers[/bold] over {len(found.ranks)} ranks and {len(found.steps)} sampled steps "
        f"({found.clock if one else 'each phase on its own clock'}; "
        f"threshold {found.threshold:.2f}, persistence {SENTENCE.share(found.min_persistence)})"
    )
    if not one:
        _console.print(Text(f"clocks: {found.clock}"))
    _sentences(found.summary, found.threshold, found.min_persistence)
    said = found.to_dict(table=False)
    _costs(said)  # a report with uneven data alone has costs too
    if found.findings:
        rows = said["findings"]
        grouped = in_groups(said) if limit is not None else set()
        # A slow group's ranks are its one finding; their own rows with --all (or --json).
        members = [r for r in rows if r["role"] == "slow" and (r["rank"], r["phase"]) in grouped]
        rows = [r for r in rows if not (r["role"] == "slow" and (r["rank"], r["phase"]) in grouped)]
        _causes(rows, found.notes)
        _evidence(rows)
        if rows:  # a slow group alone: its sentence says it, no empty table under it
            _console.print(_findings_table(rows, found.reference, limit))
        if limit is not None and len(rows) > limit:
            _console.print(f"  ... {len(rows) - limit} more findings (--all, or --json)")
        if members:
            _console.print(
                f"  ... {len(members)} rows of the slow groups' ranks, one by one (--all, or --json)"
            )
    else:
        _causes([], found.notes)
    if found.sync_phases:
        _console.print(f"phases that end in a collective: {', '.join(found.sync_phases)}")
    _skipped(skipped)


def _items_table(items: list[dict[str, Any]], title: str) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left")
    for column in ("name", "count", "total ms", "mean us", "min us", "max us", "share"):
        table.add_column(column, justify="left" if column == "name" else "right")
    for item in items:
        table.add_row(
            _name(item["name"]),
            str(item["count"]),
            TERMINAL.ms(item["total_us"] / 1000),
            TERMINAL.us(item["mean_us"]),
            TERMINAL.us(item["min_us"]),
            TERMINAL.us(item["max_us"]),
            TERMINAL.share(item["share"]),
        )
    return table


def kernels(found: KernelReport, top: int) -> None:
    for table in found.tables:
        what = "GPU kernels" if table.kind == "gpu_kernels" else "CPU ops by self time"
        by = "" if table.by == "name" or table.kind == "cpu_ops" else " by category"
        title = (
            f"{what}{by}: {table.count} in {table.traces} trace(s), "
            f"{SENTENCE.ms_text(table.total_us / 1000)} in all"
        )
        _console.print(_items_table(table.items[:top], title))
        if len(table.items) > top:
            _console.print(f"  ... {len(table.items) - top} more (--top N, or --json)")
    for note in found.notes:
        _console.print(Text(f"note: {note}", style="yellow"))
    _skipped(found.skipped)


def merged(result: Any) -> None:
    data = result.to_dict()
    _console.print(
        Text(
            f"merged {len(data.get('ranks', []))} ranks ({rank_list(data.get('ranks', []))}) "
            f"into {data['output']}"
        )
    )
    for entry in data.get("inputs", []):
        if entry.get("not_finite"):
            _console.print(
                Text(
                    f"{entry['source']}: {entry['not_finite']} event(s) held NaN or Infinity, "
                    "written as null (JSON has no word for them)",
                    style="yellow",
                )
            )
    _console.print(
        "Open it at https://ui.perfetto.dev ('Open trace file'); each rank is its own group."
    )


# -- the demo ------------------------------------------------------------------


def demo_start(job: Any, out: Path) -> None:
    _console.print(
        Text(
            f"rankscope demo: {job.world_size} ranks train a small MLP with DDP on CPU processes "
            f"(gloo) for {job.steps} steps",
            style="bold",
        )
    )
    _console.print(
        "  phases: host_to_device (data), forward, backward (DDP's gradient all-reduce inside), "
        "optimizer, loss_allreduce (comm)"
    )
    if job.straggler_rank is None:
        _console.print("  injected: nothing (a clean run: rankscope should flag no rank)")
    else:
        _console.print(
            f"  injected: rank {job.straggler_rank} is {job.slowdown:.0%} slower in "
            f"{job.straggler_phase}"
        )
    nth = "every step" if job.every_n_steps == 1 else f"1 step in {job.every_n_steps}"
    _console.print(
        f"  timer: every rank, {nth}; trace: steps {job.window_start}-{job.window_start + 1} "
        f"on {rank_list(job.traced_ranks)}"
    )
    _console.print(Text(f"  run directory: {out}"))


def demo_end(job: Any, data: dict[str, Any], trained_s: float, total_s: float) -> None:
    run = Path(data["run_dir"])
    _console.print(f"\ntrained in {trained_s:.1f} s, analysed in {total_s - trained_s:.1f} s\n")
    strag = data.get("stragglers")
    if strag is None:
        _console.print("[bold]no timings were written[/bold]; run with -v to see why")
    else:
        _console.print(
            f"[bold]What rankscope found[/bold] ({len(data['steps']['sampled'])} sampled steps "
            f"x {len(data['ranks']['present'])} ranks)"
        )
        _sentences(strag["summary"], strag["threshold"], strag["min_persistence"])
        _console.print(Text(_verdict(job, strag["findings"]), style="italic"))
        table = Table(box=box.SIMPLE_HEAD, title="Phases, median ms per rank", title_justify="left")
        breakdown = data["breakdown"]
        table.add_column("rank", justify="right")
        for name in breakdown["phases"]:
            table.add_column(_name(name, 20), justify="right")
        for rank, row in zip(breakdown["ranks"], breakdown["median_ms"], strict=True):
            table.add_row(str(rank), *(TERMINAL.ms(v) for v in row))
        _console.print(table)
    windows = data.get("kernels", {}).get("windows", [])
    for window in windows:
        what = "GPU kernels" if window["kind"] == "gpu_kernels" else "CPU ops by self time"
        title = (
            f"Top {what} in the captured window {window['window']}, {rank_list(window['ranks'])}"
        )
        _console.print(_items_table(window["items"][:8], title))
    _skipped(data.get("skipped", []))
    rows = [
        ("run directory", str(run)),
        ("HTML report", f"{data['html']}  (open in a browser; works offline)"),
        ("timings", f"{_any_rank(timing_path(run, 0))}, one file per rank"),
    ]
    me = command_name()
    traces = [trace.path for trace in RunDir(run).traces()]
    for i, trace in enumerate(traces):
        rows.append(("traces" if i == 0 else "", str(trace)))
    if traces:
        rows.append(("", "open one at https://ui.perfetto.dev ('Open trace file'; .gz as it is)"))
        pattern = traces[0].parent / f"*{TRACE_SUFFIX}{GZIP_SUFFIX}"
        rows.append(("merge them", f"{me} merge {pattern} -o {run / MERGED}"))
    rows.append(("analyse again", f"{me} report {run}   /   {me} stragglers {run}"))
    _console.print("\n[bold]Where everything is[/bold]")
    for label, text in rows:
        line = Text(f"  {label:<14} ")
        line.append(text)
        _console.print(line, soft_wrap=True)  # paths and commands stay whole, to copy


def command_name() -> str:
    """How this shell runs rankscope: `rankscope` where PATH finds it, else the script
    beside this Python (`make demo` installs .venv/bin/rankscope without activating the
    environment), relative to the working directory where it lies under it."""
    if shutil.which("rankscope"):
        return "rankscope"
    beside = Path(sys.executable).parent / "rankscope"
    if not beside.is_file():
        return "rankscope"
    try:
        return str(beside.relative_to(Path.cwd()))
    except ValueError:
        return str(beside)


def _any_rank(path: Path) -> str:
    """`path`, rank 0's file, as people read it for any rank: .../rank-NNNNN.jsonl."""
    zero = rank_name(0)
    return str(path.with_name(path.name.replace(zero, zero.replace("0", "N"))))


def _verdict(job: Any, findings: list[dict[str, Any]]) -> str:
    slow = {(f["rank"], f["phase"]) for f in findings if f["role"] == "slow"}
    if job.straggler_rank is None:
        return (
            "  = a clean run, and nothing was flagged."
            if not findings
            else "  ! a clean run, yet something was flagged: this machine is very noisy."
        )
    injected = (job.straggler_rank, job.straggler_phase)
    if injected in slow:
        return (
            f"  = that is the slowdown the demo injected (rank {injected[0]}, {injected[1]}), "
            "told apart from the ranks that wait for it."
        )
    return (
        f"  ! the injected slowdown (rank {injected[0]}, {injected[1]}) was not found as such; "
        "see the report."
    )
