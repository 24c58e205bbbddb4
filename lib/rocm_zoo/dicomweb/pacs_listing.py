"""What the PACS lists (its series, its labelled series), as last seen, refreshed in the background.

MONAI Label lists the PACS inside `/info/`, `/datastore/` and the active-learning strategies, on the request's thread,
every few minutes (its TTL cache): a PACS that hangs then hangs those routes, and a viewer cannot even connect. Here
a listing is asked of the PACS in a thread of its own once it is older than `ttl_s`; callers get the last listing at
once, with how old it is and why the newest attempt failed. Only the first listing, before there is any, is waited for
(within the PACS's timeouts); when that fails, the next callers get its error at once until the next attempt is due.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Generic, Optional, TypeVar

from rocm_zoo.engine.volume_check import first_line

logger = logging.getLogger(__name__)

T = TypeVar("T")


class PacsListing(Generic[T]):
    def __init__(self, what: str, fetch: Callable[[], T], ttl_s: float):
        self.what = what
        self._fetch = fetch
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._value: Optional[T] = None
        self._have = False
        self._listed_at = 0.0  # time.monotonic() of the last listing the PACS gave
        self._tried_at = float("-inf")  # ... and of the last attempt, successful or not
        self._error: Optional[Exception] = None
        self._refresh: Optional[threading.Thread] = None

    def get(self) -> T:
        with self._lock:
            refresh = self._start_refresh_if_due()
            if self._have:
                return self._value
        if refresh is not None:  # nothing listed yet: this one is waited for (it is bounded by the timeouts)
            refresh.join()
        with self._lock:
            if self._have:
                return self._value
            raise self._error

    def start(self) -> None:
        """Starts a listing now (if none is running), without waiting for it."""
        with self._lock:
            self._tried_at = float("-inf")
            self._start_refresh_if_due()

    def invalidate(self) -> None:
        """The next `get` asks the PACS again (and still answers with the last listing at once)."""
        with self._lock:
            self._tried_at = float("-inf")

    def _start_refresh_if_due(self) -> Optional[threading.Thread]:
        if self._refresh is not None:
            return self._refresh
        if time.monotonic() - self._tried_at < self.ttl_s:
            return None
        self._refresh = threading.Thread(target=self._run, name=f"rocm_zoo-pacs-{self.what}", daemon=True)
        self._refresh.start()
        return self._refresh

    def _run(self) -> None:
        try:
            value = self._fetch()
        except Exception as e:  # noqa: BLE001 (kept and given to callers; the thread must end cleanly)
            logger.warning("PACS listing (%s) failed; the last one stays in use: %s", self.what, first_line(e))
            with self._lock:
                self._error, self._tried_at, self._refresh = e, time.monotonic(), None
            return
        with self._lock:
            self._value, self._have, self._error = value, True, None
            self._listed_at = self._tried_at = time.monotonic()
            self._refresh = None

    def info(self) -> dict:
        with self._lock:
            return {"age_s": round(time.monotonic() - self._listed_at, 1) if self._have else None,
                    "error": first_line(self._error) if self._error is not None else None}
