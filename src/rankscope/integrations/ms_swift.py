"""ms-swift integration: rankscope as one of ms-swift's callbacks, by name.

ms-swift builds its trainers' callbacks from ``--callbacks NAME ...``, each looked up in
``swift.callbacks.callbacks_map`` and built as ``Callback(args, trainer)``; a file given
to ``--external_plugins`` is imported first and may add names. rankscope ships such a
file (`PLUGIN`), which adds ``rankscope``::

    swift sft ... --external_plugins "$(python -m rankscope.integrations.ms_swift)" --callbacks rankscope

or, in Python, before ``sft_main`` (or ``rlhf_main``)::

    from rankscope.integrations.ms_swift import register
    register()
    sft_main([..., "--callbacks", "rankscope"])

The callback is the Hugging Face Trainer's (`rankscope.integrations.hf`, whose phases
and figures it keeps: ms-swift's trainers are transformers Trainers). ms-swift has no
profiling config of its own, so the config is rankscope's defaults with the phase timer
on, written to ``<output_dir>/rankscope`` (ms-swift's ``--output_dir``, which it
suffixes with a version folder per run), the RANKSCOPE_* variables over both
(RANKSCOPE_TIMER_EVERY, RANKSCOPE_TRACE=1, RANKSCOPE_OUTPUT_DIR, ...; docs/config.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from ..config._config import ProfileConfig
from .hf import RankscopeCallback

__all__ = ["NAME", "PLUGIN", "SwiftRankscopeCallback", "config_from_args", "register"]

NAME = "rankscope"
"""The name ``--callbacks`` takes."""
PLUGIN = str(Path(__file__).with_name("_swift_plugin") / "rankscope_swift_plugin.py")
"""The file for ``--external_plugins``: importing it registers the callback."""


def config_from_args(args: Any, environ: Mapping[str, str] | None = None) -> ProfileConfig:
    """The ProfileConfig for ms-swift's training `args` (its TrainingArguments)."""
    data: dict[str, Any] = {"timer": {"enable": True}}
    output = getattr(args, "output_dir", None)
    if output:
        data["output_dir"] = os.path.join(str(output), "rankscope")
    config = ProfileConfig.from_dict(data)
    config.with_env(environ)  # a bad RANKSCOPE_* value fails here, before training
    return config


class SwiftRankscopeCallback(RankscopeCallback):
    """The HF Trainer callback, built as ms-swift builds its callbacks: ``(args, trainer)``."""

    _WHAT = "ms-swift integration"

    def __init__(
        self, args: Any, trainer: Any, *, environ: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(config_from_args(args, environ), environ=environ)
        self.args = args
        self.trainer = trainer


def register(name: str = NAME) -> None:
    """Add the callback to ms-swift's ``callbacks_map`` under `name` (``rankscope``)."""
    try:
        from swift.callbacks import callbacks_map
    except ImportError as exc:
        raise ImportError(
            "rankscope.integrations.ms_swift needs ms-swift, which is not installed: "
            "pip install ms-swift"
        ) from exc
    taken = callbacks_map.get(name)
    if taken is not None and taken is not SwiftRankscopeCallback:
        raise ConfigError("callbacks", name, "a name ms-swift's callbacks_map does not hold yet")
    callbacks_map[name] = SwiftRankscopeCallback


if __name__ == "__main__":
    import sys

    sys.stdout.write(PLUGIN + "\n")  # the path for --external_plugins
