"""The stall a training loop sees when a trace window ends, and its step time afterwards.

A CPU loop of many tiny ops records one 2-step window (a trace of a few tens of MB).
The window is ended three ways, interleaved in one run:

- rankscope: `Profiler.step()`; only torch's own export runs on the training thread,
  and a background child process summarises and gzips the trace;
- (a) raw: torch.profiler with `on_trace_ready` calling `export_chrome_trace(path.json)`;
- (b) framework: `tensorboard_trace_handler(use_gzip=True)` plus a `key_averages()`
  table on the training thread, as training frameworks do today.

The stall is the wall time of the `step()` call that ends the window. For rankscope the
loop then keeps stepping while the background finaliser runs, and those steps are set
against the unprofiled steps before the window. As a control, the loop then steps as
long again beside a child process that only spins: where the machine has no spare core,
any second process slows the loop, whatever it does. Prints medians and ratios:
absolute times mean little on a small, shared machine.

With --device cuda the loop's tensors live on the GPU (thousands of tiny kernels a step,
a device synchronize at its end) and the raw and framework profilers record CUDA too.

    python bench/capture_stall.py [--quick] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import rankscope

VARIANTS = ("rankscope", "raw", "framework")
WINDOW_END = 3
"""Index of the step whose step() call ends the window: wait=1, warmup=1, active=2."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Sizes:
    """How big a run is."""

    ops: int
    """Loop iterations per step; each runs three small tensor ops (mul, add, relu)."""
    reps: int
    """Runs of each variant, interleaved with the order rotated."""
    baseline_steps: int
    """Unprofiled steps timed before the profiler starts."""
    idle_steps: int
    """Steps timed after rankscope's background work is done (a drift check)."""
    max_overlap_steps: int
    """Cap on the steps run while the background work is pending."""


FULL = Sizes(ops=8000, reps=3, baseline_steps=15, idle_steps=10, max_overlap_steps=600)
QUICK = Sizes(ops=1500, reps=1, baseline_steps=5, idle_steps=3, max_overlap_steps=600)
SMOKE = Sizes(ops=400, reps=1, baseline_steps=3, idle_steps=2, max_overlap_steps=600)
"""--quick on a CPU: the tests' smoke run (make test-gpu's --quick on a GPU keeps QUICK)."""
WARM_STEPS = 3


@dataclass(kw_only=True, slots=True)
class RunResult:
    variant: str
    stall_s: float
    baseline_s: list[float]
    overlap_s: list[float] = field(default_factory=list)
    idle_s: list[float] = field(default_factory=list)
    beside_spin_s: list[float] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    summary: dict[str, Any] | None = None


class _Loop:
    """The training step: thousands of ops on 8-element tensors, so the trace is large."""

    def __init__(self, ops: int, device: str) -> None:
        gen = torch.Generator().manual_seed(0)
        self._x = torch.randn(8, generator=gen).to(device)
        self._y = torch.randn(8, generator=gen).to(device)
        self._ops = ops
        self._cuda = device == "cuda"

    def step(self) -> torch.Tensor:
        a = self._x
        y = self._y
        for _ in range(self._ops):
            a = a * 0.5 + y
            a = a.relu()
        if self._cuda:
            torch.cuda.synchronize()  # step times then mean device time
        return a


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


_SPIN = """
import sys, time
end = time.perf_counter() + float(sys.argv[1])
while time.perf_counter() < end:
    pass
"""


def _beside_spinning_child(step: Callable[[], None], seconds: float, cap: int) -> list[float]:
    """Step times while a child process keeps one core busy for `seconds`."""
    child = subprocess.Popen([sys.executable, "-c", _SPIN, str(seconds)])
    times: list[float] = []
    try:
        while child.poll() is None and len(times) < cap:
            times.append(_timed(step))
    finally:
        child.kill()
        child.wait()
    return times


_ACTIVITIES = [torch.profiler.ProfilerActivity.CPU]
"""What the raw and framework profilers record (main() adds CUDA with --device cuda)."""


