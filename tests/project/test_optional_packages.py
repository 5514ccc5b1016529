"""The test suite on a host with only the runtime's packages (a GPU machine's python3: torch,
numpy, PyYAML, rich, pytest): every test module still collects, and one that needs an
optional package skips with that package's name rather than stopping the collection
(`pytest -m gpu` collects every module before it selects)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The extras' and the dev tools' packages a runtime need not have.
OPTIONAL = ("duckdb", "msgspec", "ray", "pyarrow", "tensorboard", "xdist", "pynvml")

# Hides OPTIONAL from the path finder, so that both `import` and importlib.util.find_spec
# (which libraries use to probe) find nothing, as on a host that never installed them.
_HIDING = textwrap.dedent(
    """
    import importlib.machinery, sys
    HIDDEN = set(sys.argv.pop(1).split(","))

    class Hiding(importlib.machinery.PathFinder):
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name.partition(".")[0] in HIDDEN:
                return None
            return importlib.machinery.PathFinder.find_spec(name, path, target)

    sys.meta_path = [Hiding if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
    import pytest
    sys.exit(pytest.main(sys.argv[1:]))
    """
)


@pytest.mark.slow
def test_every_module_collects_without_the_optional_packages() -> None:
    pytest_args = ["--collect-only", "-q", "-m", "gpu", "-p", "no:xdist", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [sys.executable, "-c", _HIDING, ",".join(OPTIONAL), *pytest_args, "tests"],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "error" not in out.lower().split("short test summary")[-1], out[-4000:]
    skipped = {line for line in out.splitlines() if line.startswith("SKIPPED")}
    # The modules that import an optional package at their top skip by its name.
    for module, package in (
        ("tests/analysis/test_sql.py", "duckdb"),
        ("tests/integrations/test_ray.py", "ray"),
    ):
        assert any(module in line and f"'{package}'" in line for line in skipped), skipped
    assert "tests/timing/test_health_gpu.py" in out, "the gpu tests were collected"
