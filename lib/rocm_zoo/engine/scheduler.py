"""Who uses the device next. One scheduler per device orders every piece of work that runs on it.

Work comes in four classes, served in this order: interactive clicks > automatic single-study requests > batch runs
over the datastore > background work (warm-up, compiles, training). Within a class, clients take turns (round robin),
so one busy client cannot starve another; within a client, first come first served.

A turn is one network run: a click's forward (all of a VISTA3D click's windows), or one window batch of a sliding
window. Long work therefore yields between window batches, and a click waits for at most about one window batch. On a
GPU, kernels are queued ahead of the host; a turn of lower-priority work hands over only once its kernels have run,
and such work never queues more than one turn ahead, so the click's kernels do not land behind a queue of someone
else's. On a GPU whose clicks run on high-priority streams (`engine.streams`, the default), a click's turn does not
queue at all: the GPU itself runs its kernels ahead of the other streams' and beside another click's.

Batch and background work go further: while any request is in progress (`request_in_progress`, from admission to
answer, between its turns too), they take no turn at all. A request has host and device work between its turns
(reading, resampling, stitching, writing) that a lower class's turns would otherwise slip in beside: a whole-body
request's sliding window alternated turn for turn with a batch study's, and both shared the interpreter with clicks.
They wait at most `STEP_ASIDE_MAX_S` per turn, so they still move under a stream of requests that never pauses.

Each thread says what it is doing with `working_as(Work(...))`; the work's deadline and cancellation (the client hung
up) are checked every time it asks for a turn, so work nobody waits for any more stops at its next turn.
"""

from __future__ import annotations

import contextvars
import enum
import itertools
import threading
import time
from collections import OrderedDict, deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from rocm_zoo.engine import streams
from rocm_zoo.errors import DeadlineExceeded, QueueFull, WorkCancelled

# How often a waiter re-checks its deadline and cancellation.
POLL_S = 0.05
# The longest batch or background work waits for requests in progress before it takes one turn anyway.
STEP_ASIDE_MAX_S = 5.0


class Priority(enum.IntEnum):
    INTERACTIVE = 0
    AUTOMATIC = 1
    BATCH = 2
    BACKGROUND = 3


@dataclass
class Work:
    """One piece of work as the scheduler sees it: its class, whose it is, until when it is wanted."""

    priority: Priority
    client: str
    deadline: float | None = None  # time.monotonic() after which nobody waits for the result
    cancelled: threading.Event = field(default_factory=threading.Event)
    what: str = ""  # for messages: "spleen_deepedit", "batch wholeBody_ct", ...

    def check(self) -> None:
        if self.cancelled.is_set():
            raise WorkCancelled(f"{self.what or 'work'} of {self.client} was cancelled")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise DeadlineExceeded(f"{self.what or 'the request'} did not finish within its deadline")


BACKGROUND_WORK = Work(Priority.BACKGROUND, "server", what="background work")
_current: contextvars.ContextVar[Work] = contextvars.ContextVar("rocm_zoo_work", default=BACKGROUND_WORK)


def current_work() -> Work:
    return _current.get()


@contextmanager
def working_as(work: Work) -> Iterator[Work]:
    token = _current.set(work)
    try:
        yield work
    finally:
        _current.reset(token)


class _Ticket:
    __slots__ = ("work", "granted", "seq")

    def __init__(self, work: Work, seq: int):
        self.work = work
        self.granted = False
        self.seq = seq


