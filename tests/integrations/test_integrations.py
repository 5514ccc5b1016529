"""What every integration shares: a missing framework is an ImportError naming the extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


@pytest.mark.parametrize(
    ("module", "framework", "extra"),
    [("hf", "transformers", "hf"), ("lightning", "lightning", "lightning"), ("ray", "ray", "ray")],
)
def test_a_missing_framework_names_the_extra(module: str, framework: str, extra: str) -> None:
    code = f"""
        import sys

        class Without:
            def find_spec(self, name, path=None, target=None):
                if name == {framework!r} or name.startswith({framework!r} + "."):
                    raise ImportError(f"No module named {{name!r}}")
                return None

        sys.meta_path.insert(0, Without())
        import rankscope.integrations  # the package itself needs no framework
        try:
            import rankscope.integrations.{module}
        except ImportError as exc:
            print(exc)
            print(type(exc.__cause__).__name__, exc.__cause__)
        """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    message, cause = done.stdout.strip().splitlines()
    assert message == (
        f"rankscope.integrations.{module} needs {framework}, which is not installed: "
        f'pip install "rankscope[{extra}]"'
    )
    assert cause == f"ImportError No module named '{framework}'"
