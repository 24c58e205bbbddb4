"""The device scheduler's order: class first, then round robin between clients; bounded queues, deadlines, cancels."""

from __future__ import annotations

import threading
import time

import pytest

from rocm_zoo.engine.scheduler import FairQueue, Priority, Work, current_work, device_turn, working_as
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
