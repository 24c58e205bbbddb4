"""Every HTTP call to the DICOMweb PACS: bounded in time, and failing with a typed error that says why.

A PACS that accepts connections and never answers would otherwise hold the calling thread for ever, and with it the
request's slot in its queue, the series conversion lock and whatever waits on them. Here each call has a connect and
a read timeout (`--conf pacs_connect_timeout_s`, `pacs_read_timeout_s`), shortened to what is left of the deadline of
the request it serves (`rocm_zoo.engine.scheduler.current_work`), so a thread given up on by its request is free again
when the request's answer goes out. A PACS that does not answer is a `PacsNoAnswer` (504), one that refuses or cannot
be reached a `PacsUnreachable` (503); both are also the `requests` errors callers already handle.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

import requests
from requests.adapters import HTTPAdapter

from rocm_zoo.engine.scheduler import current_work
from rocm_zoo.engine.volume_check import first_line
from rocm_zoo.errors import PacsTimeout, PacsUnavailable

# Below this, a call is not worth making: the request's deadline has passed.
MIN_CALL_S = 0.05
_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")  # "Connection refused", out of urllib3's nested message


class PacsNoAnswer(PacsTimeout, requests.Timeout):
    """The PACS did not accept the connection, or did not answer, within its timeout (504)."""


class PacsUnreachable(PacsUnavailable, requests.ConnectionError):
    """The PACS refused the connection or cannot be reached (503)."""


@dataclass(frozen=True)
class PacsTimeouts:
    connect_s: float = 5.0
    read_s: float = 60.0

    def now(self) -> tuple[float, float, str]:
        """(connect, read) seconds for a call made now, and what bounds them: the configured timeouts, or the deadline
        of the request this thread works for when that comes first. DeadlineExceeded when the deadline has passed."""
        work = current_work()
        connect, read, why = self.connect_s, self.read_s, ""
        if work.deadline is not None:
            left = work.deadline - time.monotonic()
            if left < MIN_CALL_S:
                work.check()
                left = MIN_CALL_S
            if left < read or left < connect:
                connect, read, why = min(connect, left), min(read, left), "the request's deadline"
        return connect, read, why


def describe(base_url: str, error: Exception, connect_s: float, read_s: float, why: str = "") -> Exception:
    """The typed error for a failed call to the PACS at `base_url` (requests' or httpx's exception)."""
    name = type(error).__name__
    if "ConnectTimeout" in name:
        bound = why or f"pacs_connect_timeout_s = {connect_s:g} s"
        return PacsNoAnswer(f"The PACS at {base_url} did not accept a connection within {connect_s:.3g} s ({bound}); "
                            "try again once it answers")
    if "Timeout" in name:  # read (or, for httpx, write and pool) timeouts
        bound = why or f"pacs_read_timeout_s = {read_s:g} s"
        return PacsNoAnswer(f"The PACS at {base_url} did not answer within {read_s:.3g} s ({bound}); "
                            "try again once it answers")
    reason = f"cannot be reached ({_os_reason(error) or first_line(error)})"
    unreachable = PacsUnreachable(f"The PACS at {base_url} {reason}; try again once it is up")
    unreachable.reason = reason  # for a caller that words its own message (the datastore's retries)
    return unreachable


def _os_reason(error: BaseException) -> str:
    """The operating system's words ("Connection refused"), from the error or what caused it (httpx says only "All
    connection attempts failed"; urllib3 nests them in its message)."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, OSError) and error.errno:
            return os.strerror(error.errno)
        found = _ERRNO.search(str(error))
        if found:
            return found.group(1).strip()
        error, seen = error.__cause__ or error.__context__, seen + 1
    return ""


class TimeoutAdapter(HTTPAdapter):
    """requests' transport with the PACS's timeouts on every call, whatever the caller (dicomweb_client, MONAI Label's
    download helpers) passes or forgets to pass."""

    def __init__(self, base_url: str, timeouts: PacsTimeouts):
        super().__init__()
        self.base_url = base_url
        self.timeouts = timeouts

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):
        connect, read, why = self.timeouts.now()
        try:
            return super().send(request, stream=stream, timeout=(connect, read), verify=verify, cert=cert,
                                proxies=proxies)
        except (requests.Timeout, requests.ConnectionError) as e:
            raise describe(self.base_url, e, connect, read, why) from e


def bound_session(session: requests.Session, base_url: str, timeouts: PacsTimeouts) -> requests.Session:
    """`session` with the PACS's timeouts on every call it makes."""
    adapter = TimeoutAdapter(base_url, timeouts)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
