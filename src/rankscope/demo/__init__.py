"""The demo job behind `rankscope demo`: a real multi-rank run on CPU processes over gloo."""

from ._capture_demo import DemoResult, run_capture_demo

__all__ = ["DemoResult", "run_capture_demo"]
