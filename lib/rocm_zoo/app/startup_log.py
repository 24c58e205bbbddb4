"""A start-up log a person can read: MONAI Label's and torch's start-up chatter moved to DEBUG.

At INFO a `--conf models all` start logged ~440 lines before the first request, ~385 of them MONAI Label's per-label
table of each bundle (`Model: ...; Label: ... => N`), then ~10 lines per transform of every warm-up inference. Those
records are lowered to DEBUG here (shown with `--verbose DEBUG`, dropped otherwise); nothing a user acts on is: our
own lines, warnings and errors of any library, and the per-request lines of real requests stay as they were.
"""

from __future__ import annotations

import logging
from typing import Callable

WARM_THREAD = "rocm_zoo-warm"  # the Zoo's warm-up thread: its inferences are ours, not a user's


def _any(record: logging.LogRecord) -> bool:
    return True


def _during_warm_up(record: logging.LogRecord) -> bool:
    return record.threadName.startswith(WARM_THREAD)


def _mentions(*phrases: str) -> Callable[[logging.LogRecord], bool]:
    return lambda record: any(p in str(record.msg) for p in phrases)


class ToDebug(logging.Filter):
    """On a logger: its records of `level` that `matches` become DEBUG records, kept only where DEBUG is enabled."""

    def __init__(self, logger: logging.Logger, matches: Callable[[logging.LogRecord], bool], level: int = logging.INFO):
        super().__init__()
        self.logger = logger
        self.matches = matches
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != self.level or not self.matches(record):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return self.logger.isEnabledFor(logging.DEBUG)


def _demote(name: str, matches: Callable[[logging.LogRecord], bool], level: int = logging.INFO) -> None:
    logger = logging.getLogger(name)
    if not any(isinstance(f, ToDebug) for f in logger.filters):
        logger.addFilter(ToDebug(logger, matches, level))


def quiet_startup_logs(gpu: bool) -> None:
    """Installs the filters; called before the bundles are loaded (their label tables are logged as they load)."""
    _demote("monailabel.tasks.infer.bundle", _mentions("; Label: "))
    _demote("monailabel.utils.others.class_utils", _mentions("Remove/Reload previous Modules"))
    _demote("monailabel.utils.sessions", _any)
    _demote("monailabel.datastore.local", _mentions("Invalidate count", "Adding New Image"))
    _demote("timeloop", _any)  # MONAI Label's scheduler tick: each line twice (its own handler and the root's)
    for name in ("monailabel.interfaces.utils.transform", "monailabel.tasks.infer.basic_infer",
                 "monailabel.endpoints.infer"):
        _demote(name, _during_warm_up)
    if not gpu:  # on a machine without a GPU, torch's search for a CUDA toolkit says nothing that matters
        _demote("torch.utils.cpp_extension", _mentions("No CUDA runtime is found"), logging.WARNING)
