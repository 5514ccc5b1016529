"""The loggers rankscope writes through: every message is one line of plain text.

A message can carry what a user or a file named (a phase, a window, a trigger's id):
one holding an escape sequence would act on the terminal that shows the job's log (clear
it, set its title), one holding a newline would print a line of its own. Each module's
logger writes out the control characters of its messages (`\\n`, `\\x1b`) first.
"""

from __future__ import annotations

import logging

from ._text import one_line

__all__ = ["get_logger"]


class _Plain(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format: logging reports it as it would
            return True
        plain = one_line(message)
        if plain != message:
            record.msg, record.args = plain, None
        return True


_PLAIN = _Plain()


def get_logger(name: str) -> logging.Logger:
    """logging.getLogger(name), its messages written as plain text."""
    logger = logging.getLogger(name)
    logger.addFilter(_PLAIN)  # once: the same filter is not added twice
    return logger
