"""A trace window on a gloo DDP job leaves the job's heap whole (capture/_settle.py says how
torch's gloo backend could corrupt it, and what a window's stop does about it).

The corruption is rare: under glibc's checking allocator (libc_malloc_debug with
MALLOC_CHECK_=3, which faults at the first corrupt free) about 1 job in 30 of 2 ranks (a
window every 6 steps) died on this 2-core machine (without it, none of 20 died, even with
the results kept alive). Keeping each window's results alive as well, as a job that reads them would (rankscope
frees them at once), makes it common enough to test in seconds: so set up, 7 of 12 jobs
died with the settling off and 0 of 80 with it on; the control below shows the setup
still finds the corruption, so the settled run passing says something.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

_MALLOC_DEBUG = [
    Path(d, "libc_malloc_debug.so.0") for d in ("/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64")
]
SETTLED_JOBS = 8
CONTROL_JOBS = 24
"""The control stops at its first death: at the rate measured (7 of 12), two jobs or so."""
STEPS = 200
JOB_TIMEOUT_S = 60.0
"""A job takes 1-2 s; a corrupt heap can also hang one (a lock left taken): killed, -9."""


def _job(rank: int, world: int, run_dir: str, settle: bool) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    import rankscope
    from rankscope.capture import _export, _profile, _settle

    _export.let_go = _profile.let_go = lambda prof: None  # keep each window's results alive
    if not settle:
        _settle.settle_gloo_workers = lambda *args, **kwargs: None
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    config = rankscope.ProfileConfig(
        output_dir=run_dir,
        timer=rankscope.TimerConfig(enable=True, every_n_steps=2),
        trace=rankscope.TraceConfig(
            enable=True,
            ranks="1",
            schedule=rankscope.Schedule(wait=3, warmup=1, active=2, repeat=0),
        ),
    )
    with rankscope.Profiler(config) as prof:
        for _ in range(STEPS):
            with prof.phase("forward"):
                loss = model(torch.randn(8, 16)).sum()
            with prof.phase("backward"):
                loss.backward()  # DDP's all-reduce: the futures it waits on end before the ranges
            with prof.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            prof.step()
    dist.destroy_process_group()


def _drive(root: str) -> None:
    """In a process of its own, under the checking allocator: the settled jobs, then the
    control until its first death; prints each arm's exit codes."""
    from rankscope.testing._gloo import GlooRanks

    ranks = GlooRanks(Path(root, "scratch"))
    codes: dict[str, list[list[int | None]]] = {"settled": [], "control": []}
    for arm, settle, jobs in (("settled", True, SETTLED_JOBS), ("control", False, CONTROL_JOBS)):
        for job in range(jobs):
            run_dir = Path(root, arm, str(job))
            run_dir.mkdir(parents=True)
            codes[arm].append(ranks.start(_job, 2, run_dir, settle, timeout_s=JOB_TIMEOUT_S).join())
            if not settle and any(codes[arm][-1]):
                break
    print(json.dumps(codes))


def test_a_thread_with_work_left_is_seen_runnable_and_a_waiting_one_is_not() -> None:
    """What the settling waits on: a worker preempted with work left is runnable."""
    import torch

    from rankscope.capture._settle import runnable_threads

    done = threading.Event()
    ids: dict[str, str] = {}

    def busy() -> None:  # torch's matmul lets go of the GIL, as gloo's workers hold none
        ids["busy"] = str(threading.get_native_id())
        a = torch.randn(128, 128)
        while not done.is_set():
            a @ a

    def waiting() -> None:
        ids["waiting"] = str(threading.get_native_id())
        done.wait()

    threads = [threading.Thread(target=busy), threading.Thread(target=waiting)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.05)
        seen = [runnable_threads(str(threading.get_native_id())) for _ in range(20)]
    finally:
        done.set()
        for thread in threads:
            thread.join()
    assert any(ids["busy"] in s for s in seen), seen
    assert not any(ids["waiting"] in s for s in seen), seen


def test_a_window_stop_waits_for_gloo_to_end_its_ranges(tmp_path: Path) -> None:
    allocator = next((p for p in _MALLOC_DEBUG if p.exists()), None)
    if allocator is None:
        pytest.skip("glibc's checking allocator (libc_malloc_debug.so.0) is not installed")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "LD_PRELOAD": str(allocator), "MALLOC_CHECK_": "3"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from tests.capture.test_settle import _drive; _drive({str(tmp_path)!r})",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    codes = json.loads(done.stdout.strip().splitlines()[-1])
    died = [(job, c) for job, c in enumerate(codes["settled"]) if any(c)]
    assert not died, f"jobs whose ranks died with the window's stop settled (-11, -6: heap): {died}"
    assert any(any(c) for c in codes["control"]), (
        f"no job of {len(codes['control'])} died without the settling: the setup no longer "
        "finds torch's race (fixed in this torch? then capture/_settle.py may go)"
    )
