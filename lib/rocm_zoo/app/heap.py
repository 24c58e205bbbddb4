"""The garbage collector's pauses, kept short once the models are warm.

CPython's full collection walks every container object the process holds, with the GIL held, so every thread stops
meanwhile: the event loop (`/health/*`, `/info`), clicks' host work, batch stitching. A warm server holds 1.7 million of
them (MONAI, the bundles' configs, torch.compile's graphs and guards); one full collection over them took 1.1 s on a
2-core CI machine. They live as long as the server, so after warm-up `freeze_warm_heap` moves them out of the
collector's reach (`gc.freeze`): later collections walk only what was made since. Objects are still freed by reference
counting; only a reference cycle among them that dies later stays in memory (a model rebuilt after warm-up, rarely).

`PauseWatch` times every collection and warns of one that stopped the warm server for `SLOW_PAUSE_S` or longer (before
the freeze, while models load and compile, long collections are expected and logged at DEBUG only); `/info`
(`rocm_zoo.heap`) shows the freeze and the longest pause. There is one per process (`watch()`): the collector is.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

SLOW_PAUSE_S = 0.05  # the health and click budgets are tens of milliseconds


class PauseWatch:
    """Times the collector's runs (its callbacks run in the thread that triggered it, with the GIL held)."""

    def __init__(self, slow_s: float = SLOW_PAUSE_S):
        self.slow_s = slow_s
        self.collections = 0
        self.slow = 0
        self.longest_s = 0.0
        self._started: float | None = None
        self._freezing = False  # the freeze's own collection is no pause to warn of: it happens once, before serving
        self.frozen_objects = 0
        self.frozen = False  # the warm heap is frozen: from here a slow collection is news
        self.full_collection_s = 0.0  # the full collection just before the freeze: what each one cost until then
        self._lock = threading.Lock()

    def install(self) -> "PauseWatch":
        if self._on_collection not in gc.callbacks:
            gc.callbacks.append(self._on_collection)
        return self

    def uninstall(self) -> None:
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:
            return
        seconds, self._started = time.perf_counter() - self._started, None
        self.collections += 1
        self.longest_s = max(self.longest_s, seconds)
        if seconds >= self.slow_s and not self._freezing:
            self.slow += 1
            logger.log(logging.WARNING if self.frozen else logging.DEBUG,
                       "rocm_zoo: a garbage collection (generation %s, %s objects freed) stopped every thread for "
                       "%.3f s", info.get("generation"), info.get("collected"), seconds)

    def freeze_warm_heap(self) -> None:
        """A last full collection, then everything alive now out of the collector's reach (see the module's doc).
        The pause counts start again from here."""
        with self._lock:
            start = time.perf_counter()
            self._freezing = True
            try:
                gc.collect()
            finally:
                self._freezing = False
            self.full_collection_s = time.perf_counter() - start
            gc.freeze()
            self.frozen, self.frozen_objects = True, gc.get_freeze_count()
            self.collections, self.slow, self.longest_s = 0, 0, 0.0
        logger.info("rocm_zoo: %d objects of the warm server moved out of the garbage collector's reach (a full "
                    "collection over them stopped every thread for %.2f s)", self.frozen_objects,
                    self.full_collection_s)

    def info(self) -> dict[str, Any]:
        """The freeze, and the collections since it (since the start before it)."""
        return {"frozen_objects": self.frozen_objects,
                "full_collection_before_freeze_s": round(self.full_collection_s, 3),
                "collections": self.collections, "slow_collections": self.slow,
                "longest_collection_s": round(self.longest_s, 3), "slow_s": self.slow_s}


_WATCH: PauseWatch | None = None
_WATCH_LOCK = threading.Lock()


def watch() -> PauseWatch:
    """The process's pause watch, installed on first use."""
    global _WATCH
    with _WATCH_LOCK:
        if _WATCH is None:
            _WATCH = PauseWatch().install()
        return _WATCH
