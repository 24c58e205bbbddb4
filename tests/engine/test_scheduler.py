"""The device scheduler's order: class first, then round robin between clients; bounded queues, deadlines, cancels."""

from __future__ import annotations

import threading
import time

import pytest

from rocm_zoo.engine import scheduler
from rocm_zoo.engine.scheduler import (FairQueue, Priority, Work, current_work, device_turn, request_in_progress,
                                       requests_in_progress, waiting_for_lower_work, working_as)
from rocm_zoo.errors import DeadlineExceeded, QueueFull, WorkCancelled


def served_order(queue: FairQueue, works: list[Work]) -> list[str]:
    """Queue every work behind a holder, release the holder, and record in which order they get the slot."""
    order: list[str] = []
    holder = Work(Priority.BACKGROUND, "holder")
    queue.acquire(holder)
    threads = []
    for w in works:
        def run(w=w):
            with queue.held(w):
                order.append(w.what)
        t = threading.Thread(target=run)
        t.start()
        threads.append(t)
        deadline = time.time() + 5
        while queue.waiting() < len(threads) and time.time() < deadline:  # arrival order is the list's order
            time.sleep(0.005)
    queue.release(holder.priority)
    for t in threads:
        t.join(5)
    return order


def test_more_urgent_classes_go_first_whatever_their_arrival():
    works = [Work(Priority.BACKGROUND, "warm", what="compile"), Work(Priority.BATCH, "b", what="batch"),
             Work(Priority.AUTOMATIC, "a", what="auto"), Work(Priority.INTERACTIVE, "c", what="click")]
    assert served_order(FairQueue("test"), works) == ["click", "auto", "batch", "compile"]


def test_clients_of_one_class_take_turns():
    # Alice queued three clicks before Bob's one: Bob's goes second, not fourth.
    works = [Work(Priority.INTERACTIVE, "alice", what=f"alice{i}") for i in range(3)]
    works.append(Work(Priority.INTERACTIVE, "bob", what="bob0"))
    assert served_order(FairQueue("test"), works) == ["alice0", "bob0", "alice1", "alice2"]


def test_a_full_class_queue_refuses_with_a_retry_time_and_other_classes_still_queue():
    queue = FairQueue("test", max_waiting={Priority.AUTOMATIC: 1})
    queue.acquire(Work(Priority.AUTOMATIC, "x"))
    waiter = threading.Thread(target=lambda: queue.acquire(Work(Priority.AUTOMATIC, "y")), daemon=True)
    waiter.start()
    while queue.waiting(Priority.AUTOMATIC) < 1:
        time.sleep(0.005)
    with pytest.raises(QueueFull) as refused:
        queue.acquire(Work(Priority.AUTOMATIC, "z"))
    assert refused.value.retry_after_s >= 1 and "full" in str(refused.value)
    click = threading.Thread(target=lambda: queue.acquire(Work(Priority.INTERACTIVE, "c")), daemon=True)
    click.start()
    deadline = time.time() + 5
    while queue.waiting(Priority.INTERACTIVE) < 1 and time.time() < deadline:
        time.sleep(0.005)
    assert queue.waiting(Priority.INTERACTIVE) == 1


def test_cancelled_or_late_work_leaves_the_queue_and_the_next_one_is_served():
    queue = FairQueue("test")
    holder = Work(Priority.BATCH, "holder")
    queue.acquire(holder)
    gone = Work(Priority.INTERACTIVE, "gone")
    late = Work(Priority.INTERACTIVE, "late", deadline=time.monotonic() + 0.2)
    errors: dict[str, Exception] = {}

    def wait(w):
        try:
            queue.acquire(w)
        except Exception as e:
            errors[w.client] = e

    threads = [threading.Thread(target=wait, args=(w,)) for w in (gone, late)]
    for t in threads:
        t.start()
    gone.cancelled.set()
    for t in threads:
        t.join(5)
    assert isinstance(errors["gone"], WorkCancelled) and isinstance(errors["late"], DeadlineExceeded)
    assert queue.waiting() == 0
    queue.release(holder.priority)
    queue.acquire(Work(Priority.BACKGROUND, "next"))  # the slot went back, nobody holds it
    assert queue.holders == 1