def _torch_schedule() -> Any:
    return torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1)


def _rankscope_profiler(out: Path) -> rankscope.Profiler:
    config = rankscope.ProfileConfig(
        output_dir=out,
        trace=rankscope.TraceConfig(
            enable=True,
            ranks="0",
            schedule=rankscope.Schedule(wait=1, warmup=1, active=2, repeat=1),
        ),
    )
    return rankscope.Profiler(config, rank=0, world_size=1)


def _raw_profiler(out: Path) -> Any:
    path = out / "raw.pt.trace.json"
    return torch.profiler.profile(
        activities=list(_ACTIVITIES),
        schedule=_torch_schedule(),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    )


def _framework_profiler(out: Path) -> Any:
    write = torch.profiler.tensorboard_trace_handler(str(out), worker_name="rank0", use_gzip=True)

    def on_ready(prof: Any) -> None:
        write(prof)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
        (out / "key_averages.txt").write_text(table, encoding="utf-8")

    return torch.profiler.profile(
        activities=list(_ACTIVITIES),
        schedule=_torch_schedule(),
        on_trace_ready=on_ready,
    )


def _pending(prof: rankscope.Profiler) -> bool:
    """Whether rankscope's background finaliser still has work (a read-only peek)."""
    capture = prof._capture
    return capture is not None and bool(capture._exporter.backlog)


def _run(variant: str, sizes: Sizes, loop: _Loop, tmp: Path) -> RunResult:
    out = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=tmp))
    gc.collect()  # the previous run's garbage is not this run's cost
    for _ in range(WARM_STEPS):
        loop.step()
    baseline = [_timed(loop.step) for _ in range(sizes.baseline_steps)]
    gc.collect()

    if variant == "rankscope":
        prof: Any = _rankscope_profiler(out)
    elif variant == "raw":
        prof = _raw_profiler(out)
    else:
        prof = _framework_profiler(out)

    prof.start()
    for _ in range(WINDOW_END):
        loop.step()
        prof.step()
    loop.step()
    stall = _timed(prof.step)
    result = RunResult(variant=variant, stall_s=stall, baseline_s=baseline)
    if variant == "rankscope":

        def step() -> None:
            loop.step()
            prof.step()

        # A step counts as overlapping the background work if that work was pending
        # when the step began; the step during which it ends counts too.
        while _pending(prof) and len(result.overlap_s) < sizes.max_overlap_steps:
            result.overlap_s.append(_timed(step))
        result.idle_s = [_timed(step) for _ in range(sizes.idle_steps)]
        result.beside_spin_s = _beside_spinning_child(
            step, max(sum(result.overlap_s), 1.0), sizes.max_overlap_steps
        )
    prof.stop()
    if variant == "rankscope":
        result.summary = prof.last_summary()
    result.files = sorted(p for p in out.rglob("*") if p.is_file())
    return result


def _mb(path: Path) -> str:
    size = path.stat().st_size
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"