class FairQueue:
    """At most `slots` holders at once; waiters are served by priority, then round robin between clients.

    `max_waiting` bounds each class's queue: one more waiter gets QueueFull (the server's 503 with Retry-After) instead
    of a place in a queue nobody would wait through."""

    def __init__(self, name: str, slots: int = 1, max_waiting: dict[Priority, int] | None = None):
        self.name = name
        self.slots = slots
        self.max_waiting = dict(max_waiting or {})
        self._cond = threading.Condition()
        self._waiting: dict[Priority, OrderedDict[str, deque[_Ticket]]] = {p: OrderedDict() for p in Priority}
        self._holders = 0
        self._seq = itertools.count()
        self.served = {p: 0 for p in Priority}
        self._service_s = {p: 0.0 for p in Priority}  # recent mean time a holder of the class keeps its slot

    # -- what callers see -------------------------------------------------------------------------------------------
    @property
    def holders(self) -> int:
        return self._holders

    def info(self) -> dict[str, dict[str, float]]:
        """Per class: waiting now, served so far, and how long each held its slot lately (a device turn: one forward
        or one window batch)."""
        with self._cond:
            return {p.name.lower(): {"waiting": self._count(p), "served": self.served[p],
                                     "mean_held_s": round(self._service_s[p], 4)} for p in Priority}

    def waiting(self, priority: Priority | None = None) -> int:
        with self._cond:
            return self._count(priority)

    def waiting_above(self, priority: Priority) -> bool:
        """Is anyone of a more urgent class waiting?"""
        with self._cond:
            return any(self._waiting[p] for p in Priority if p < priority)

    def retry_after_s(self, priority: Priority) -> int:
        """A client's fair wait before trying again: the queue ahead of it times how long each takes, at least 1 s."""
        with self._cond:
            ahead = sum(self._count(p) for p in Priority if p <= priority) + self._holders
            return max(1, round(ahead * max(self._service_s[priority], 0.1) / self.slots))

    @contextmanager
    def held(self, work: Work) -> Iterator[None]:
        self.acquire(work)
        start = time.monotonic()
        try:
            yield
        finally:
            self.release(work.priority, time.monotonic() - start)

    def acquire(self, work: Work) -> None:
        work.check()
        with self._cond:
            limit = self.max_waiting.get(work.priority)
            if limit is not None and self._count(work.priority) >= limit and self._holders >= self.slots:
                raise QueueFull(f"{self.name}: the queue of {work.priority.name.lower()} work is full "
                                f"({limit} waiting)", retry_after_s=self._retry_locked(work.priority, limit))
            ticket = _Ticket(work, next(self._seq))
            self._waiting[work.priority].setdefault(work.client, deque()).append(ticket)
            self._dispatch()
            while not ticket.granted:
                self._cond.wait(POLL_S)
                if ticket.granted:
                    break
                try:
                    work.check()
                except Exception:
                    self._remove(ticket)
                    raise

    def release(self, priority: Priority, held_s: float = 0.0) -> None:
        with self._cond:
            self._holders -= 1
            self._count_served(priority, held_s)
            self._dispatch()

    def count_unqueued(self, priority: Priority, held_s: float) -> None:
        """Work that ran beside the holders without a slot (clicks on a high-priority GPU stream) counts as served."""
        with self._cond:
            self._count_served(priority, held_s)

    # -- under the condition's lock ---------------------------------------------------------------------------------
    def _count_served(self, priority: Priority, held_s: float) -> None:
        self.served[priority] += 1
        self._service_s[priority] = 0.8 * self._service_s[priority] + 0.2 * held_s if self.served[priority] > 1 \
            else held_s

    def _count(self, priority: Priority | None) -> int:
        classes = Priority if priority is None else (priority,)
        return sum(len(q) for p in classes for q in self._waiting[p].values())

    def _retry_locked(self, priority: Priority, ahead: int) -> int:
        return max(1, round((ahead + self._holders) * max(self._service_s[priority], 0.1) / self.slots))

    def _dispatch(self) -> None:
        granted = False
        while self._holders < self.slots:
            ticket = self._next()
            if ticket is None:
                break
            ticket.granted = True
            self._holders += 1
            granted = True
        if granted:
            self._cond.notify_all()

    def _next(self) -> _Ticket | None:
        for priority in Priority:
            clients = self._waiting[priority]
            if not clients:
                continue
            client, tickets = next(iter(clients.items()))
            ticket = tickets.popleft()
            del clients[client]
            if tickets:  # the client goes to the back of its class: the others take their turn first
                clients[client] = tickets
            return ticket
        return None

    def _remove(self, ticket: _Ticket) -> None:
        if ticket.granted:  # granted while it gave up: hand the slot on
            self._holders -= 1
            self._dispatch()
            return
        clients = self._waiting[ticket.work.priority]
        tickets = clients.get(ticket.work.client)
        if tickets is not None and ticket in tickets:
            tickets.remove(ticket)
            if not tickets:
                del clients[ticket.work.client]


