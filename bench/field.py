"""The field suite: real jobs run here, each with a fault and clean, against what the
analysis says of them.

Each job is a user's loop with rankscope on (bench/_field_jobs.py): plain DDP (the
all-reduce inside backward), DDP with a comm phase of its own, FSDP2 on CPU, the Hugging
Face Trainer (a slow collator, a slow forward), Lightning, a send/recv pipeline, Megatron's
interleaved pipeline with its batched calls, and uneven
data. The truth is what the job's own clock measured: the saving is the mean step after
the fault's onset less the mean step before it, in the same run; for uneven data, the
mean step after the onset less that of a twin run given the same extra load spread
evenly over the ranks (balancing spreads the load, it does not remove it). Printed per fault run:
the slow rank, phase and onset named right or not, the waiting ranks named right or not,
and the price over the measured saving, with the saving's own noise: how far the same
measure strays on the job's clean runs of the session (a price off by less than that is
as near as the truth can tell); per clean run, every finding it got, and how unequal the
ranks' cores ran. Every rank measures what the machine did to it: a fixed probe's time at
each step's end (its core's speed) and its training thread's wait for a CPU in each step
(Linux's schedstat). A clean run's finding whose slow rank the job measured held back by
the machine over the steps the finding covers (its core at least 1.10x slower than the
fastest rank's, or a wait for a CPU that holds half the finding's excess or more) is the
machine's: counted apart, and right (a VM's two vCPUs can run 2x apart, and the test
suite beside a job takes one rank's core more than the other's). The goal:
every fault named with its waiters, every price 0.7-1.4x the saving, and no finding on a
clean run that its cores do not explain.

    python bench/field.py [--quick] [--clean N] [--faults N] [--jobs ddp,hf_data,...]

With --faults N each job's fault runs N times and the median of its price ratios is
judged too: under load one run's measured saving strays by more than the fault.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from _field_jobs import (
    Case,
    Fault,
    ddp,
    ddp_comm,
    fsdp,
    hf,
    interleaved,
    lightning,
    pipeline,
    uneven,
)
from rankscope.analysis import StragglerOptions, analyse_stragglers
from rankscope.testing._gloo import GlooRanks, RanksFailed

_WARM = 5
"""Steps left out of the truth at the start (process start-up, the first collectives)."""
UNEVEN_CORES = 1.10
"""A rank's core this much slower than the fastest rank's (the analysis's own threshold,
1.10 by default) makes a clean run's finding that names it the machine's (so does a wait
for a CPU that holds half its excess: _the_machines)."""


@dataclass(frozen=True)
class Job:
    name: str
    run: Any
    world: int
    fault: Fault
    slow_phases: tuple[str, ...]
    """The phases a right answer names the slow rank in (the fault's, or the callback's
    phase that holds it)."""
    waiters: tuple[int, ...] | None
    """The ranks a right answer says wait for it (None: no waiting is asked for)."""
    steps: int = 160
    every: int = 5
    torchrun: bool = False
    """The job starts the process group itself from torchrun's variables."""
    kind: str = "slow"
    """What finding a right answer holds: "slow" (a rank), "group" (a pipeline stage) or
    "imbalance" (uneven data)."""


JOBS = [
    Job("ddp", ddp, 4, Fault(2, "data", 15.0, 80), ("data",), (0, 1, 3)),
    Job("ddp_comm", ddp_comm, 4, Fault(2, "data", 15.0, 80), ("data",), (0, 1, 3)),
    Job("fsdp", fsdp, 4, Fault(1, "forward", 15.0, 80), ("forward",), (0, 2, 3)),
    Job("hf_data", hf, 3, Fault(1, "collate", 20.0, 40), ("fetch",), (0, 2), 100, 2, True),
    Job("hf_compute", hf, 3, Fault(1, "forward", 20.0, 40), ("forward",), (0, 2), 100, 2, True),
    Job("lightning", lightning, 2, Fault(1, "forward", 20.0, 60), ("forward",), None, 120, 2, True),
    Job("pipeline", pipeline, 4, Fault(1, "forward", 3.0, 30), (), None, 80, 2, kind="group"),
    Job("interleaved", interleaved, 4, Fault(1, "forward", 3.0, 30), (), None, 80, 2, kind="group"),
    Job(
        "uneven",
        uneven,
        4,
        Fault(-1, "forward", 0.0, 60),
        ("forward",),
        None,
        200,
        2,
        kind="imbalance",
    ),
]


