"""Importing torch where it is used, with an error that says how to get it."""

from __future__ import annotations

from types import ModuleType

__all__ = ["import_torch"]


def import_torch(feature: str) -> ModuleType:
    """torch, or an ImportError naming the extra to install for `feature`."""
    try:
        import torch
    except ImportError as exc:
        raise ImportError(
            f'rankscope {feature} needs PyTorch, which is not installed: pip install "rankscope[torch]"'
        ) from exc
    module: ModuleType = torch
    return module