def test_device_turns_are_reentrant_and_taken_as_the_threads_work():
    seen = []
    work = Work(Priority.INTERACTIVE, "c", what="click")
    with working_as(work):
        with device_turn("cpu"):
            with device_turn("cpu"):  # a run inside a run (VISTA3D's predictor around its network): same turn
                seen.append(current_work().what)
    assert seen == ["click"] and current_work().priority == Priority.BACKGROUND


def test_a_cancelled_work_stops_at_its_next_device_turn():
    work = Work(Priority.BATCH, "batch")
    work.cancelled.set()
    with working_as(work), pytest.raises(WorkCancelled):
        with device_turn("cpu"):
            pass


def _turn_taken_at(work: Work, device: str = "cpu") -> dict:
    """Starts a thread that takes one turn on `device` as `work`; the dict gets the time it got the turn."""
    taken: dict = {}

    def run():
        with working_as(work), device_turn(device):
            taken["at"] = time.monotonic()

    taken["thread"] = threading.Thread(target=run, daemon=True)
    taken["thread"].start()
    return taken


def test_batch_and_background_work_step_aside_while_a_request_is_in_progress():
    started = threading.Event()
    release = threading.Event()

    def request():  # between its turns: no turn held, still in progress
        with request_in_progress():
            started.set()
            release.wait(5)

    threading.Thread(target=request, daemon=True).start()
    started.wait(5)
    batch = _turn_taken_at(Work(Priority.BATCH, "batch"))
    background = _turn_taken_at(Work(Priority.BACKGROUND, "server"))
    automatic = _turn_taken_at(Work(Priority.AUTOMATIC, "auto"))
    automatic["thread"].join(5)
    time.sleep(0.3)
    assert "at" in automatic and "at" not in batch and "at" not in background
    ended = time.monotonic()
    release.set()
    batch["thread"].join(5)
    background["thread"].join(5)
    assert batch["at"] >= ended and background["at"] >= ended


def test_stepping_aside_has_a_bound_and_stops_for_a_cancelled_work(monkeypatch):
    monkeypatch.setattr(scheduler, "STEP_ASIDE_MAX_S", 0.2)
    with request_in_progress():
        start = time.monotonic()
        batch = _turn_taken_at(Work(Priority.BATCH, "batch"))
        batch["thread"].join(5)
        assert 0.2 <= batch["at"] - start < 2  # a stream of requests that never pauses does not stop a batch
        monkeypatch.setattr(scheduler, "STEP_ASIDE_MAX_S", 30)
        work = Work(Priority.BATCH, "batch")
        failed: list = []

        def run():
            try:
                with working_as(work), device_turn("cpu"):
                    pass
            except WorkCancelled as e:
                failed.append(e)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        time.sleep(0.1)
        work.cancelled.set()
        t.join(5)
        assert failed


def test_a_request_waiting_for_lower_work_does_not_hold_it_up():
    # A click for a model the background warm-up is still building waits for that warm-up, whose turns would otherwise
    # wait for the click: each would wait for the other.
    with request_in_progress():
        assert requests_in_progress() == 1
        with waiting_for_lower_work():
            assert requests_in_progress() == 0
            warm_up = _turn_taken_at(Work(Priority.BACKGROUND, "server"))
            warm_up["thread"].join(2)
            assert "at" in warm_up
        assert requests_in_progress() == 1
    assert requests_in_progress() == 0


def test_a_click_on_a_high_priority_gpu_stream_does_not_wait_in_the_queue(monkeypatch):
    # The GPU runs such a stream's kernels first by itself; a click then waits neither for a study's window in progress
    # nor for another click. Without that stream (or on a CPU) it waits for its turn as before.
    on_stream = {"value": True}
    monkeypatch.setattr(scheduler.streams, "on_interactive_stream", lambda device: on_stream["value"])
    queue = scheduler.device_queue("cuda:7")
    study = Work(Priority.AUTOMATIC, "study")
    queue.acquire(study)  # a window of someone's study holds the device
    try:
        click = _turn_taken_at(Work(Priority.INTERACTIVE, "click"), "cuda:7")
        click["thread"].join(2)
        assert "at" in click and queue.served[Priority.INTERACTIVE] == 1
        on_stream["value"] = False
        queued = _turn_taken_at(Work(Priority.INTERACTIVE, "click"), "cuda:7")
        queued["thread"].join(0.3)
        assert "at" not in queued
    finally:
        queue.release(study.priority)
    queued["thread"].join(2)
    assert "at" in queued
