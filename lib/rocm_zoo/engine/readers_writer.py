"""Many readers at once, or one writer: requests running a warm network read its weights; a weight swap writes them.

Writer preference: once a writer waits, new readers wait behind it, so a stream of clicks cannot starve a swap; the
swap then waits only for the requests already running. A thread that already reads may read again (a nested hold
would otherwise wait for a writer that waits for it).
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Callable, Iterator

POLL_S = 0.05


class ReadersWriterLock:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0
        self._mine = threading.local()  # how many holds this thread has as a reader

    @property
    def readers(self) -> int:
        return self._readers

    @property
    def writers_waiting(self) -> int:
        return self._writers_waiting

    @contextmanager
    def reading(self, check: Callable[[], None] | None = None,
                waiting: Callable[[], AbstractContextManager] = nullcontext) -> Iterator[None]:
        """Hold as a reader. `check` runs while waiting (a request's deadline and cancellation) and may raise;
        `waiting()` is entered around the wait, if there is one."""
        depth = getattr(self._mine, "depth", 0)
        with self._cond:
            if depth == 0 and (self._writing or self._writers_waiting):
                with waiting():
                    while self._writing or self._writers_waiting:
                        self._cond.wait(POLL_S)
                        if check is not None:
                            check()
            self._readers += 1
        self._mine.depth = depth + 1
        try:
            yield
        finally:
            self._mine.depth = depth
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Hold alone: new readers wait from now on; returns once the readers already in have left."""
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writing or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()
