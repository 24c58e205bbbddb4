"""Least recently used entries within a byte budget: the bookkeeping the image, embedding and series caches share.

Adding an entry evicts the least recently used others until the total fits. The newest entry is always kept, even
over the budget: one image or series larger than the budget still serves its repeated clicks. Each entry's size is
measured once, when it is added (cached values are not changed in place). Torch-free: the caller says how to measure.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Generic, Hashable, Iterator, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ByteLRU(Generic[K, V]):
    def __init__(self, max_bytes: int, nbytes: Callable[[V], int]):
        self.max_bytes = int(max_bytes)
        self._nbytes = nbytes
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._total = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value, now the most recently used; None when absent."""
        with self._lock:
            item = self._entries.get(key)
            if item is None:
                return None
            self._entries.move_to_end(key)
            return item[0]

    def peek(self, key: K) -> V | None:
        """The value without changing its place in the order; None when absent."""
        with self._lock:
            item = self._entries.get(key)
            return None if item is None else item[0]

    def put(self, key: K, value: V) -> list[tuple[K, V]]:
        """Adds or replaces `key` as the most recently used; returns the evicted entries, least recently used first."""
        size = int(self._nbytes(value))
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._total -= old[1]
            self._entries[key] = (value, size)
            self._total += size
            evicted = []
            while len(self._entries) > 1 and self._total > self.max_bytes:
                oldest, (v, n) = self._entries.popitem(last=False)
                self._total -= n
                evicted.append((oldest, v))
            return evicted

    def pop(self, key: K) -> V | None:
        """Removes `key`; its value, or None when absent."""
        with self._lock:
            item = self._entries.pop(key, None)
            if item is None:
                return None
            self._total -= item[1]
            return item[0]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._total = 0

    def size_bytes(self) -> int:
        return self._total

    def keys(self) -> list[K]:
        """Least recently used first."""
        with self._lock:
            return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        return iter(self.keys())
