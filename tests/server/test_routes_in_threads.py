"""MONAI Label's coroutine handlers that only block are served from worker threads once the app is installed: looked
for where FastAPI keeps them (an included router is one entry of the app, its routes inside it). Its routes that ran
models outside the request queues (WSI inference, scoring) and its blocking DICOMweb proxy are gone."""

from __future__ import annotations

import inspect
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from monailabel.app import app

from rocm_zoo.errors import QueueFull
from rocm_zoo.server.http.routes import TRULY_ASYNC_MODULES, bounded, run_blocking_handlers_in_threads, switch_off


def monailabel_coroutines(router, found: list) -> list:
    for route in router.routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            monailabel_coroutines(included, found)
            continue
        endpoint = getattr(route, "endpoint", None)
        if endpoint and inspect.iscoroutinefunction(endpoint) and endpoint.__module__.startswith("monailabel.endpoints"):
            found.append((route.path, endpoint.__module__))
    return found


def test_no_monailabel_handler_stays_on_the_event_loop():
    assert len(monailabel_coroutines(app.router, [])) > 20  # MONAI Label's own: info, datastore, train, scoring, ...
    switch_off(app.router)  # its DICOMweb proxy, the one that awaited I/O, is replaced
    run_blocking_handlers_in_threads(app)
    assert monailabel_coroutines(app.router, []) == []
    assert TRULY_ASYNC_MODULES == ()


def _served(router, found: set) -> set:
    for route in router.routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            _served(included, found)
        else:
            found |= {(m, getattr(route, "path", "")) for m in getattr(route, "methods", None) or ()}
    return found


def test_routes_that_ran_models_outside_the_queues_are_switched_off():
    switch_off(app.router)
    served = _served(app.router, set())
    paths = {p for _, p in served}
    assert not any(p.startswith(("/infer/wsi", "/proxy/")) for p in paths), sorted(paths)
    assert not any(m == "POST" and p.startswith("/scoring") for m, p in served)
    assert ("GET", "/scoring/") in served and ("POST", "/infer/{model}") in served
    assert switch_off(app.router) == []  # nothing left to remove


def test_a_bounded_route_refuses_callers_beyond_its_limit_instead_of_holding_threads():
    release = threading.Event()
    started = threading.Semaphore(0)

    def rank(strategy: str) -> str:  # an uncertainty ranking that takes a while
        started.release()
        release.wait(10)
        return strategy

    handler = bounded(rank, 2, "/activelearning/{strategy}")
    with ThreadPoolExecutor(2) as pool:
        running = [pool.submit(handler, strategy="uncertainty") for _ in range(2)]
        assert started.acquire(timeout=5) and started.acquire(timeout=5)
        with pytest.raises(QueueFull, match="2 calls are running") as e:
            handler(strategy="uncertainty")
        assert e.value.retry_after_s > 0
        release.set()
        assert [f.result(5) for f in running] == ["uncertainty"] * 2
    assert handler(strategy="random") == "random"  # slots given back
