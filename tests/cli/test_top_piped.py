"""`rankscope top` into a pipe prints one frame and ends: a live view redraws nothing a
reader of the pipe sees, and looping would never end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ..analysis.test_hang_analysis import heartbeat, write_heartbeat


def test_top_into_a_pipe_prints_one_frame_and_exits_0(tmp_path: Path) -> None:
    for rank in range(2):
        write_heartbeat(tmp_path, heartbeat(rank))
    done = subprocess.run(
        [sys.executable, "-m", "rankscope.cli", "top", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "rankscope top" in done.stdout and done.stderr == ""
