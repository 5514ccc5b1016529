"""``python -m rankscope.integrations.lmms_engine ARGS...``: lmms-engine's launcher
(``python -m lmms_engine.launch.cli ARGS...``, Hydra's arguments as it takes them) with
rankscope installed in its trainers first. Under torchrun, ``-m
rankscope.integrations.lmms_engine`` where ``-m lmms_engine.launch.cli`` was."""

from __future__ import annotations

import runpy
import sys

from ._trainer import install

_CLI = "lmms_engine.launch.cli"


def main(argv: list[str]) -> None:
    install()
    sys.argv = [_CLI, *argv]
    runpy.run_module(_CLI, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
