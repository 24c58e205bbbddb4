"""Least recently used entries within a byte budget: the bookkeeping the image, embedding and series caches share.

Adding an entry evicts the least recently used others until the total fits. The newest entry is always kept, even
over the budget: one image or series larger than the budget still serves its repeated clicks. Each entry's size is
measured once, when it is added (cached values are not changed in place). `ByteLRU` is torch-free (the series cache's;
the caller says how to measure); `StreamCache` adds what the image and embedding caches share: hit and miss counts and
the device-stream handover.
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


def tensor_bytes(value: object) -> int:
    """Bytes held by the tensors in `value`: a tensor, or tuples, lists and dicts of them (anything else counts 0)."""
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(v) for v in value)
    if hasattr(value, "element_size") and hasattr(value, "nelement"):
        return value.element_size() * value.nelement()
    return 0


class StreamCache(Generic[K, V]):
    """A ByteLRU of values made on one device stream and read on others (clicks and other requests run on different
    streams, `engine.streams`), counting hits and misses: each value keeps the event after which it is complete on the
    stream that made it, and a reader's stream waits for that event."""

    def __init__(self, max_bytes: int, nbytes: Callable[[V], int] = tensor_bytes):
        self._entries: ByteLRU[K, tuple[V, object]] = ByteLRU(max_bytes, lambda kept: nbytes(kept[0]))
        self._count_lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def max_bytes(self) -> int:
        return self._entries.max_bytes

    def get(self, key: K) -> V | None:
        """The value, usable on this thread's stream, now the most recently used; None (a miss) when absent."""
        from rocm_zoo.engine import streams  # here: ByteLRU's users need no torch

        kept = self._entries.get(key)
        with self._count_lock:
            if kept is None:
                self.misses += 1
            else:
                self.hits += 1
        if kept is None:
            return None
        value, made = kept
        streams.use_here(value, made)
        return value

    def put(self, key: K, value: V) -> None:
        from rocm_zoo.engine import streams

        self._entries.put(key, (value, streams.ready(value)))

    def size_bytes(self) -> int:
        return self._entries.size_bytes()

    def __len__(self) -> int:
        return len(self._entries)
