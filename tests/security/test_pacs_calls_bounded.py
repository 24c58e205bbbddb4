"""Issue 31, item 3, without the server: every call to the PACS is bounded by its timeouts and by the deadline of the
request it serves, and fails typed (504 hung, 503 refused); a listing is served from the last one while the PACS
hangs. The fake PACS is a small server of ours on 127.0.0.1."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from fake_pacs import FakePacs
from rocm_zoo.dicomweb.pacs_http import PacsNoAnswer, PacsTimeouts, PacsUnreachable, bound_session
from rocm_zoo.dicomweb.pacs_listing import PacsListing
from rocm_zoo.engine.scheduler import Priority, Work, working_as
from rocm_zoo.errors import DeadlineExceeded

TIMEOUTS = PacsTimeouts(connect_s=0.5, read_s=0.6)


@pytest.fixture
def pacs():
    fake = FakePacs()
    yield fake
    fake.stop()


def _session(pacs) -> requests.Session:
    return bound_session(requests.Session(), pacs.url, TIMEOUTS)


def test_a_call_to_a_hung_pacs_ends_at_its_read_timeout_as_a_504(pacs):
    session = _session(pacs)
    assert session.get(f"{pacs.url}/series").json() == []
    pacs.hang()
    start = time.monotonic()
    with pytest.raises(PacsNoAnswer) as e:
        session.get(f"{pacs.url}/series")  # no timeout given, as dicomweb_client calls it
    assert time.monotonic() - start < 3
    assert e.value.status == 504 and isinstance(e.value, requests.Timeout)
    assert "did not answer within 0.6 s (pacs_read_timeout_s" in str(e.value) and pacs.url in str(e.value)


def test_a_call_never_outlives_the_request_it_serves(pacs):
    slow = bound_session(requests.Session(), pacs.url, PacsTimeouts(connect_s=5, read_s=60))
    pacs.hang()
    start = time.monotonic()
    with working_as(Work(Priority.AUTOMATIC, "client", deadline=time.monotonic() + 0.4, what="infer")):
        with pytest.raises(PacsNoAnswer, match="the request's deadline"):
            slow.get(f"{pacs.url}/series")
        assert time.monotonic() - start < 3
        time.sleep(0.1)
        with pytest.raises(DeadlineExceeded):  # past it: the PACS is not even asked
            slow.get(f"{pacs.url}/series")


def test_a_refusing_pacs_is_a_503_that_names_the_reason(pacs):
    session = _session(pacs)
    pacs.refuse()
    with pytest.raises(PacsUnreachable, match=r"cannot be reached \(Connection refused\)") as e:
        session.get(f"{pacs.url}/series")
    assert e.value.status == 503 and isinstance(e.value, requests.ConnectionError)


def test_a_listing_is_served_from_the_last_one_while_the_pacs_hangs(pacs):
    session = _session(pacs)
    listing = PacsListing("series", lambda: session.get(f"{pacs.url}/series").json(), ttl_s=0.0)
    assert listing.get() == []  # the first one is waited for
    pacs.hang()
    start = time.monotonic()
    for _ in range(5):
        assert listing.get() == []  # stale: a refresh runs in the background, nobody waits for it
    assert time.monotonic() - start < 0.3
    deadline = time.monotonic() + 5
    while listing.info()["error"] is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "did not answer" in listing.info()["error"]


def test_a_first_listing_that_fails_is_an_error_then_answered_at_once(pacs):
    calls = []

    def fetch():
        calls.append(threading.current_thread().name)
        raise PacsUnreachable("The PACS at x cannot be reached (Connection refused)")

    listing = PacsListing("series", fetch, ttl_s=60)
    with pytest.raises(PacsUnreachable):
        listing.get()
    start = time.monotonic()
    with pytest.raises(PacsUnreachable):
        listing.get()  # not asked again before ttl_s
    assert time.monotonic() - start < 0.1 and len(calls) == 1