@dataclass
class Outcome:
    job: str
    fault: bool
    findings: list[str] = field(default_factory=list)
    named: bool | None = None
    onset: int | None = None
    waiters: bool | None = None
    price: float | None = None
    saving: float | None = None
    by_median: float | None = None
    """The saving by medians: a busy machine's bursts swing a mean by more than a fault."""
    noise: float | None = None
    """How far the same measure strays on the job's clean runs of this session (the
    largest): what the measured saving itself cannot tell apart. On a quiet machine a
    fraction of a millisecond; with the test suite beside it, several."""
    error: str | None = None
    machine: list[str] = field(default_factory=list)
    """A clean run's findings that name a rank whose core the job measured slower."""
    core_spread: float | None = None
    """A clean run's slowest rank's core over its fastest's, over the run."""

    @property
    def ratio(self) -> float | None:
        if self.price is None or not self.saving:
            return None
        return self.price / self.saving

    @property
    def verdict(self) -> str:
        """ "right" (0.7-1.4x the saving), "within the truth's noise" (the price is as near
        the saving as the clean runs stray from 0), or "OFF"."""
        ratio = self.ratio
        if ratio is not None and 0.7 <= ratio <= 1.4:
            return "right"
        price, saving, noise = self.price, self.saving, self.noise
        if price is not None and saving is not None and noise is not None:
            return "within the truth's noise" if abs(price - saving) <= noise else "OFF"
        return "OFF"


def _saving(run: Path, since: int, of: Any = np.mean) -> float:
    steps = np.asarray(json.loads((run / "truth.json").read_text())["step_ms"])
    before, after = steps[_WARM:since], steps[max(since, _WARM) :]
    if not len(before):  # a fault from the start: against the same run's clean twin
        return float("nan")
    return float(of(after) - of(before))


def _said(report: dict[str, Any]) -> list[str]:
    """Every finding of a report, a line each."""
    return [line for line, *_ in _findings(report)]


def _findings(report: dict[str, Any]) -> list[tuple[str, list[int], int, float]]:
    """Every finding of a report: its line, the ranks it says are slow (the rank, or the
    ranks a waiter waits for; none for an uneven phase or a group), its onset and its
    median excess (ms a step)."""
    out = []
    for f in report["findings"]:
        waits = f" for {f['waits_for']}" if f["waits_for"] else ""
        line = f"rank {f['rank']} {f['role']} in {f['phase']}{waits} since {f['since_step']}"
        slow = [f["rank"]] if f["role"] == "slow" else list(f["waits_for"] or [])
        out.append((line, slow, f["since_step"], float(f.get("median_excess_ms") or 0.0)))
    out += [(f"uneven {u['phase']}", [], 0, 0.0) for u in report.get("imbalance", [])]
    out += [
        (f"group {g['field']}={g['value']} slow in {g['phases']}", [], 0, 0.0)
        for g in report.get("groups", [])
    ]
    return out


def _machine(run: Path, since: int = _WARM) -> dict[int, tuple[float, float | None]]:
    """Each rank's median core probe (us) and median wait for a CPU (ms a step) over its
    steps from `since` (None where the kernel did not say)."""
    out = {}
    for path in run.glob("truth-core-*.json"):
        data = json.loads(path.read_text())
        probes = data["core_us"][max(since, _WARM) :]
        waits = [w for w in data["queued_ms"][max(since, _WARM) :] if w is not None]
        if probes:
            rank = int(path.stem.rsplit("-", 1)[1])
            out[rank] = (float(np.median(probes)), float(np.median(waits)) if waits else None)
    return out


def _the_machines(run: Path, ranks: list[int], since: int, excess_ms: float) -> str | None:
    """Why the machine, not the job, made `ranks` slow from step `since`, as the job
    measured it; None where it did not. Either their core ran at least UNEVEN_CORES slower
    than the fastest rank's, or their thread waited for a CPU (other processes held its
    cores) more than the other ranks' did, by half the finding's excess or more."""
    machine = _machine(run, since)
    if not ranks or any(r not in machine for r in ranks):
        return None
    fastest = min(core for core, _ in machine.values())
    lag = max(machine[r][0] for r in ranks) / fastest
    if lag >= UNEVEN_CORES:
        return f"its core {lag:.2f}x the fastest's"
    others = [w for r, (_, w) in machine.items() if r not in ranks and w is not None]
    waited = [w for r in ranks if (w := machine[r][1]) is not None]
    if not others or len(waited) < len(ranks) or excess_ms <= 0:
        return None
    extra = min(waited) - float(np.median(others))
    if extra >= 0.5 * excess_ms:
        return f"it waited {extra:.2f} ms a step more for a CPU, of {excess_ms:.2f} ms"
    return None


