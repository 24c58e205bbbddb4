"""MONAI Label's coroutine handlers that only block are served from worker threads once the app is installed: looked
for where FastAPI keeps them (an included router is one entry of the app, its routes inside it)."""

from __future__ import annotations

import inspect

from monailabel.app import app

from rocm_zoo.server.routes import TRULY_ASYNC_MODULES, run_blocking_handlers_in_threads


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


def test_only_truly_async_handlers_stay_on_the_event_loop():
    assert len(monailabel_coroutines(app.router, [])) > 20  # MONAI Label's own: info, datastore, train, scoring, ...
    run_blocking_handlers_in_threads(app)
    left = monailabel_coroutines(app.router, [])
    assert left and {module for _, module in left} <= set(TRULY_ASYNC_MODULES), left