# -- requests in progress ----------------------------------------------------------------------------------------------
class _Requests:
    """How many requests are in progress in this process; batch and background work step aside while any is."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._count = 0
        self._mine = threading.local()  # is this thread's request counted now?

    @contextmanager
    def in_progress(self) -> Iterator[None]:
        self._add(1)
        self._mine.counted = True
        try:
            yield
        finally:
            if getattr(self._mine, "counted", False):
                self._add(-1)
            self._mine.counted = False

    @contextmanager
    def waiting_for_lower_work(self) -> Iterator[None]:
        """Around a request's wait for something lower work must finish first (a network the background warm-up is
        building): the request does not count meanwhile, or each would wait for the other."""
        counted = getattr(self._mine, "counted", False)
        if counted:
            self._add(-1)
            self._mine.counted = False
        try:
            yield
        finally:
            if counted:
                self._add(1)
                self._mine.counted = True

    def count(self) -> int:
        with self._cond:
            return self._count

    def step_aside(self, work: Work, max_s: float) -> None:
        """Until no request is in progress (at most `max_s`), checking `work`'s deadline and cancellation."""
        end = time.monotonic() + max_s
        with self._cond:
            while self._count > 0 and time.monotonic() < end:
                self._cond.wait(POLL_S)
                work.check()

    def _add(self, n: int) -> None:
        with self._cond:
            self._count += n
            if self._count == 0:
                self._cond.notify_all()


_requests = _Requests()
request_in_progress = _requests.in_progress
waiting_for_lower_work = _requests.waiting_for_lower_work
requests_in_progress = _requests.count


# -- turns on a device -------------------------------------------------------------------------------------------------
_queues: dict[str, FairQueue] = {}
_queues_guard = threading.Lock()
_held = threading.local()  # the devices whose turn this thread holds (a run inside a run is the same turn)
_last_low_turn: dict[str, object] = {}  # per GPU: the event recorded after the last lower-priority turn


def devices_info() -> dict[str, dict]:
    with _queues_guard:
        queues = dict(_queues)
    return {device: {"busy": q.holders > 0, "turns": q.info()} for device, q in queues.items()}


def device_queue(device: str) -> FairQueue:
    with _queues_guard:
        if device not in _queues:
            _queues[device] = FairQueue(f"device {device}", slots=1)
        return _queues[device]


@contextmanager
def device_turn(device: str) -> Iterator[None]:
    """Run on `device` when the scheduler says so, as the thread's current work (`working_as`)."""
    held: set[str] = _held.__dict__.setdefault("devices", set())
    if device in held:
        yield
        return
    work = current_work()
    queue = device_queue(device)
    on_gpu = device.startswith("cuda")
    # A click on its high-priority stream does not queue: the GPU runs its kernels ahead of the other streams' queued
    # ones, so it waits neither for a study's window in progress nor for another click of another model.
    unqueued = on_gpu and work.priority == Priority.INTERACTIVE and streams.on_interactive_stream(device)
    yields = on_gpu and work.priority > Priority.INTERACTIVE
    if unqueued:
        work.check()
    else:
        if work.priority >= Priority.BATCH:
            _requests.step_aside(work, STEP_ASIDE_MAX_S)
        if yields:
            _wait_for_previous_turn(device)  # outside the turn: queue at most one turn of kernels ahead
        queue.acquire(work)
    held.add(device)
    start = time.monotonic()
    try:
        yield
    finally:
        held.discard(device)
        if yields:
            _hand_over(device, queue, work.priority)
        if unqueued:
            queue.count_unqueued(work.priority, time.monotonic() - start)
        else:
            queue.release(work.priority, time.monotonic() - start)


def _wait_for_previous_turn(device: str) -> None:
    event = _last_low_turn.get(device)
    if event is not None:
        event.synchronize()


def _hand_over(device: str, queue: FairQueue, priority: Priority) -> None:
    import torch

    if queue.waiting_above(priority):  # someone more urgent waits: let the GPU finish this turn's kernels first
        torch.cuda.current_stream(device).synchronize()
        _last_low_turn.pop(device, None)
    else:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        _last_low_turn[device] = event