def _clean(out: Outcome, run: Path, report: dict[str, Any]) -> None:
    """A clean run's findings, each the machine's or not. A job without a fault on a
    machine that held one rank back is not clean: a finding whose slow rank the job itself
    measured held back by the machine over the steps it covers (a slower core, or its
    cores held by other processes) is the machine's, and right."""
    for line, slow, since, excess in _findings(report):
        why = _the_machines(run, slow, since, excess)
        if why is not None:
            out.machine.append(f"{line} ({why})")
        else:
            out.findings.append(line)
    cores = [core for core, _ in _machine(run).values()]
    out.core_spread = max(cores) / min(cores) if cores else None


def judge(
    job: Job, run: Path, fault: bool, clean_step_ms: float | None, twin: Path | None = None
) -> Outcome:
    out = Outcome(job.name, fault)
    report = analyse_stragglers(run, StragglerOptions()).report.to_dict()
    if not fault:
        _clean(out, run, report)
        return out
    out.findings = _said(report)
    f = job.fault
    out.saving = _saving(run, f.since) if f.since > _WARM else None
    out.by_median = _saving(run, f.since, np.median) if f.since > _WARM else None
    if twin is not None:  # what balancing saves: the step against the balanced twin's
        out.saving = _mean_step(run, f.since) - _mean_step(twin, f.since)
    if out.saving is None and clean_step_ms is not None:
        steps = np.asarray(json.loads((run / "truth.json").read_text())["step_ms"])
        out.saving = float(np.mean(steps[_WARM:]) - clean_step_ms)
    if job.kind == "slow":
        slow = [
            x
            for x in report["findings"]
            if x["role"] == "slow" and x["rank"] == f.rank and x["phase"] in job.slow_phases
        ]
        out.named = bool(slow)
        if slow:
            out.onset = slow[0]["since_step"]
            cost = slow[0]["cost"]
            out.price = None if cost is None else cost["step_ms_saved"]
        if job.waiters is not None:
            waiting = {x["rank"] for x in report["findings"] if x["role"] == "waits"}
            out.waiters = waiting == set(job.waiters)
    elif job.kind == "group":
        groups = report.get("groups", [])
        out.named = bool(groups)
        if groups and groups[0].get("cost"):
            out.price = groups[0]["cost"]["step_ms_saved"]
    else:
        uneven = report.get("imbalance", [])
        out.named = any(u["phase"] in job.slow_phases for u in uneven)
        if uneven and uneven[0].get("cost"):
            out.price = uneven[0]["cost"]["step_ms_saved"]
    return out


def _mean_step(run: Path, since: int = _WARM) -> float:
    steps = np.asarray(json.loads((run / "truth.json").read_text())["step_ms"])
    return float(np.mean(steps[max(since, _WARM) :]))


def _noise(cleans: list[Path], since: int, twin: bool) -> float | None:
    """The largest saving the fault's own measure finds on the clean runs: after the onset
    less before it in one run, or (against a twin) one clean run's steps less another's."""
    if twin or since <= _WARM:
        means = [_mean_step(run, since) for run in cleans]
        pairs = [abs(a - b) for a, b in itertools.pairwise(means)]
        return max(pairs) if pairs else None
    found = [abs(_saving(run, since)) for run in cleans]
    return max(found) if found else None


def run_job(  # noqa: PLR0917 - the job, where, and how many of each run
    gloo: GlooRanks, job: Job, root: Path, clean: int, quick: bool, faults: int = 1
) -> list[Outcome]:
    steps = job.steps // 2 if quick else job.steps
    since = job.fault.since // 2 if quick else job.fault.since
    fault = replace(job.fault, since=since)
    outcomes, clean_ms, cleans = [], [], []
    for i in range(clean):
        run = root / f"{job.name}-clean-{i}"
        try:
            gloo.run(job.run, job.world, run, Case(steps, job.every), init=not job.torchrun)
        except RanksFailed as exc:
            outcomes.append(Outcome(job.name, False, error=str(exc).splitlines()[0]))
            continue
        clean_ms.append(_mean_step(run))
        cleans.append(run)
        outcomes.append(judge(job, run, False, None))
    for k in range(faults):
        run = root / (f"{job.name}-fault" + (f"-{k}" if k else ""))
        try:
            gloo.run(job.run, job.world, run, Case(steps, job.every, fault), init=not job.torchrun)
            twin = None
            if job.kind == "imbalance":  # balancing spreads the load; it does not remove it
                twin = root / (f"{job.name}-balanced" + (f"-{k}" if k else ""))
                balanced = Case(steps, job.every, fault, balanced=True)
                gloo.run(job.run, job.world, twin, balanced, init=not job.torchrun)
            sized = replace(job, fault=fault)
            clean_step = float(np.mean(clean_ms)) if clean_ms else None
            judged = judge(sized, run, True, clean_step, twin)
            judged.noise = _noise(cleans, since, twin is not None)
            outcomes.append(judged)
        except RanksFailed as exc:
            outcomes.append(Outcome(job.name, True, error=str(exc)[-600:]))
    return outcomes


