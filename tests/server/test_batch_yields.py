"""A batch in the server starts each study only while no request runs or waits: it is below every request."""

from __future__ import annotations

import threading
import time

from rocm_zoo.server.batch.runs import BatchRun, InProcessEngine


def test_a_batch_study_waits_for_the_requests_in_flight():
    busy = threading.Event()
    busy.set()
    started: list[float] = []

    def infer(request: dict) -> dict:
        started.append(time.monotonic())
        return {"file": "", "params": {}}

    engine = InProcessEngine(infer, lambda *a: "", requests_running=busy.is_set)
    run = BatchRun(model="m", tag="original", images=["a", "b"])
    thread = threading.Thread(target=engine, args=(run, {}))
    thread.start()
    time.sleep(0.3)
    assert started == [], "a study started while a request was running"
    released = time.monotonic()
    busy.clear()
    thread.join(5)
    assert len(started) == 2 and started[0] >= released
    assert all(o.ok for o in run.outcomes), run.outcomes


def test_a_stop_ends_a_batch_that_waits_for_requests():
    engine = InProcessEngine(lambda r: {"file": "", "params": {}}, lambda *a: "", requests_running=lambda: True)
    run = BatchRun(model="m", tag="original", images=["a"])
    thread = threading.Thread(target=engine, args=(run, {}))
    thread.start()
    run.stop_requested = True
    thread.join(5)
    assert not thread.is_alive() and run.outcomes == []
