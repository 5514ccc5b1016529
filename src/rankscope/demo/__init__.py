"""The job behind `rankscope demo`: DDP on CPU processes over gloo, one rank made slow on purpose."""

from ._job import PHASES, DemoJob, run_demo

__all__ = ["PHASES", "DemoJob", "run_demo"]
