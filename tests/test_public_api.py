from __future__ import annotations

import subprocess
import sys
import textwrap

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
