"""`make test`: one failing part does not stop the other, and make fails at the end."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("failing", ["parallel", "serial", "none"])
def test_make_test_runs_both_parts_whatever_the_first_gave(tmp_path: Path, failing: str) -> None:
    # A stand-in python that logs each pytest call and fails the chosen part; lint and
    # chromium are taken as made (-o), so only the test recipe runs.
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *"not serial"*) part=parallel;; *) part=serial;; esac\n'
        f'echo "$part" >> {calls}\n'
        f'[ "$part" != "{failing}" ]\n'
    )
    fake.chmod(0o755)
    made = subprocess.run(
        ["make", "-s", "-o", "lint", "-o", "/usr/bin/chromium", "test", f"BIN={fake.parent}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert calls.read_text().split() == ["parallel", "serial"]
    assert (made.returncode != 0) is (failing != "none"), made.stdout + made.stderr
    assert ("some tests failed" in made.stdout) is (failing != "none")