def _report(results: list[RunResult], sizes: Sizes) -> None:
    by = {v: [r for r in results if r.variant == v] for v in VARIANTS}
    stall = {v: statistics.median(r.stall_s for r in rs) for v, rs in by.items()}

    print("\nstall of the step() that ends the window, per run (s):")
    for v in VARIANTS:
        runs = "  ".join(f"{r.stall_s:7.3f}" for r in by[v])
        print(f"  {v:<10} {runs}   median {stall[v]:7.3f}")

    print("\nrankscope step time (median ms, change against the normal step before the window):")
    changes: list[float] = []
    controls: list[float] = []
    for i, r in enumerate(by["rankscope"]):
        base = statistics.median(r.baseline_s)
        if not r.overlap_s:
            print(f"  run {i}: no step overlapped the background work (it finished first)")
            continue
        during = statistics.median(r.overlap_s)
        mean = statistics.fmean(r.overlap_s)
        changes.append(during / base - 1)
        print(
            f"  run {i}: normal {base * 1e3:.1f}; "
            f"during finalise {during * 1e3:.1f} ({during / base - 1:+.1%}; "
            f"mean {mean / base - 1:+.1%}) over {len(r.overlap_s)} steps, "
            f"{sum(r.overlap_s):.2f} s; "
            f"after {_change(r.idle_s, base)}; beside a spinning child {_change(r.beside_spin_s, base)}"
        )
        if r.beside_spin_s:
            controls.append(statistics.median(r.beside_spin_s) / base - 1)

    print("\nfiles:")
    for v in VARIANTS:
        print(f"  {v}: " + ", ".join(f"{p.name} {_mb(p)}" for p in by[v][-1].files))
    landed = sum(_landed(r.files) for r in by["rankscope"])
    print(
        f"  rankscope runs whose trace and summary landed, no temporary files left: "
        f"{landed} of {len(by['rankscope'])}"
    )
    rs = by["rankscope"][-1]
    if rs.summary and rs.summary.get("items"):
        top = rs.summary["items"][0]
        print(
            f"  rankscope summary ({rs.summary.get('kind')}, window {rs.summary.get('window')}), "
            f"top item: {top['name']} x{top['count']}, {top['total_us'] / 1e3:.1f} ms, "
            f"{top['share']:.0%} of the time"
        )
    else:
        print("  rankscope summary: MISSING")

    vs_raw = stall["rankscope"] / stall["raw"]
    vs_framework = stall["framework"] / stall["rankscope"]
    print(f"\nresults ({sizes.reps} run(s) of each variant, {sizes.ops} x 3 ops per step):")
    print(f"  stall vs raw export: {vs_raw:.2f}x (goal <= 1.2x) {_verdict(vs_raw <= 1.2)}")
    print(
        f"  framework way vs rankscope: {vs_framework:.1f}x (goal >= 10x) "
        f"{_verdict(vs_framework >= 10)}"
    )
    if changes:
        change = statistics.median(changes)
        print(
            f"  step time during background finalise: {change:+.1%} (goal <= 5%) "
            f"{_verdict(change <= 0.05)}"
        )
        if controls:
            control = statistics.median(controls)
            print(f"  control, step time beside a child that only spins: {control:+.1%}")
            if control > 0.05:
                print(
                    "    (this machine had no spare core for a second process, so no background\n"
                    "     finaliser could meet the step-time goal here; rerun on an idle machine)"
                )
    else:
        print("  step time during background finalise: not measured (no step overlapped it)")


def _landed(files: list[Path]) -> bool:
    trace = [p for p in files if p.name.endswith(".pt.trace.json.gz")]
    summary = [p for p in files if p.name.endswith(".summary.json")]
    leftovers = [p for p in files if p.name.startswith(".")]
    return len(trace) == 1 and len(summary) == 1 and not leftovers


def _change(times: list[float], base: float) -> str:
    if not times:
        return "n/a"
    median = statistics.median(times)
    return f"{median * 1e3:.1f} ({median / base - 1:+.1%})"


def _verdict(ok: bool) -> str:
    return "[met]" if ok else "[NOT MET]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run, to smoke-test")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    sizes = FULL if not args.quick else QUICK if args.device == "cuda" else SMOKE
    torch.set_num_threads(1)
    if args.device == "cuda":
        _ACTIVITIES.append(torch.profiler.ProfilerActivity.CUDA)
    loop = _Loop(sizes.ops, args.device)
    results: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="rankscope-bench-") as tmp:
        # torch.profiler's first window in a process stops slower; keep that out of the runs.
        _run("raw", sizes, loop, Path(tmp))
        for rep in range(sizes.reps):
            order = VARIANTS[rep % 3 :] + VARIANTS[: rep % 3]
            for variant in order:
                r = _run(variant, sizes, loop, Path(tmp))
                results.append(r)
                raw = [p for p in r.files if p.name == "raw.pt.trace.json"]
                size = f", raw trace {_mb(raw[0])}" if raw else ""
                print(f"rep {rep} {variant:<10} stall {r.stall_s:.3f} s{size}", flush=True)
        _report(results, sizes)


if __name__ == "__main__":
    main()
