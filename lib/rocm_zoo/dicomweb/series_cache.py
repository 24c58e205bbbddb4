"""Which DICOM series are converted on disk, for which version of each series, within a byte budget.

Interactive clicks on a DICOMweb study must not fetch and convert the whole series again: a series is converted once
and reused while its version (its instance list, as the PACS reports it) is unchanged. A changed or deleted series is
dropped, and the least recently used series go first when the budget is exceeded. The cache only keeps the book; the
datastore owns the files and is told, through `remove`, which series to delete.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from rocm_zoo.engine.lru import ByteLRU


def series_signature(sop_instance_uids: Iterable[str]) -> str:
    """A version of a series: its sorted instance UIDs (DICOM gives a changed instance a new SOP Instance UID)."""
    uids = sorted(str(u) for u in sop_instance_uids)
    return f"{len(uids)}:" + hashlib.sha256("\n".join(uids).encode()).hexdigest()[:16]


@dataclass
class CachedSeries:
    signature: str
    nbytes: int
    last_used: float


class SeriesCache:
    def __init__(self, max_bytes: int, remove: Callable[[str], None]):
        self._remove = remove
        self._entries: ByteLRU[str, CachedSeries] = ByteLRU(max_bytes, lambda e: e.nbytes)
        self._lock = threading.Lock()  # a look-up (find, compare, drop) and its counters as one step
        self.hits = self.misses = self.invalidations = self.evictions = 0

    @property
    def max_bytes(self) -> int:
        return self._entries.max_bytes

    def lookup(self, series: str, signature: str) -> bool:
        """True when the series is converted for this signature (a hit); a stale entry is removed."""
        with self._lock:
            entry = self._entries.get(series)
            if entry is not None and entry.signature == signature:
                entry.last_used = time.monotonic()
                self.hits += 1
                return True
            self.misses += 1
            if entry is not None:
                self.invalidations += 1
                self._entries.pop(series)
        if entry is not None:
            self._remove(series)
        return False

    def add(self, series: str, signature: str, nbytes: int) -> list[str]:
        """Records a converted series; evicts the least recently used others beyond the budget. Returns the evicted."""
        with self._lock:
            evicted = [old for old, _ in self._entries.put(series, CachedSeries(signature, int(nbytes),
                                                                                  time.monotonic()))]
            self.evictions += len(evicted)
        for old in evicted:
            self._remove(old)
        return evicted

    def forget(self, series: str) -> None:
        with self._lock:
            entry = self._entries.pop(series)
        if entry is not None:
            self._remove(series)

    def size_bytes(self) -> int:
        return self._entries.size_bytes()

    def __contains__(self, series: str) -> bool:
        return series in self._entries

    def info(self) -> dict:
        return {"series": len(self._entries), "bytes": self.size_bytes(), "max_bytes": self.max_bytes,
                "hits": self.hits, "misses": self.misses, "invalidations": self.invalidations,
                "evictions": self.evictions}
