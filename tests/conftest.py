"""Shared fixtures: the real traces in ../shared/data/traces, small tmpfs mounts, gloo ranks."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rankscope.testing._gloo import GlooRanks

# pytest-xdist's workers inherit COLUMNS=80; the terminal renderers wrap piped output at
# COLUMNS (cli/_render.py), so the tests read what a piped run without it gets: 160.
os.environ["COLUMNS"] = "160"

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"


@pytest.fixture
def real_traces() -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"real traces not found at {TRACES}")
    return TRACES


def _mount_tmpfs(target: Path, options: str) -> bool:
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB filesystem, to make writes fail with ENOSPC (needs root; skips otherwise)."""
    target = tmp_path / f"full-{uuid.uuid4().hex[:6]}"
    if os.geteuid() != 0 or not _mount_tmpfs(target, "size=64k"):
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield target
    subprocess.run(["umount", "-l", str(target)], check=False)


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory no one can write in: a read-only tmpfs as root, mode 0555 otherwise."""
    target = tmp_path / f"ro-{uuid.uuid4().hex[:6]}"
    if os.geteuid() == 0:
        if not _mount_tmpfs(target, "ro,size=64k"):
            pytest.skip("cannot mount a read-only tmpfs here")
        yield target
        subprocess.run(["umount", "-l", str(target)], check=False)
    else:
        target.mkdir()
        target.chmod(0o555)
        yield target
        target.chmod(0o755)


_LONGEST = (
    "tests/project/test_bench.py",
    "tests/integrations/test_ray.py",
    "tests/watch/test_watchdog.py",
    "tests/analysis/read/test_engine.py",
    "tests/integrations/test_lightning.py",
    "tests/integrations/test_hf.py",
    "tests/analysis/test_html.py",
    "tests/project/test_torchrun_example.py",
    "tests/core/test_exit.py",
    "tests/analysis/read/test_stream.py",
)
"""The files that take longest (their tests' durations summed, measured with --durations=0
on 2 cores), first among the slow ones."""


def _first(items: list[pytest.Item]) -> None:
    """The files with slow tests first, the longest of them before the rest: pytest-xdist
    hands whole files (--dist loadfile) to its workers in this order, and a long file
    handed out last keeps one worker busy after the other has run out of work."""
    slow = {item.path for item in items if "slow" in item.keywords}

    def rank(item: pytest.Item) -> int:
        name = item.path.as_posix()
        for place, longest in enumerate(_LONGEST):
            if name.endswith(longest):
                return place
        return len(_LONGEST) + (0 if item.path in slow else 1)

    items.sort(key=rank)  # stable: each file's tests keep their order


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    _first(items)

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (CUDA is not available)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gloo_ranks(tmp_path_factory: pytest.TempPathFactory) -> GlooRanks:
    """Runs a job on N spawned gloo ranks and fails with every rank's traceback (rankscope/testing/_gloo.py)."""
    return GlooRanks(tmp_path_factory.mktemp("gloo"))
