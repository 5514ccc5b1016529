from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import rankscope


def test_all_is_sorted_and_complete() -> None:
    assert rankscope.__all__ == sorted(rankscope.__all__)
    for name in rankscope.__all__:
        assert hasattr(rankscope, name), name
    public = {n for n in vars(rankscope) if not n.startswith("_")}
    modules = {n for n, v in vars(rankscope).items() if type(v).__name__ == "module"}
    assert public - modules <= set(rankscope.__all__)


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=False
    )


def test_import_does_not_import_torch() -> None:
    done = _python(
        """
        import sys
        import rankscope, rankscope.analysis, rankscope.capture
        cfg = rankscope.ProfileConfig.from_dict({"trace": {"ranks": "0-3"}})
        prof = rankscope.Profiler(cfg, rank=0, world_size=4)   # nothing enabled
        with prof:
            with prof.phase("x"):
                pass
            prof.step()
        print("torch" in sys.modules)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


_BLOCK_TORCH = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, _NoTorch())
"""


def test_missing_torch_names_the_extra() -> None:
    done = _python(
        _BLOCK_TORCH
        + """
import rankscope
try:
    rankscope.Profiler(rankscope.ProfileConfig(trace=rankscope.TraceConfig(enable=True)), rank=0, world_size=1)
except ImportError as exc:
    print(exc)
"""
    )
    assert done.returncode == 0, done.stderr
    assert 'pip install "rankscope[torch]"' in done.stdout


def test_analysis_names_are_sorted_and_each_loads() -> None:
    from rankscope import analysis

    assert analysis.__all__ == sorted(analysis.__all__)
    assert set(analysis.__all__) == set(analysis._WHERE)
    for name in analysis.__all__:
        assert getattr(analysis, name) is not None, name


def test_analysis_runs_without_torch_and_summaries_without_numpy(tmp_path: Path) -> None:
    from rankscope.testing._synthetic import Slowdown, write_timings
    from rankscope.testing._synthetic_traces import write_run_traces

    write_timings(tmp_path, ranks=3, steps=12, slowdowns=[Slowdown(1, "forward", 0.5)])
    write_run_traces(tmp_path, "step-000003-000004", [0, 1], world_size=3, size_bytes=50_000)
    trace = next(tmp_path.glob("traces/*/rank-00000.pt.trace.json.gz"))
    done = _python(
        _BLOCK_TORCH
        + f"""
import json, sys
from rankscope.analysis import summarize_trace
summarize_trace({str(trace)!r})
print("numpy after summary:", "numpy" in sys.modules)
from rankscope.analysis import build_report, find_stragglers, kernel_report, merge_traces, read_timings, render_html
report = build_report({str(tmp_path)!r})
assert report["stragglers"]["summary"], report["stragglers"]
html = render_html(report)
merge_traces(sorted(__import__("pathlib").Path({str(tmp_path)!r}).glob("traces/*/*.gz")), {str(tmp_path / "merged.json.gz")!r})
from rankscope.cli import main
for argv in (["stragglers", {str(tmp_path)!r}, "--json"], ["kernels", {str(tmp_path)!r}, "--json"], ["report", {str(tmp_path)!r}, "--json"]):
    assert main(argv) == 0, argv
print("torch:", "torch" in sys.modules)
"""
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "numpy after summary: False" in done.stdout
    assert "torch: False" in done.stdout
