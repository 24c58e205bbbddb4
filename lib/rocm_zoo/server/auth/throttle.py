"""Brakes on password guessing: after a few failed log-ins for a user from one address, that pair waits (429 with
`Retry-After`), 1 s at first and twice as long after each further failure, up to a cap; a success clears it. One
address failing for many user names is held back the same way, with a larger allowance. In memory, at most
`max_keys` pairs (the least recently seen go first), so an attacker spraying names cannot grow it.

An attempt counts as failed from the moment it is admitted until it succeeds, so a burst of concurrent guesses is
held back as well as a sequence.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from rocm_zoo.errors import RocmZooError

FREE_FAILURES = 5  # failures of one user from one address before the first wait
FREE_ADDRESS_FAILURES = 20  # failures from one address, whatever the user names
FIRST_WAIT_S = 1.0
MAX_WAIT_S = 300.0
FORGET_AFTER_S = 900.0  # failures this old no longer count
MAX_KEYS = 10_000
ANY_USER = "\0any"  # the per-address key (no user name can hold a NUL)


class TooManyLogins(RocmZooError):
    """Log-in refused for now after repeated failures; the client may try again after `retry_after_s`."""

    status = 429

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class _Failures:
    count: int
    last: float


class LoginThrottle:
    def __init__(self, free: int = FREE_FAILURES, free_per_address: int = FREE_ADDRESS_FAILURES,
                 first_wait_s: float = FIRST_WAIT_S, max_wait_s: float = MAX_WAIT_S,
                 forget_after_s: float = FORGET_AFTER_S, max_keys: int = MAX_KEYS, clock=time.monotonic):
        self.free = free
        self.free_per_address = free_per_address
        self.first_wait_s = first_wait_s
        self.max_wait_s = max_wait_s
        self.forget_after_s = forget_after_s
        self.max_keys = max_keys
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[str, str], _Failures] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def _wait_s(self, failures: int, free: int) -> float:
        if failures < free:
            return 0.0
        return min(self.max_wait_s, self.first_wait_s * 2.0 ** min(failures - free, 64))

    def _entry(self, key: tuple[str, str], now: float) -> _Failures | None:
        entry = self._seen.get(key)
        if entry is not None and now - entry.last > max(self.forget_after_s, self.max_wait_s):
            del self._seen[key]
            return None
        return entry

    def admit(self, user: str, address: str) -> None:
        """Counts the attempt as failed until `succeeded`; TooManyLogins while the user/address pair, or the
        address, must wait."""
        now = self.clock()
        keys = ((user, address), (ANY_USER, address))
        with self._lock:
            for key, free in zip(keys, (self.free, self.free_per_address)):
                entry = self._entry(key, now)
                if entry is None:
                    continue
                left = entry.last + self._wait_s(entry.count, free) - now
                if left > 0:
                    whom = "this user name" if key[0] != ANY_USER else "any user name"
                    raise TooManyLogins(f"Too many failed log-ins for {whom} from this address: try again in "
                                        f"{math.ceil(left)} s", retry_after_s=max(1, math.ceil(left)))
            for key in keys:
                entry = self._entry(key, now)
                if entry is None:
                    self._seen[key] = _Failures(1, now)
                else:
                    entry.count += 1
                    entry.last = now
                    self._seen.move_to_end(key)
            while len(self._seen) > self.max_keys:
                self._seen.popitem(last=False)

    def failures(self, user: str, address: str) -> int:
        with self._lock:
            entry = self._seen.get((user, address))
            return entry.count if entry else 0

    def succeeded(self, user: str, address: str) -> None:
        """Clears the pair; the address keeps its other failures (one known password must not reset them all)."""
        with self._lock:
            self._seen.pop((user, address), None)
            entry = self._seen.get((ANY_USER, address))
            if entry is not None:
                entry.count -= 1
                if entry.count <= 0:
                    del self._seen[(ANY_USER, address)]
