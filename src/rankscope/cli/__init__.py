"""The `rankscope` command."""

from ._main import main

__all__ = ["main"]