def _over_runs(outcomes: list[Outcome]) -> bool | None:
    """A job's fault runs together: the median of their price ratios, printed, and whether
    it is in 0.7-1.4x (None for fewer than two priced runs). One run's saving under load
    strays by more than the fault (see Outcome.noise); the median of several does less."""
    ratios = sorted(o.ratio for o in outcomes if o.fault and o.ratio is not None)
    if len(ratios) < 2:
        return None
    median = float(np.median(ratios))
    right = 0.7 <= median <= 1.4
    listed = ", ".join(f"{r:.2f}x" for r in ratios)
    print(
        f"{'':17} prices over {len(ratios)} fault runs: {listed}; median {median:.2f}x "
        f"{'right' if right else 'OFF'}"
    )
    return right


def _print(o: Outcome) -> None:
    if o.error:
        print(f"{o.job:11} {'fault' if o.fault else 'clean':5} FAILED: {o.error}")
        return
    if not o.fault:
        said = "; ".join(o.findings) or "no finding"
        spread = "" if o.core_spread is None else f" [cores {o.core_spread:.2f}x]"
        print(f"{o.job:11} clean {len(o.findings)} finding(s){spread}: {said}")
        if o.machine:
            print(f"{'':17} the machine's: {'; '.join(o.machine)}")
        return
    ratio = "-" if o.ratio is None else f"{o.ratio:.2f}x"
    price = "not priced" if o.price is None else f"{o.price:.1f} ms"
    saving = "?" if o.saving is None else f"{o.saving:.1f} ms"
    waiters = "-" if o.waiters is None else ("right" if o.waiters else "WRONG")
    median = ""
    if o.by_median and o.price is not None:
        median = f" (by medians {o.by_median:.1f} ms, {o.price / o.by_median:.2f}x)"
    noise = "" if o.noise is None else f" +-{o.noise:.1f}"
    print(
        f"{o.job:11} fault named={'right' if o.named else 'WRONG'} onset={o.onset} "
        f"waiters={waiters} price={price} saving={saving}{noise} ratio={ratio}{median} "
        f"price: {o.verdict}"
    )
    print(f"{'':17} said: {'; '.join(o.findings) or 'nothing'}")


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[attr-defined]  # a line a run, as it ends
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="half the steps, one clean run")
    parser.add_argument("--clean", type=int, default=None, help="clean runs per job (default 3)")
    parser.add_argument("--jobs", default=None, help="comma-separated job names")
    parser.add_argument("--faults", type=int, default=1, help="fault runs per job (default 1)")
    parser.add_argument("--keep", type=Path, default=None, help="write the runs here and keep them")
    args = parser.parse_args()
    clean = args.clean if args.clean is not None else (1 if args.quick else 3)
    wanted = set(args.jobs.split(",")) if args.jobs else None
    jobs = [j for j in JOBS if wanted is None or j.name in wanted]
    totals = {
        "clean runs": 0,
        "clean findings": 0,
        "the machine's": 0,
        "faults named": 0,
        "faults": 0,
        "prices right": 0,
        "within noise": 0,
        "jobs priced right by the median": 0,
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) if args.keep is None else args.keep
        root.mkdir(parents=True, exist_ok=True)
        gloo = GlooRanks(root / "gloo")
        for job in jobs:
            began = time.perf_counter()
            outcomes = run_job(gloo, job, root, clean, args.quick, args.faults)
            for o in outcomes:
                _print(o)
                if o.error:
                    continue
                if o.fault:
                    totals["faults"] += 1
                    totals["faults named"] += bool(o.named)
                    totals["prices right"] += o.verdict == "right"
                    totals["within noise"] += o.verdict == "within the truth's noise"
                else:
                    totals["clean runs"] += 1
                    totals["clean findings"] += len(o.findings)
                    totals["the machine's"] += len(o.machine)
            totals["jobs priced right by the median"] += bool(_over_runs(outcomes))
            print(f"{'':17} ({time.perf_counter() - began:.0f} s)")
    print("field: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
